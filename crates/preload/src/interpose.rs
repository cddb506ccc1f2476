//! The exported libc entry points. Each builds a [`Request`] (the raw system call this entry
//! point makes on Linux) and a closure that calls the real libc function, and hands both to
//! [`dispatch`].
//!
//! Every function here has the contract of the libc function of the same name: the program
//! calls it exactly as it would call libc. The `_chk` (fortify) variants check their buffer
//! sizes as glibc does by calling glibc's own variant when the check fails. `open` and friends
//! are variadic in C; on the supported ABIs (x86-64 and aarch64 Linux) the optional `mode`
//! arrives in the same register as a fixed third argument, and it is read only when the flags
//! say it was passed (O_CREAT, O_TMPFILE), as glibc does.

use core::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void};

use libc::{iovec, mode_t, nfds_t, off_t, pollfd, size_t, sockaddr, socklen_t, ssize_t, timeval};

use crate::intercept::{
    before_unseen_child, dispatch, finish_timed, memory_limit_comes, new_fd, thread_state_changes,
    to_libc_token,
};
use crate::lane::{Check, Request};
use crate::sys;
use crate::{caught, memo};
use corehop_policy::offload::CallKind;
use corehop_sys::watch;

/// Calls the real libc function `$name` (typed `$ty`, found in `$real`) with `$args`,
/// returning i64; ENOSYS if libc has no such function.
macro_rules! real {
    ($real:ident: $name:ident as $ty:ty, $($arg:expr),*) => {{
        let ptr = $real.get();
        if ptr.is_null() {
            sys::set_errno(libc::ENOSYS);
            -1i64
        } else {
            // SAFETY: `Real` found the next function of that name (libc's, or that of a
            // library preloaded after us), whose C type is $ty; the arguments are the
            // program's own, passed on unchanged.
            unsafe { core::mem::transmute::<*mut c_void, $ty>(ptr)($($arg),*) as i64 }
        }
    }};
}

/// Exports libc entry points `[name, ...]` that share one body (`pread` and `pread64`, the
/// `stat`/`stat64` pairs, ...). In the body, `|$real|` names a closure calling libc's function
/// of the entry point's own name, typed `$real_ty`: the local path, and glibc's own handling
/// where a fortify or version check fails. The body's i64 result is cast to the C return type.
///
/// The body runs in `$name::body`, which takes the call site as one more argument: the
/// exported symbol is a two-instruction trampoline ([`exported!`]) that reads its return
/// address and jumps to the body, so the program's frames need no frame pointers.
macro_rules! entry_points {
    (fn [] $($rest:tt)*) => {};
    (watch fn [] $($rest:tt)*) => {};
    (fn [$name:ident $(, $more:ident)*] $args:tt -> $ret:ty as $real_ty:ty => |$real:ident| $body:expr) => {
        entry_points!(@one moves $name $args -> $ret as $real_ty => |$real| $body);
        entry_points!(fn [$($more),*] $args -> $ret as $real_ty => |$real| $body);
    };
    // A call the library never moves but must see (it changes what may move): no call site,
    // and no passing by.
    (watch fn [$name:ident $(, $more:ident)*] $args:tt -> $ret:ty as $real_ty:ty => |$real:ident| $body:expr) => {
        entry_points!(@one watch $name $args -> $ret as $real_ty => |$real| $body);
        entry_points!(watch fn [$($more),*] $args -> $ret as $real_ty => |$real| $body);
    };
    (
        @one $mode:ident $name:ident ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
            as $real_ty:ty => |$real:ident| $body:expr
    ) => {
        #[allow(non_snake_case)]
        mod $name {
            use super::*;

            /// libc's function of this name.
            static REAL: sys::Real = sys::Real::new(
                match core::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(name) => name,
                    Err(_) => panic!("a libc name has no NUL inside"),
                },
            );

            /// libc's function of this name, called with the program's arguments.
            #[inline(always)]
            fn real($($arg: $ty),*) -> i64 {
                real!(REAL: $name as $real_ty, $($arg),*)
            }

            /// Whether libc's function of this name is a cancellation point.
            const CANCELLATION_POINT: bool = crate::intercept::cancellation_point(stringify!($name));

            /// Where the x86-64 entry point goes (see [`exported!`]): libc's function, for a
            /// call that passes the library by, else 0 (to [`full`]), after acting on a
            /// pending cancellation if this is a cancellation point (its libc function may
            /// not be the one to run).
            #[allow(dead_code)] // the entry points of watched calls and of six arguments
            pub(super) extern "C-unwind" fn route() -> usize {
                entry_points!(@route $mode REAL)
            }

            /// The entry point where it is not routed (aarch64, and six arguments); `site` is
            /// the program's return address (0: unknown). A call that passes the library by
            /// goes to libc from here: kept apart from [`full`], it pays no frame of that
            /// function's size.
            #[allow(dead_code)] // x86-64 routes the entry points of up to five arguments
            pub(super) unsafe extern "C-unwind" fn body($($arg: $ty,)* site: usize) -> $ret {
                entry_points!(@pass $mode real($($arg),*), $ret);
                if CANCELLATION_POINT {
                    crate::intercept::act_on_a_pending_cancellation();
                }
                // SAFETY: this function's contract.
                let done = unsafe { full($($arg,)* site) };
                if done.libc == 0 {
                    return done.result as $ret;
                }
                let result = real($($arg),*);
                if done.result != 0 {
                    return finish_timed(result, done.result as u32) as $ret;
                }
                result as $ret
            }

            /// The entry point's work, for a call the library handles: its result, or libc's
            /// function for the entry point to call (see [`Done`]).
            ///
            /// # Safety
            /// As for the entry point.
            #[inline(never)]
            #[allow(clippy::too_many_arguments)] // libc's own, plus the call site
            pub(super) unsafe extern "C-unwind" fn full($($arg: $ty,)* site: usize) -> Done {
                let $real = || real($($arg),*);
                entry_points!(@enter $mode site);
                // SAFETY: the body passes on this entry point's own arguments, which the
                // program passed to libc: every pointer valid as libc documents (this
                // function's contract), while the program waits for the call.
                #[allow(unused_unsafe)]
                let result: i64 = unsafe { $body };
                let Some(token) = to_libc_token(result) else {
                    return Done { libc: 0, result: (result as $ret) as i64 };
                };
                let libc = REAL.get() as usize;
                if libc != 0 {
                    return Done { libc, result: i64::from(token) };
                }
                // A call left to a libc without the function runs here, for its ENOSYS.
                let result = real($($arg),*);
                let result = if token != 0 { finish_timed(result, token) } else { result };
                Done { libc: 0, result: (result as $ret) as i64 }
            }
        }
        exported!($mode $name ($($arg: $ty),*) -> $ret);
    };
    (@pass moves $call:expr, $ret:ty) => {
        if crate::intercept::passes_by() {
            return $call as $ret;
        }
    };
    (@pass watch $call:expr, $ret:ty) => {};
    (@route moves $real:ident) => {
        if crate::intercept::passes_by() {
            $real.get() as usize
        } else {
            if CANCELLATION_POINT {
                crate::intercept::act_on_a_pending_cancellation();
            }
            0
        }
    };
    (@route watch $real:ident) => {
        0
    };
    (@enter moves $site:ident) => {
        crate::intercept::enter_site($site);
    };
    (@enter watch $site:ident) => {
        let _ = $site;
    };
}

