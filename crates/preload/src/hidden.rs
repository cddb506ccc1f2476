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
mod at_start {
    use core::ffi::{c_char, c_int, CStr};

    /// This library's constructor: a look for `corehop run`'s marker, and the hiding. Loaded
    /// by the stub, it finds none (the stub took it away before `main`).
    #[used]
    #[link_section = ".init_array"]
    static HIDE_AT_START: unsafe extern "C" fn(c_int, *mut *mut c_char, *mut *mut c_char) = hide_at_start;

    /// Hides corehop's variables from the program (glibc passes a constructor the environment).
    ///
    /// # Safety
    ///
    /// Called once, by the dynamic loader, with the process's environment.
    unsafe extern "C" fn hide_at_start(_argc: c_int, _argv: *mut *mut c_char, envp: *mut *mut c_char) {
        let marker = c"COREHOP_ENV_WAS";
        debug_assert_eq!(marker.to_bytes(), corehop_sys::hidden_env::MARKER.as_bytes());
        // SAFETY: the name is NUL-terminated. A set-user-ID process (null) keeps its
        // environment as it came.
        if !unsafe { crate::intercept::secure_getenv(marker.as_ptr()) }.is_null() {
            // SAFETY: preloaded, the loader runs this before `main`, on the one thread there
            // is; loaded by the stub there is no marker left to find.
            unsafe { super::HIDDEN.hide(envp) };
        }
    }

    /// libc's function of the NUL-terminated `name` (0: none), for the exec wrappers.
    pub(super) fn next(name: &'static [u8]) -> usize {
        CStr::from_bytes_with_nul(name).map_or(0, |name| crate::sys::next_function(name) as usize)
    }
}

#[cfg(all(target_arch = "x86_64", not(test)))]
corehop_sys::exec_wrappers!(crate::hidden::HIDDEN, crate::hidden::at_start::next);
