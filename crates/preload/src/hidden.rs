//! corehop's variables, out of the program's sight (`corehop_sys::hidden_env`). Preloaded
//! itself, this library hides them in a constructor and gives them back to the programs the
//! process starts through its exec wrappers; loaded by the start-up stub, it finds that the
//! stub did both and reads its settings from what the stub hid.

use core::sync::atomic::{AtomicPtr, Ordering};
use corehop_sys::hidden_env::Hidden;

/// What this library hid, preloaded itself.
pub(crate) static HIDDEN: Hidden = Hidden::new();
/// What the start-up stub hid, if it loaded this library.
static STUB_HIDDEN: AtomicPtr<Hidden> = AtomicPtr::new(core::ptr::null_mut());

/// The stub's [`Hidden`], handed over when it loads this library.
pub(crate) fn from_stub(hidden: *const Hidden) {
    STUB_HIDDEN.store(hidden.cast_mut(), Ordering::Release);
}

/// corehop's value of the variable `name`, if this library or the stub hid it.
pub(crate) fn setting(name: &str) -> Option<&'static [u8]> {
    HIDDEN.setting(name.as_bytes()).or_else(|| {
        // SAFETY: null, or the stub's static, which lives as long as the process; the stub
        // builds its `Hidden` from the same source, `repr(C)`.
        let stub = unsafe { STUB_HIDDEN.load(Ordering::Acquire).as_ref() }?;
        stub.setting(name.as_bytes())
    })
}

#[cfg(all(target_arch = "x86_64", not(test)))]
corehop_sys::hide_at_start!(crate::hidden::HIDDEN);

/// libc's function of the NUL-terminated `name` (0: none), for the exec wrappers.
#[cfg(all(target_arch = "x86_64", not(test)))]
fn next(name: &'static [u8]) -> usize {
    core::ffi::CStr::from_bytes_with_nul(name).map_or(0, |name| crate::sys::next_function(name) as usize)
}

// Every program this library's process starts gets corehop: preloaded itself, the library
// counts or records every process; loaded by the stub, the stub's wrappers run (they come
// first), and the stub starts some programs plainly.
#[cfg(all(target_arch = "x86_64", not(test)))]
corehop_sys::exec_wrappers!(crate::hidden::HIDDEN, crate::hidden::next);