/// The x86-64 entry point's saved argument registers back from its frame (see
/// [`exported!`]).
macro_rules! saved_arguments {
    () => {
        concat!(
            "mov rdi, qword ptr [rsp + 48]\n",
            "mov rsi, qword ptr [rsp + 40]\n",
            "mov rdx, qword ptr [rsp + 32]\n",
            "mov rcx, qword ptr [rsp + 24]\n",
            "mov r8, qword ptr [rsp + 16]\n",
            "mov r9, qword ptr [rsp + 8]\n",
            "mov rax, qword ptr [rsp]",
        )
    };
}

/// The exported symbol `$name`. With at most five integer arguments the call site travels in
/// the next argument register: the trampoline copies the return address (at `[rsp]` on entry
/// on x86-64, in `x30` on aarch64) there and tail-jumps to the body, which so sees the
/// program's own frame. Entry points with more arguments pass no call site.
///
/// On x86-64 the entry point of a call the library may move first asks `route` whether the
/// call passes the library by, and if so jumps to libc's function itself: libc then returns
/// straight to the program. A frame of ours between the two made one-byte reads a tenth
/// slower: every return right after a system call mispredicts here (the kernel leaves the
/// return predictor empty), and ours added one (docs/performance.md, "Thirty-eighth session").
macro_rules! exported {
    (@naked $mode:ident $name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty, $x86:literal, $arm:literal) => {
        #[doc = concat!("`", stringify!($name), "`, possibly run on a service thread.")]
        ///
        /// # Safety
        #[doc = concat!("The contract of libc's `", stringify!($name), "`: every pointer valid for")]
        /// the call as libc documents it (a bad one gives EFAULT where the kernel checks it,
        /// exactly as without this library).
        #[no_mangle]
        #[unsafe(naked)]
        pub unsafe extern "C-unwind" fn $name($($arg: $ty),*) -> $ret {
            // SAFETY (of the trampoline): it runs before any frame of ours exists, changes
            // only a register that carries no argument of `$name`'s C type, and jumps to a
            // function of the same arguments plus that one, with the stack untouched.
            #[cfg(target_arch = "aarch64")]
            core::arch::naked_asm!(concat!("mov ", $arm, ", x30"), "b {body}", body = sym $name::body);
            #[cfg(target_arch = "x86_64")]
            exported!(@x86 $mode $name, $x86);
        }
    };
    (@x86 watch $name:ident, $x86:literal) => {
        core::arch::naked_asm!(concat!("mov ", $x86, ", qword ptr [rsp]"), "jmp {body}", body = sym $name::body)
    };
    // SAFETY (beyond the above): `route`, `full` and `finish_timed` are C functions, each
    // called with the stack aligned (the return address and seven registers: 64 bytes). The
    // registers that may carry an argument (rax: a variadic call's count of vector
    // registers) are saved in that frame; `full` gets them back, and the call site in
    // the register after them. r10 and r11 are scratch in the C ABI. A non-zero address from
    // `route` or `full` is libc's function of this name, and it gets the saved registers: the
    // program's call, as it made it. From `route`, or from `full` with rdx 0, it is jumped to,
    // with the program's stack and return address. From `full` with a token in rdx it is
    // called from this frame (an unwinder crosses the frame by its CFI: there is nothing in it
    // to clean up), and `finish_timed` gets its result and the token, and returns the result
    // unchanged. Otherwise `full` returned the call's result in rdx. The frame goes before
    // each return and each jump.
    (@x86 moves $name:ident, $x86:literal) => {
        core::arch::naked_asm!(
            ".cfi_startproc",
            "push rdi", ".cfi_adjust_cfa_offset 8",
            "push rsi", ".cfi_adjust_cfa_offset 8",
            "push rdx", ".cfi_adjust_cfa_offset 8",
            "push rcx", ".cfi_adjust_cfa_offset 8",
            "push r8", ".cfi_adjust_cfa_offset 8",
            "push r9", ".cfi_adjust_cfa_offset 8",
            "push rax", ".cfi_adjust_cfa_offset 8",
            "call {route}",
            "xor r10d, r10d",
            "test rax, rax",
            "jnz 3f",
            saved_arguments!(),
            concat!("mov ", $x86, ", qword ptr [rsp + 56]"),
            "call {full}",
            "mov r10, rdx",
            "test rax, rax",
            "jnz 3f",
            "mov rax, rdx",
            "add rsp, 56",
            ".cfi_adjust_cfa_offset -56",
            "ret",
            ".cfi_adjust_cfa_offset 56",
            "3:",
            "mov r11, rax",
            "test r10, r10",
            "jnz 4f",
            "pop rax", ".cfi_adjust_cfa_offset -8",
            "pop r9", ".cfi_adjust_cfa_offset -8",
            "pop r8", ".cfi_adjust_cfa_offset -8",
            "pop rcx", ".cfi_adjust_cfa_offset -8",
            "pop rdx", ".cfi_adjust_cfa_offset -8",
            "pop rsi", ".cfi_adjust_cfa_offset -8",
            "pop rdi", ".cfi_adjust_cfa_offset -8",
            "jmp r11",
            ".cfi_adjust_cfa_offset 56",
            "4:",
            saved_arguments!(),
            "mov qword ptr [rsp], r10",
            "call r11",
            "mov rdi, rax",
            "mov rsi, qword ptr [rsp]",
            "call {finish}",
            "add rsp, 56",
            ".cfi_adjust_cfa_offset -56",
            "ret",
            ".cfi_endproc",
            route = sym $name::route,
            full = sym $name::full,
            finish = sym finish_timed,
        )
    };
    ($mode:ident $name:ident () -> $ret:ty) => { exported!(@naked $mode $name () -> $ret, "rdi", "x0"); };
    ($mode:ident $name:ident ($a:ident: $ta:ty) -> $ret:ty) => {
        exported!(@naked $mode $name ($a: $ta) -> $ret, "rsi", "x1");
    };
    ($mode:ident $name:ident ($a:ident: $ta:ty, $b:ident: $tb:ty) -> $ret:ty) => {
        exported!(@naked $mode $name ($a: $ta, $b: $tb) -> $ret, "rdx", "x2");
    };
    ($mode:ident $name:ident ($a:ident: $ta:ty, $b:ident: $tb:ty, $c:ident: $tc:ty) -> $ret:ty) => {
        exported!(@naked $mode $name ($a: $ta, $b: $tb, $c: $tc) -> $ret, "rcx", "x3");
    };
    ($mode:ident $name:ident ($a:ident: $ta:ty, $b:ident: $tb:ty, $c:ident: $tc:ty, $d:ident: $td:ty) -> $ret:ty) => {
        exported!(@naked $mode $name ($a: $ta, $b: $tb, $c: $tc, $d: $td) -> $ret, "r8", "x4");
    };
    ($mode:ident $name:ident ($a:ident: $ta:ty, $b:ident: $tb:ty, $c:ident: $tc:ty, $d:ident: $td:ty, $e:ident: $te:ty) -> $ret:ty) => {
        exported!(@naked $mode $name ($a: $ta, $b: $tb, $c: $tc, $d: $td, $e: $te) -> $ret, "r9", "x5");
    };
    ($mode:ident $name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        #[doc = concat!("`", stringify!($name), "`, possibly run on a service thread.")]
        ///
        /// # Safety
        #[doc = concat!("The contract of libc's `", stringify!($name), "`: every pointer valid for")]
        /// the call as libc documents it.
        #[no_mangle]
        pub unsafe extern "C-unwind" fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the caller keeps libc's contract, which is the body's.
            unsafe { $name::body($($arg,)* 0) }
        }
    };
}

