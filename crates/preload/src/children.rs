//! `vfork` and `clone` (and glibc's `__vfork`, `__clone`): the libc entry points that start a
//! process sharing our memory. Each tells [`before_unseen_child`] before libc's own function
//! runs, so that the child's calls never reach the parent's service threads (`intercept`,
//! `CHECK_PID`). x86-64 only; elsewhere every offloaded call checks its pid.
//!
//! These cannot be ordinary wrappers. A vfork child runs on its parent's stack until it execs
//! or exits, and glibc's `vfork` returns twice, child first, through the frame it was called
//! from: a wrapper's frame would be returned through by the child, overwritten by the child's
//! next calls, then returned through again by the parent. `clone` is variadic, which Rust
//! cannot define. So each entry point here is a naked trampoline that makes no frame of its
//! own: it saves the argument registers, calls a helper that returns the address of libc's
//! function, restores them and jumps there, so libc's function starts with the program's own
//! registers, stack and return address, exactly as if the program had called it.

use core::ffi::{c_int, c_void};

use crate::intercept::{before_unseen_child, thread_state_changes};
use crate::sys;

static REAL_VFORK: sys::Real = sys::Real::new(c"vfork");
static REAL_CLONE: sys::Real = sys::Real::new(c"clone");

/// The address to jump to for `real`: libc's function, or [`unsupported`] without one.
fn target(real: &sys::Real) -> usize {
    let ptr = real.get();
    if ptr.is_null() {
        unsupported as *const () as usize
    } else {
        ptr as usize
    }
}

/// Stands in for a function libc lacks: fails with ENOSYS, as the other entry points do.
extern "C" fn unsupported() -> c_int {
    sys::set_errno(libc::ENOSYS);
    -1
}

/// Called by the `vfork` trampolines: notes the child to come; returns libc's `vfork`.
extern "C" fn before_vfork() -> usize {
    before_unseen_child();
    target(&REAL_VFORK)
}

/// Called by the `clone` trampolines with clone's flags: a child that is not a thread of ours
/// is noted (one sharing our memory, or a copy of it that no fork handler saw), a thread with
/// a directory or descriptors of its own ends offload ([`corehop_sys::watch::thread_with_own_files`]);
/// returns libc's `clone`.
extern "C" fn before_clone(flags: c_int) -> usize {
    if flags & libc::CLONE_THREAD == 0 {
        before_unseen_child();
    } else if corehop_sys::watch::thread_with_own_files(i64::from(flags)) {
        thread_state_changes();
    }
    target(&REAL_CLONE)
}

/// Exports each name of the list as a trampoline of `$asm` (see the module docs).
macro_rules! trampolines {
    ([$($name:ident),*] $args:tt -> $ret:ty, $what:literal, $asm:expr) => {
        $(trampolines!(@one $name $args -> $ret, $what, $asm);)*
    };
    (@one $name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty, $what:literal, $asm:expr) => {
        #[doc = concat!("`", stringify!($name), "`: ", $what)]
        ///
        /// # Safety
        ///
        /// The contract of libc's function of the same name.
        #[no_mangle]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            $asm
        }
    };
}

trampolines!([vfork, __vfork]() -> libc::pid_t, "notes the child, then libc's `vfork`.",
    // SAFETY: `vfork` takes no arguments, so the registers the helper may change carry none.
    // At entry rsp is 8 below a 16-byte boundary (the return address): 8 more align it for
    // the call. The helper returns before libc's `vfork` runs, and the jump leaves rsp
    // pointing at the program's return address again: the child is made on the program's
    // frame alone, and the stack below rsp that the helper used is free memory then.
    core::arch::naked_asm!(
        "sub rsp, 8",
        "call {before}",
        "add rsp, 8",
        "jmp rax",
        before = sym before_vfork,
    )
);

trampolines!(
    [clone, __clone](
        f: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
        stack: *mut c_void,
        flags: c_int,
        arg: *mut c_void
    ) -> c_int,
    "notes a child that is not a thread, then libc's `clone` (variadic: the optional \
     arguments pass through untouched).",
    // SAFETY: every register and the stack reach libc's `clone` as the program left them
    // (`call_then_jump`); the helper gets the flags (third argument, edx).
    corehop_sys::call_then_jump!(
        []
        ["mov edi, edx"]
        helper = sym before_clone,
    )
);