/// What an entry point's `full` path did: the call's result (cast to the C return type and
/// back), or, where `libc` is not 0, nothing yet: the entry point makes the call, to that
/// function of libc's. With `result` 0 it jumps there; otherwise `result` is a timed call's
/// token, and it calls the function and then [`finish_timed`] with the token. Returned in
/// rax and rdx on x86-64.
#[repr(C)]
pub struct Done {
    libc: usize,
    result: i64,
}

/// # Safety
/// As for [`Request::new`].
unsafe fn request(nr: i64, args: [u64; 6], check: Check) -> Request {
    // SAFETY: this function's contract.
    unsafe { Request::new(nr, args, check, false) }
}

/// # Safety
/// As for [`Request::new`].
unsafe fn signalling(nr: i64, args: [u64; 6], check: Check) -> Request {
    // SAFETY: this function's contract.
    unsafe { Request::new(nr, args, check, true) }
}

fn needs_mode(flags: c_int) -> bool {
    flags & libc::O_CREAT != 0 || flags & libc::O_TMPFILE == libc::O_TMPFILE
}

// ---- read / write ----------------------------------------------------------------------

/// # Safety
/// The pointers valid for the call as libc documents it, as for [`Request::new`].
unsafe fn do_read(fd: c_int, buf: *mut c_void, count: size_t) -> i64 {
    let args = [fd as u64, buf as u64, count as u64, 0, 0, 0];
    // SAFETY: this function's contract.
    let req = unsafe { request(libc::SYS_read, args, Check::Fd(fd)) };
    dispatch(CallKind::Read, fd, || count as u64, Some(req))
}

entry_points! {
    fn [read](fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t
        as unsafe extern "C-unwind" fn(c_int, *mut c_void, size_t) -> ssize_t
        => |_real| do_read(fd, buf, count)
}

entry_points! {
    fn [__read_chk](fd: c_int, buf: *mut c_void, count: size_t, buflen: size_t) -> ssize_t
        as unsafe extern "C-unwind" fn(c_int, *mut c_void, size_t, size_t) -> ssize_t
        // On overflow glibc's own variant reports it.
        => |real| if count > buflen { real() } else { do_read(fd, buf, count) }
}

entry_points! {
    fn [write](fd: c_int, buf: *const c_void, count: size_t) -> ssize_t
        as unsafe extern "C-unwind" fn(c_int, *const c_void, size_t) -> ssize_t
        => |_real| {
            let args = [fd as u64, buf as u64, count as u64, 0, 0, 0];
            let req = signalling(libc::SYS_write, args, Check::Fd(fd));
            dispatch(CallKind::Write, fd, || count as u64, Some(req))
        }
}

/// # Safety
/// The pointers valid for the call as libc documents it, as for [`Request::new`].
unsafe fn do_pread(fd: c_int, buf: *mut c_void, count: size_t, offset: off_t) -> i64 {
    let args = [fd as u64, buf as u64, count as u64, offset as u64, 0, 0];
    dispatch(
        CallKind::Pread,
        fd,
        || count as u64,
        // SAFETY: this function's contract.
        Some(unsafe { request(libc::SYS_pread64, args, Check::Positioned(fd)) }),
    )
}

entry_points! {
    fn [pread, pread64](fd: c_int, buf: *mut c_void, count: size_t, offset: off_t) -> ssize_t
        as unsafe extern "C-unwind" fn(c_int, *mut c_void, size_t, off_t) -> ssize_t
        => |_real| do_pread(fd, buf, count, offset)
}

entry_points! {
    fn [__pread_chk, __pread64_chk](
        fd: c_int,
        buf: *mut c_void,
        count: size_t,
        offset: off_t,
        buflen: size_t,
    ) -> ssize_t
        as unsafe extern "C-unwind" fn(c_int, *mut c_void, size_t, off_t, size_t) -> ssize_t
        => |real| if count > buflen { real() } else { do_pread(fd, buf, count, offset) }
}

entry_points! {
    fn [pwrite, pwrite64](fd: c_int, buf: *const c_void, count: size_t, offset: off_t) -> ssize_t
        as unsafe extern "C-unwind" fn(c_int, *const c_void, size_t, off_t) -> ssize_t
        => |_real| {
            let args = [fd as u64, buf as u64, count as u64, offset as u64, 0, 0];
            let req = signalling(libc::SYS_pwrite64, args, Check::Positioned(fd));
            dispatch(CallKind::Pwrite, fd, || count as u64, Some(req))
        }
}

entry_points! {
    fn [readv](fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t
        as unsafe extern "C-unwind" fn(c_int, *const iovec, c_int) -> ssize_t
        => |_real| {
            let args = [fd as u64, iov as u64, iovcnt as u64, 0, 0, 0];
            let req = request(libc::SYS_readv, args, Check::Fd(fd));
            dispatch(CallKind::Readv, fd, || sys::iov_total(iov as u64, iovcnt), Some(req))
        }
}

entry_points! {
    fn [writev](fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t
        as unsafe extern "C-unwind" fn(c_int, *const iovec, c_int) -> ssize_t
        => |_real| {
            let args = [fd as u64, iov as u64, iovcnt as u64, 0, 0, 0];
            let req = signalling(libc::SYS_writev, args, Check::Fd(fd));
            dispatch(CallKind::Writev, fd, || sys::iov_total(iov as u64, iovcnt), Some(req))
        }
}

// ---- open ------------------------------------------------------------------------------

/// # Safety
/// The pointers valid for the call as libc documents it, as for [`Request::new`].
unsafe fn do_openat(kind: CallKind, dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> i64 {
    let mode = if needs_mode(flags) { mode } else { 0 };
    let args = [dirfd as u64, path as u64, flags as u64, mode as u64, 0, 0];
    let check = Check::Open { dirfd, path: path as u64, flags };
    // SAFETY: this function's contract.
    let req = unsafe { request(libc::SYS_openat, args, check) };
    // It names a new file now (`reassigned` also forgets a mark: a number can be marked only
    // once the memo is armed, which is when `reassigned` acts).
    new_fd(dispatch(kind, -1, || 0, Some(req)))
}

entry_points! {
    fn [open, open64](path: *const c_char, flags: c_int, mode: c_uint) -> c_int
        as unsafe extern "C-unwind" fn(*const c_char, c_int, ...) -> c_int
        => |_real| do_openat(CallKind::Open, libc::AT_FDCWD, path, flags, mode)
}

entry_points! {
    fn [__open_2, __open64_2](path: *const c_char, flags: c_int) -> c_int
        as unsafe extern "C-unwind" fn(*const c_char, c_int) -> c_int
        // A mode-taking open without a mode: glibc's own variant reports it.
        => |real| if needs_mode(flags) {
            real()
        } else {
            do_openat(CallKind::Open, libc::AT_FDCWD, path, flags, 0)
        }
}

entry_points! {
    fn [openat, openat64](dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int
        as unsafe extern "C-unwind" fn(c_int, *const c_char, c_int, ...) -> c_int
        => |_real| do_openat(CallKind::Openat, dirfd, path, flags, mode)
}

entry_points! {
    fn [__openat_2, __openat64_2](dirfd: c_int, path: *const c_char, flags: c_int) -> c_int
        as unsafe extern "C-unwind" fn(c_int, *const c_char, c_int) -> c_int
        => |real| if needs_mode(flags) {
            real()
        } else {
            do_openat(CallKind::Openat, dirfd, path, flags, 0)
        }
}

// ---- stat family -----------------------------------------------------------------------

type Stat = libc::stat;

/// # Safety
/// The pointers valid for the call as libc documents it, as for [`Request::new`].
unsafe fn do_fstatat(kind: CallKind, dirfd: c_int, path: *const c_char, buf: *mut Stat, flags: c_int) -> i64 {
    let args = [dirfd as u64, path as u64, buf as u64, flags as u64, 0, 0];
    // SAFETY: this function's contract.
    let req = unsafe { request(libc::SYS_newfstatat, args, Check::Nothing) };
    dispatch(kind, if kind == CallKind::Newfstatat { dirfd } else { -1 }, || 0, Some(req))
}

/// # Safety
/// The pointers valid for the call as libc documents it, as for [`Request::new`].
unsafe fn do_fstat(fd: c_int, buf: *mut Stat) -> i64 {
    let args = [fd as u64, buf as u64, 0, 0, 0, 0];
    // SAFETY: this function's contract.
    let req = unsafe { request(libc::SYS_fstat, args, Check::Nothing) };
    dispatch(CallKind::Fstat, fd, || 0, Some(req))
}

/// The `struct stat` versions the legacy `__xstat` entry points accept on this ABI
/// (`_STAT_VER_KERNEL`, `_STAT_VER_LINUX`); others get glibc's own EINVAL.
fn known_stat_version(version: c_int) -> bool {
    version == 0 || version == 1
}

entry_points! {
    fn [stat, stat64](path: *const c_char, buf: *mut Stat) -> c_int
        as unsafe extern "C-unwind" fn(*const c_char, *mut Stat) -> c_int
        => |_real| do_fstatat(CallKind::Stat, libc::AT_FDCWD, path, buf, 0)
}

entry_points! {
    fn [lstat, lstat64](path: *const c_char, buf: *mut Stat) -> c_int
        as unsafe extern "C-unwind" fn(*const c_char, *mut Stat) -> c_int
        => |_real| do_fstatat(CallKind::Lstat, libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW)
}

entry_points! {
    fn [fstat, fstat64](fd: c_int, buf: *mut Stat) -> c_int
        as unsafe extern "C-unwind" fn(c_int, *mut Stat) -> c_int
        => |_real| do_fstat(fd, buf)
}

entry_points! {
    fn [fstatat, fstatat64](dirfd: c_int, path: *const c_char, buf: *mut Stat, flags: c_int) -> c_int
        as unsafe extern "C-unwind" fn(c_int, *const c_char, *mut Stat, c_int) -> c_int
        => |_real| do_fstatat(CallKind::Newfstatat, dirfd, path, buf, flags)
}

entry_points! {
    fn [__xstat, __xstat64](version: c_int, path: *const c_char, buf: *mut Stat) -> c_int
        as unsafe extern "C-unwind" fn(c_int, *const c_char, *mut Stat) -> c_int
        => |real| if !known_stat_version(version) {
            real()
        } else {
            do_fstatat(CallKind::Stat, libc::AT_FDCWD, path, buf, 0)
        }
}

entry_points! {
    fn [__lxstat, __lxstat64](version: c_int, path: *const c_char, buf: *mut Stat) -> c_int
        as unsafe extern "C-unwind" fn(c_int, *const c_char, *mut Stat) -> c_int
        => |real| if !known_stat_version(version) {
            real()
        } else {
            do_fstatat(CallKind::Lstat, libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW)
        }
}

entry_points! {
    fn [__fxstat, __fxstat64](version: c_int, fd: c_int, buf: *mut Stat) -> c_int
        as unsafe extern "C-unwind" fn(c_int, c_int, *mut Stat) -> c_int
        => |real| if !known_stat_version(version) { real() } else { do_fstat(fd, buf) }
}

entry_points! {
    fn [__fxstatat, __fxstatat64](
        version: c_int,
        dirfd: c_int,
        path: *const c_char,
        buf: *mut Stat,
        flags: c_int,
    ) -> c_int
        as unsafe extern "C-unwind" fn(c_int, c_int, *const c_char, *mut Stat, c_int) -> c_int
        => |real| if !known_stat_version(version) {
            real()
        } else {
            do_fstatat(CallKind::Newfstatat, dirfd, path, buf, flags)
        }
}

entry_points! {
    fn [statx](dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, buf: *mut libc::statx) -> c_int
        as unsafe extern "C-unwind" fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int
        => |_real| {
            let args = [dirfd as u64, path as u64, flags as u64, mask as u64, buf as u64, 0];
            let req = request(libc::SYS_statx, args, Check::Nothing);
            dispatch(CallKind::Statx, dirfd, || 0, Some(req))
        }
}

// ---- fsync / fdatasync -----------------------------------------------------------------

entry_points! {
    fn [fsync](fd: c_int) -> c_int as unsafe extern "C-unwind" fn(c_int) -> c_int => |_real| {
        let req = request(libc::SYS_fsync, [fd as u64, 0, 0, 0, 0, 0], Check::Nothing);
        dispatch(CallKind::Fsync, fd, || 0, Some(req))
    }
}

entry_points! {
    fn [fdatasync](fd: c_int) -> c_int as unsafe extern "C-unwind" fn(c_int) -> c_int => |_real| {
        let req = request(libc::SYS_fdatasync, [fd as u64, 0, 0, 0, 0, 0], Check::Nothing);
        dispatch(CallKind::Fdatasync, fd, || 0, Some(req))
    }
}

// ---- sendfile / sockets ----------------------------------------------------------------

entry_points! {
    fn [sendfile, sendfile64](out_fd: c_int, in_fd: c_int, offset: *mut off_t, count: size_t) -> ssize_t
        as unsafe extern "C-unwind" fn(c_int, c_int, *mut off_t, size_t) -> ssize_t
        => |_real| {
            let args = [out_fd as u64, in_fd as u64, offset as u64, count as u64, 0, 0];
            let req = signalling(libc::SYS_sendfile, args, Check::Fds(out_fd, in_fd));
            dispatch(CallKind::Sendfile, out_fd, || count as u64, Some(req))
        }
}

entry_points! {
    fn [sendto](
        fd: c_int,
        buf: *const c_void,
        len: size_t,
        flags: c_int,
        addr: *const sockaddr,
        addrlen: socklen_t,
    ) -> ssize_t
        as unsafe extern "C-unwind" fn(c_int, *const c_void, size_t, c_int, *const sockaddr, socklen_t) -> ssize_t
        => |_real| {
            let args = [fd as u64, buf as u64, len as u64, flags as u64, addr as u64, addrlen as u64];
            let req = Request::new(libc::SYS_sendto, args, Check::Socket(fd, flags), flags & libc::MSG_NOSIGNAL == 0);
            dispatch(CallKind::Sendto, fd, || len as u64, Some(req))
        }
}

entry_points! {
    fn [recvfrom](
        fd: c_int,
        buf: *mut c_void,
        len: size_t,
        flags: c_int,
        addr: *mut sockaddr,
        addrlen: *mut socklen_t,
    ) -> ssize_t
        as unsafe extern "C-unwind" fn(c_int, *mut c_void, size_t, c_int, *mut sockaddr, *mut socklen_t) -> ssize_t
        => |_real| {
            let args = [fd as u64, buf as u64, len as u64, flags as u64, addr as u64, addrlen as u64];
            let req = request(libc::SYS_recvfrom, args, Check::Socket(fd, flags));
            dispatch(CallKind::Recvfrom, fd, || len as u64, Some(req))
        }
}

// ---- poll / select ---------------------------------------------------------------------

/// # Safety
/// The pointers valid for the call as libc documents it, as for [`Request::new`].
unsafe fn do_poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> i64 {
    // Only a poll that cannot wait goes across: a waiting one must stay interruptible by the
    // caller's signals.
    // SAFETY: this function's contract.
    let req = (timeout == 0)
        .then(|| unsafe { request(libc::SYS_poll, [fds as u64, nfds, 0, 0, 0, 0], Check::Watched) });
    dispatch(CallKind::Poll, -1, || 0, req)
}

entry_points! {
    fn [poll](fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int
        as unsafe extern "C-unwind" fn(*mut pollfd, nfds_t, c_int) -> c_int
        => |_real| do_poll(fds, nfds, timeout)
}

entry_points! {
    fn [__poll_chk](fds: *mut pollfd, nfds: nfds_t, timeout: c_int, fdslen: size_t) -> c_int
        as unsafe extern "C-unwind" fn(*mut pollfd, nfds_t, c_int, size_t) -> c_int
        => |real| if (fdslen / core::mem::size_of::<pollfd>()) < nfds as usize {
            real()
        } else {
            do_poll(fds, nfds, timeout)
        }
}

entry_points! {
    fn [select](
        nfds: c_int,
        readfds: *mut libc::fd_set,
        writefds: *mut libc::fd_set,
        exceptfds: *mut libc::fd_set,
        timeout: *mut timeval,
    ) -> c_int
        as unsafe extern "C-unwind" fn(
            c_int,
            *mut libc::fd_set,
            *mut libc::fd_set,
            *mut libc::fd_set,
            *mut timeval,
        ) -> c_int
        => |_real| {
            // As for poll: only a select with a zero timeout goes across.
            let mut tv = [0u8; core::mem::size_of::<timeval>()];
            let zero_timeout =
                !timeout.is_null() && sys::read_user(timeout as u64, &mut tv) && tv.iter().all(|&b| b == 0);
            let args = [nfds as u64, readfds as u64, writefds as u64, exceptfds as u64, timeout as u64, 0];
            let req = zero_timeout.then(|| request(libc::SYS_select, args, Check::Watched));
            dispatch(CallKind::Select, -1, || 0, req)
        }
}

// ---- calls that close or reassign a descriptor (not offloaded: watched, see `memo`) -----

/// Runs `call`, which closes or reassigns descriptors `first..=last`, telling `memo` before and
/// after.
fn reassigning(first: u32, last: u32, call: impl FnOnce() -> i64) -> i64 {
    memo::reassigned_range(first, last);
    let ret = call();
    memo::reassigned_range(first, last);
    ret
}

/// [`reassigning`] descriptor `fd` (a negative one names none: the call fails with EBADF).
fn reassigning_fd(fd: c_int, call: impl FnOnce() -> i64) -> i64 {
    match u32::try_from(fd) {
        Ok(fd) => reassigning(fd, fd, call),
        Err(_) => call(),
    }
}

entry_points! {
    watch fn [close](fd: c_int) -> c_int as unsafe extern "C-unwind" fn(c_int) -> c_int => |real| reassigning_fd(fd, real)
}

entry_points! {
    watch fn [dup2](old: c_int, new: c_int) -> c_int
        as unsafe extern "C-unwind" fn(c_int, c_int) -> c_int
        => |real| reassigning_fd(new, real)
}

entry_points! {
    watch fn [dup3](old: c_int, new: c_int, flags: c_int) -> c_int
        as unsafe extern "C-unwind" fn(c_int, c_int, c_int) -> c_int
        => |real| reassigning_fd(new, real)
}

entry_points! {
    watch fn [close_range](first: c_uint, last: c_uint, flags: c_int) -> c_int
        as unsafe extern "C-unwind" fn(c_uint, c_uint, c_int) -> c_int
        => |real| reassigning(first, last, real)
}

/// The descriptors a raw system call `nr` with arguments `a`, `b` closes or reassigns.
fn reassigned_by(nr: c_long, a: c_long, b: c_long) -> Option<(u32, u32)> {
    // The kernel reads descriptors as 32-bit unsigned numbers.
    let fd = |n: c_long| n as u32;
    match nr {
        libc::SYS_close => Some((fd(a), fd(a))),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_dup2 => Some((fd(b), fd(b))),
        libc::SYS_dup3 => Some((fd(b), fd(b))),
        libc::SYS_close_range => Some((fd(a), fd(b))),
        _ => None,
    }
}

// ---- the start-up stub's hand-over ------------------------------------------------------

/// Called by the start-up stub right after it loaded this library with `dlopen`, before
/// anything else: `resolve` finds what a libc name binds to after the stub, where the
/// program's calls go on from it ([`sys::look_up_through`]).
#[no_mangle]
pub extern "C" fn corehop_preload_next_after_stub(resolve: sys::NextAfterStub) {
    sys::look_up_through(resolve);
}

/// Called once by the start-up stub (`crates/preload-stub`) after
/// [`corehop_preload_next_after_stub`], before it routes any call here: starts the library up
/// in the process that loaded it, with the default policy's first epoch counted from
/// `first_call_ns` (the monotonic clock, ns). `flags` bit 0: the stub saw a call start a
/// process the fork handlers do not see; bit 1: it calls on a stack of its own of at least
/// 256 KiB (the start-up then runs on it). `first_tid` and `first_blocked`: the thread that made
/// the first call and the signals it blocked then (see
/// `corehop_sys::stub_state::outside_a_handler`). `hidden`: what the stub took out of the
/// program's environment (`corehop_sys::hidden_env`), this library's settings among it; null
/// or a static of the stub's. Returns whether offload may happen.
#[no_mangle]
pub extern "C" fn corehop_preload_handover(
    first_call_ns: u64,
    flags: u32,
    first_tid: i64,
    first_blocked: u64,
    hidden: *const corehop_sys::hidden_env::Hidden,
) -> bool {
    crate::hidden::from_stub(hidden);
    let stack = if flags & 2 != 0 { crate::intercept::Stack::Callers } else { crate::intercept::Stack::Own };
    crate::intercept::handover(first_call_ns, flags & 1 != 0, (first_tid, first_blocked), stack)
}

// ---- the end of a process that runs no `atexit` handlers --------------------------------

/// `_exit`: writes the summary, trace and learned state a run asked for, as `exit` would
/// have ([`crate::intercept::before_exit`]), then ends the process with the next `_exit`.
///
/// # Safety
/// None beyond `_exit`'s: it does not return.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    crate::intercept::before_exit();
    let real = sys::REAL_EXIT.get();
    if !real.is_null() {
        // SAFETY: the address is the next `_exit` (a sanitizer's or libc's), of this type.
        let real: unsafe extern "C" fn(c_int) -> ! = unsafe { core::mem::transmute(real) };
        // SAFETY: `_exit` has no preconditions.
        unsafe { real(status) }
    }
    loop {
        // SAFETY: exit_group takes an integer and does not return.
        unsafe { sys::raw(libc::SYS_exit_group, [status as u64, 0, 0, 0, 0, 0]) };
    }
}

/// `_Exit`: as [`_exit`].
///
/// # Safety
/// None beyond `_Exit`'s: it does not return.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    // SAFETY: the same function.
    unsafe { _exit(status) }
}

// ---- calls that change one thread's security state (not offloaded: watched) -------------

entry_points! {
    watch fn [syscall](nr: c_long, a: c_long, b: c_long, c: c_long, d: c_long, e: c_long, f: c_long) -> c_long
        as unsafe extern "C-unwind" fn(c_long, ...) -> c_long
        => |real| {
            if watch::changes_thread_state(nr) || makes_a_thread_of_its_own_files(nr, a) {
                thread_state_changes();
            }
            if watch::starts_unseen_child(nr, a) {
                before_unseen_child();
            }
            if sys::raw_call_may_limit_memory(nr, a, b, c) {
                memory_limit_comes();
            }
            match reassigned_by(nr, a, b) {
                Some((first, last)) => reassigning(first, last, real),
                None if nr == libc::SYS_rt_sigaction => caught::installing(a as c_int, b != 0, real),
                None => real(),
            }
        }
}

/// Whether a raw `clone` or `clone3` (`nr`, first argument `a`) makes a thread with a
/// directory or descriptors of its own ([`watch::thread_with_own_files`]). clone3's flags are
/// the first word of the struct `a` points to; memory that cannot be read says no (the call
/// fails with EFAULT).
fn makes_a_thread_of_its_own_files(nr: c_long, a: c_long) -> bool {
    match nr {
        libc::SYS_clone => watch::thread_with_own_files(a),
        libc::SYS_clone3 => {
            let mut flags = [0u8; 8];
            sys::read_user(a as u64, &mut flags) && watch::thread_with_own_files(i64::from_ne_bytes(flags))
        }
        _ => false,
    }
}

// ---- calls that install signal handlers (not offloaded: watched, see `caught`) ----------

entry_points! {
    watch fn [sigaction](sig: c_int, act: *const c_void, old: *mut c_void) -> c_int
        as unsafe extern "C-unwind" fn(c_int, *const c_void, *mut c_void) -> c_int
        => |real| caught::installing(sig, !act.is_null(), real)
}

entry_points! {
    watch fn [signal, sigset](sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t
        as unsafe extern "C-unwind" fn(c_int, libc::sighandler_t) -> libc::sighandler_t
        => |real| caught::installing(sig, true, real)
}

// A fork that runs no fork handlers: the child's copy of our memory names our pid.
entry_points! {
    watch fn [_Fork]() -> libc::pid_t as unsafe extern "C-unwind" fn() -> libc::pid_t => |real| {
        before_unseen_child();
        real()
    }
}

entry_points! {
    watch fn [prctl](option: c_int, a: c_ulong, b: c_ulong, c: c_ulong, d: c_ulong) -> c_int
        as unsafe extern "C-unwind" fn(c_int, ...) -> c_int
        => |real| {
            if watch::prctl_changes_thread_state(i64::from(option)) {
                thread_state_changes();
            }
            real()
        }
}

entry_points! {
    watch fn [setfsuid, setfsgid](id: c_uint) -> c_int as unsafe extern "C-unwind" fn(c_uint) -> c_int => |real| {
        thread_state_changes();
        real()
    }
}

entry_points! {
    watch fn [unshare](flags: c_int) -> c_int as unsafe extern "C-unwind" fn(c_int) -> c_int => |real| {
        thread_state_changes();
        real()
    }
}

entry_points! {
    watch fn [setns](fd: c_int, nstype: c_int) -> c_int as unsafe extern "C-unwind" fn(c_int, c_int) -> c_int => |real| {
        thread_state_changes();
        real()
    }
}

entry_points! {
    watch fn [capset](header: *mut c_void, data: *const c_void) -> c_int
        as unsafe extern "C-unwind" fn(*mut c_void, *const c_void) -> c_int
        => |real| {
            thread_state_changes();
            real()
        }
}

// ---- calls that may set a memory limit (not offloaded: watched) -------------------------

// Before the call, which then runs as plainly (see `intercept::memory_limit_comes`).
entry_points! {
    watch fn [setrlimit, setrlimit64](resource: c_int, new: *const c_void) -> c_int
        as unsafe extern "C-unwind" fn(c_int, *const c_void) -> c_int
        => |real| {
            if sys::may_limit_memory(0, i64::from(resource), new as u64) {
                memory_limit_comes();
            }
            real()
        }
}

entry_points! {
    watch fn [prlimit, prlimit64](pid: libc::pid_t, resource: c_int, new: *const c_void, old: *mut c_void) -> c_int
        as unsafe extern "C-unwind" fn(libc::pid_t, c_int, *const c_void, *mut c_void) -> c_int
        => |real| {
            if sys::may_limit_memory(i64::from(pid), i64::from(resource), new as u64) {
                memory_limit_comes();
            }
            real()
        }
}
