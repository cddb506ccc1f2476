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

use core::ffi::{c_char, c_int, c_uint, c_void};

use libc::{iovec, mode_t, nfds_t, off_t, pollfd, size_t, sockaddr, socklen_t, ssize_t, timeval};

use crate::calls::Kind;
use crate::intercept::dispatch;
use crate::lane::{Check, Request};
use crate::memo;
use crate::sys;

/// Calls the real libc function `$name` (typed `$ty`) with `$args`, returning i64; ENOSYS if
/// libc has no such function.
macro_rules! real {
    ($name:literal as $ty:ty, $($arg:expr),*) => {{
        static REAL: sys::Real = sys::Real::new(concat!($name, "\0").as_bytes());
        let ptr = REAL.get();
        if ptr.is_null() {
            sys::set_errno(libc::ENOSYS);
            -1i64
        } else {
            // SAFETY: dlsym(RTLD_NEXT, $name) returned libc's function of that name, whose C
            // type is $ty; the arguments are the program's own, passed on unchanged.
            unsafe { core::mem::transmute::<*mut c_void, $ty>(ptr)($($arg),*) as i64 }
        }
    }};
}

fn request(nr: i64, args: [u64; 6], check: Check) -> Request {
    Request { nr, args, check, may_signal: false }
}

fn signalling(nr: i64, args: [u64; 6], check: Check) -> Request {
    Request { nr, args, check, may_signal: true }
}

fn needs_mode(flags: c_int) -> bool {
    flags & libc::O_CREAT != 0 || flags & libc::O_TMPFILE == libc::O_TMPFILE
}

// ---- read / write ----------------------------------------------------------------------

fn do_read(fd: c_int, buf: *mut c_void, count: size_t, local: impl FnOnce() -> i64) -> ssize_t {
    let args = [fd as u64, buf as u64, count as u64, 0, 0, 0];
    dispatch(Kind::Read, fd, || count as u64, Some(request(libc::SYS_read, args, Check::Fd(fd))), local)
        as ssize_t
}

/// `read`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `read`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    do_read(fd, buf, count, || {
        real!("read" as unsafe extern "C" fn(c_int, *mut c_void, size_t) -> ssize_t, fd, buf, count)
    })
}

/// `__read_chk`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `__read_chk`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, count: size_t, buflen: size_t) -> ssize_t {
    let real = || {
        real!(
            "__read_chk" as unsafe extern "C" fn(c_int, *mut c_void, size_t, size_t) -> ssize_t,
            fd,
            buf,
            count,
            buflen
        )
    };
    if count > buflen {
        return real() as ssize_t; // glibc reports the overflow
    }
    do_read(fd, buf, count, real)
}

/// `write`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `write`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    let args = [fd as u64, buf as u64, count as u64, 0, 0, 0];
    dispatch(
        Kind::Write,
        fd,
        || count as u64,
        Some(signalling(libc::SYS_write, args, Check::Fd(fd))),
        || real!("write" as unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t, fd, buf, count),
    ) as ssize_t
}

fn do_pread(
    fd: c_int,
    buf: *mut c_void,
    count: size_t,
    offset: off_t,
    local: impl FnOnce() -> i64,
) -> ssize_t {
    let args = [fd as u64, buf as u64, count as u64, offset as u64, 0, 0];
    dispatch(Kind::Pread, fd, || count as u64, Some(request(libc::SYS_pread64, args, Check::Fd(fd))), local)
        as ssize_t
}

/// `pread`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `pread`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, count: size_t, offset: off_t) -> ssize_t {
    do_pread(fd, buf, count, offset, || {
        real!(
            "pread" as unsafe extern "C" fn(c_int, *mut c_void, size_t, off_t) -> ssize_t,
            fd,
            buf,
            count,
            offset
        )
    })
}

/// `pread64`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `pread64`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, count: size_t, offset: off_t) -> ssize_t {
    do_pread(fd, buf, count, offset, || {
        real!(
            "pread64" as unsafe extern "C" fn(c_int, *mut c_void, size_t, off_t) -> ssize_t,
            fd,
            buf,
            count,
            offset
        )
    })
}

/// `__pread_chk`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `__pread_chk`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn __pread_chk(
    fd: c_int,
    buf: *mut c_void,
    count: size_t,
    offset: off_t,
    buflen: size_t,
) -> ssize_t {
    let real = || {
        real!(
            "__pread_chk" as unsafe extern "C" fn(c_int, *mut c_void, size_t, off_t, size_t) -> ssize_t,
            fd,
            buf,
            count,
            offset,
            buflen
        )
    };
    if count > buflen {
        return real() as ssize_t;
    }
    do_pread(fd, buf, count, offset, real)
}

/// `__pread64_chk`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `__pread64_chk`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn __pread64_chk(
    fd: c_int,
    buf: *mut c_void,
    count: size_t,
    offset: off_t,
    buflen: size_t,
) -> ssize_t {
    let real = || {
        real!(
            "__pread64_chk" as unsafe extern "C" fn(c_int, *mut c_void, size_t, off_t, size_t) -> ssize_t,
            fd,
            buf,
            count,
            offset,
            buflen
        )
    };
    if count > buflen {
        return real() as ssize_t;
    }
    do_pread(fd, buf, count, offset, real)
}

fn do_pwrite(
    fd: c_int,
    buf: *const c_void,
    count: size_t,
    offset: off_t,
    local: impl FnOnce() -> i64,
) -> ssize_t {
    let args = [fd as u64, buf as u64, count as u64, offset as u64, 0, 0];
    dispatch(
        Kind::Pwrite,
        fd,
        || count as u64,
        Some(signalling(libc::SYS_pwrite64, args, Check::Fd(fd))),
        local,
    ) as ssize_t
}

/// `pwrite`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `pwrite`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, count: size_t, offset: off_t) -> ssize_t {
    do_pwrite(fd, buf, count, offset, || {
        real!(
            "pwrite" as unsafe extern "C" fn(c_int, *const c_void, size_t, off_t) -> ssize_t,
            fd,
            buf,
            count,
            offset
        )
    })
}

/// `pwrite64`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `pwrite64`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn pwrite64(fd: c_int, buf: *const c_void, count: size_t, offset: off_t) -> ssize_t {
    do_pwrite(fd, buf, count, offset, || {
        real!(
            "pwrite64" as unsafe extern "C" fn(c_int, *const c_void, size_t, off_t) -> ssize_t,
            fd,
            buf,
            count,
            offset
        )
    })
}

/// `readv`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `readv`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t {
    let args = [fd as u64, iov as u64, iovcnt as u64, 0, 0, 0];
    dispatch(
        Kind::Readv,
        fd,
        || sys::iov_total(iov as u64, iovcnt),
        Some(request(libc::SYS_readv, args, Check::Fd(fd))),
        || real!("readv" as unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t, fd, iov, iovcnt),
    ) as ssize_t
}

/// `writev`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `writev`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t {
    let args = [fd as u64, iov as u64, iovcnt as u64, 0, 0, 0];
    let req = Some(signalling(libc::SYS_writev, args, Check::Fd(fd)));
    dispatch(
        Kind::Writev,
        fd,
        || sys::iov_total(iov as u64, iovcnt),
        req,
        || real!("writev" as unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t, fd, iov, iovcnt),
    ) as ssize_t
}

// ---- open ------------------------------------------------------------------------------

fn do_openat(
    kind: Kind,
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
    local: impl FnOnce() -> i64,
) -> c_int {
    let mode = if needs_mode(flags) { mode } else { 0 };
    let args = [dirfd as u64, path as u64, flags as u64, mode as u64, 0, 0];
    let check = Check::Open { dirfd, path: path as u64, flags };
    let fd = dispatch(kind, -1, || 0, Some(request(libc::SYS_openat, args, check)), local) as c_int;
    memo::clear(fd);
    fd
}

type OpenFn = unsafe extern "C" fn(*const c_char, c_int, ...) -> c_int;
type OpenatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, ...) -> c_int;

/// `open`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `open`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    do_openat(Kind::Open, libc::AT_FDCWD, path, flags, mode, || real!("open" as OpenFn, path, flags, mode))
}

/// `open64`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `open64`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    do_openat(Kind::Open, libc::AT_FDCWD, path, flags, mode, || real!("open64" as OpenFn, path, flags, mode))
}

/// `__open_2`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `__open_2`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    let real = || real!("__open_2" as unsafe extern "C" fn(*const c_char, c_int) -> c_int, path, flags);
    if needs_mode(flags) {
        return real() as c_int; // glibc reports the missing mode
    }
    do_openat(Kind::Open, libc::AT_FDCWD, path, flags, 0, real)
}

/// `__open64_2`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `__open64_2`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    let real = || real!("__open64_2" as unsafe extern "C" fn(*const c_char, c_int) -> c_int, path, flags);
    if needs_mode(flags) {
        return real() as c_int;
    }
    do_openat(Kind::Open, libc::AT_FDCWD, path, flags, 0, real)
}

/// `openat`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `openat`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    do_openat(Kind::Openat, dirfd, path, flags, mode, || {
        real!("openat" as OpenatFn, dirfd, path, flags, mode)
    })
}

/// `openat64`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `openat64`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    do_openat(Kind::Openat, dirfd, path, flags, mode, || {
        real!("openat64" as OpenatFn, dirfd, path, flags, mode)
    })
}

/// `__openat_2`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `__openat_2`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    let real = || {
        real!("__openat_2" as unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int, dirfd, path, flags)
    };
    if needs_mode(flags) {
        return real() as c_int;
    }
    do_openat(Kind::Openat, dirfd, path, flags, 0, real)
}

/// `__openat64_2`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `__openat64_2`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    let real = || {
        real!(
            "__openat64_2" as unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int,
            dirfd,
            path,
            flags
        )
    };
    if needs_mode(flags) {
        return real() as c_int;
    }
    do_openat(Kind::Openat, dirfd, path, flags, 0, real)
}

// ---- stat family -----------------------------------------------------------------------

type Stat = libc::stat;

fn do_fstatat(
    kind: Kind,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut Stat,
    flags: c_int,
    local: impl FnOnce() -> i64,
) -> c_int {
    let args = [dirfd as u64, path as u64, buf as u64, flags as u64, 0, 0];
    let req = request(libc::SYS_newfstatat, args, Check::Path { path: path as u64 });
    dispatch(kind, if kind == Kind::Fstatat { dirfd } else { -1 }, || 0, Some(req), local) as c_int
}

fn do_fstat(fd: c_int, buf: *mut Stat, local: impl FnOnce() -> i64) -> c_int {
    let args = [fd as u64, buf as u64, 0, 0, 0, 0];
    dispatch(Kind::Fstat, fd, || 0, Some(request(libc::SYS_fstat, args, Check::Nothing)), local) as c_int
}

type StatFn = unsafe extern "C" fn(*const c_char, *mut Stat) -> c_int;
type XstatFn = unsafe extern "C" fn(c_int, *const c_char, *mut Stat) -> c_int;

/// `stat`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `stat`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn stat(path: *const c_char, buf: *mut Stat) -> c_int {
    do_fstatat(Kind::Stat, libc::AT_FDCWD, path, buf, 0, || real!("stat" as StatFn, path, buf))
}

/// `stat64`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `stat64`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn stat64(path: *const c_char, buf: *mut Stat) -> c_int {
    do_fstatat(Kind::Stat, libc::AT_FDCWD, path, buf, 0, || real!("stat64" as StatFn, path, buf))
}

/// `lstat`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `lstat`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn lstat(path: *const c_char, buf: *mut Stat) -> c_int {
    let nofollow = libc::AT_SYMLINK_NOFOLLOW;
    do_fstatat(Kind::Lstat, libc::AT_FDCWD, path, buf, nofollow, || real!("lstat" as StatFn, path, buf))
}

/// `lstat64`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `lstat64`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn lstat64(path: *const c_char, buf: *mut Stat) -> c_int {
    let nofollow = libc::AT_SYMLINK_NOFOLLOW;
    do_fstatat(Kind::Lstat, libc::AT_FDCWD, path, buf, nofollow, || real!("lstat64" as StatFn, path, buf))
}

/// `fstat`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `fstat`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn fstat(fd: c_int, buf: *mut Stat) -> c_int {
    do_fstat(fd, buf, || real!("fstat" as unsafe extern "C" fn(c_int, *mut Stat) -> c_int, fd, buf))
}

/// `fstat64`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `fstat64`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn fstat64(fd: c_int, buf: *mut Stat) -> c_int {
    do_fstat(fd, buf, || real!("fstat64" as unsafe extern "C" fn(c_int, *mut Stat) -> c_int, fd, buf))
}

type FstatatFn = unsafe extern "C" fn(c_int, *const c_char, *mut Stat, c_int) -> c_int;

/// `fstatat`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `fstatat`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn fstatat(dirfd: c_int, path: *const c_char, buf: *mut Stat, flags: c_int) -> c_int {
    do_fstatat(Kind::Fstatat, dirfd, path, buf, flags, || {
        real!("fstatat" as FstatatFn, dirfd, path, buf, flags)
    })
}

/// `fstatat64`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `fstatat64`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn fstatat64(dirfd: c_int, path: *const c_char, buf: *mut Stat, flags: c_int) -> c_int {
    do_fstatat(Kind::Fstatat, dirfd, path, buf, flags, || {
        real!("fstatat64" as FstatatFn, dirfd, path, buf, flags)
    })
}

/// The `struct stat` versions the legacy `__xstat` entry points accept on this ABI
/// (`_STAT_VER_KERNEL`, `_STAT_VER_LINUX`); others get glibc's own EINVAL.
fn known_stat_version(version: c_int) -> bool {
    version == 0 || version == 1
}

/// `__xstat`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `__xstat`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn __xstat(version: c_int, path: *const c_char, buf: *mut Stat) -> c_int {
    let real = || real!("__xstat" as XstatFn, version, path, buf);
    if !known_stat_version(version) {
        return real() as c_int;
    }
    do_fstatat(Kind::Stat, libc::AT_FDCWD, path, buf, 0, real)
}

/// `__xstat64`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `__xstat64`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn __xstat64(version: c_int, path: *const c_char, buf: *mut Stat) -> c_int {
    let real = || real!("__xstat64" as XstatFn, version, path, buf);
    if !known_stat_version(version) {
        return real() as c_int;
    }
    do_fstatat(Kind::Stat, libc::AT_FDCWD, path, buf, 0, real)
}

/// `__lxstat`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `__lxstat`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn __lxstat(version: c_int, path: *const c_char, buf: *mut Stat) -> c_int {
    let real = || real!("__lxstat" as XstatFn, version, path, buf);
    if !known_stat_version(version) {
        return real() as c_int;
    }
    do_fstatat(Kind::Lstat, libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW, real)
}

/// `__lxstat64`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `__lxstat64`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn __lxstat64(version: c_int, path: *const c_char, buf: *mut Stat) -> c_int {
    let real = || real!("__lxstat64" as XstatFn, version, path, buf);
    if !known_stat_version(version) {
        return real() as c_int;
    }
    do_fstatat(Kind::Lstat, libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW, real)
}

type FxstatFn = unsafe extern "C" fn(c_int, c_int, *mut Stat) -> c_int;

/// `__fxstat`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `__fxstat`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn __fxstat(version: c_int, fd: c_int, buf: *mut Stat) -> c_int {
    let real = || real!("__fxstat" as FxstatFn, version, fd, buf);
    if !known_stat_version(version) {
        return real() as c_int;
    }
    do_fstat(fd, buf, real)
}

/// `__fxstat64`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `__fxstat64`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn __fxstat64(version: c_int, fd: c_int, buf: *mut Stat) -> c_int {
    let real = || real!("__fxstat64" as FxstatFn, version, fd, buf);
    if !known_stat_version(version) {
        return real() as c_int;
    }
    do_fstat(fd, buf, real)
}

type FxstatatFn = unsafe extern "C" fn(c_int, c_int, *const c_char, *mut Stat, c_int) -> c_int;

/// `__fxstatat`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `__fxstatat`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn __fxstatat(
    version: c_int,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut Stat,
    flags: c_int,
) -> c_int {
    let real = || real!("__fxstatat" as FxstatatFn, version, dirfd, path, buf, flags);
    if !known_stat_version(version) {
        return real() as c_int;
    }
    do_fstatat(Kind::Fstatat, dirfd, path, buf, flags, real)
}

/// `__fxstatat64`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `__fxstatat64`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn __fxstatat64(
    version: c_int,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut Stat,
    flags: c_int,
) -> c_int {
    let real = || real!("__fxstatat64" as FxstatatFn, version, dirfd, path, buf, flags);
    if !known_stat_version(version) {
        return real() as c_int;
    }
    do_fstatat(Kind::Fstatat, dirfd, path, buf, flags, real)
}

/// `statx`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `statx`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    buf: *mut libc::statx,
) -> c_int {
    let args = [dirfd as u64, path as u64, flags as u64, mask as u64, buf as u64, 0];
    let req = request(libc::SYS_statx, args, Check::Path { path: path as u64 });
    dispatch(
        Kind::Statx,
        dirfd,
        || 0,
        Some(req),
        || {
            real!(
                "statx"
                    as unsafe extern "C" fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int,
                dirfd,
                path,
                flags,
                mask,
                buf
            )
        },
    ) as c_int
}

// ---- fsync / fdatasync -----------------------------------------------------------------

/// `fsync`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `fsync`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    let req = request(libc::SYS_fsync, [fd as u64, 0, 0, 0, 0, 0], Check::Nothing);
    dispatch(Kind::Fsync, fd, || 0, Some(req), || real!("fsync" as unsafe extern "C" fn(c_int) -> c_int, fd))
        as c_int
}

/// `fdatasync`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `fdatasync`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    let req = request(libc::SYS_fdatasync, [fd as u64, 0, 0, 0, 0, 0], Check::Nothing);
    dispatch(
        Kind::Fdatasync,
        fd,
        || 0,
        Some(req),
        || real!("fdatasync" as unsafe extern "C" fn(c_int) -> c_int, fd),
    ) as c_int
}

// ---- sendfile / sockets ----------------------------------------------------------------

type SendfileFn = unsafe extern "C" fn(c_int, c_int, *mut off_t, size_t) -> ssize_t;

fn do_sendfile(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
    local: impl FnOnce() -> i64,
) -> ssize_t {
    let args = [out_fd as u64, in_fd as u64, offset as u64, count as u64, 0, 0];
    let req = signalling(libc::SYS_sendfile, args, Check::Fds(out_fd, in_fd));
    dispatch(Kind::Sendfile, out_fd, || count as u64, Some(req), local) as ssize_t
}

/// `sendfile`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `sendfile`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn sendfile(out_fd: c_int, in_fd: c_int, offset: *mut off_t, count: size_t) -> ssize_t {
    do_sendfile(out_fd, in_fd, offset, count, || {
        real!("sendfile" as SendfileFn, out_fd, in_fd, offset, count)
    })
}

/// `sendfile64`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `sendfile64`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    do_sendfile(out_fd, in_fd, offset, count, || {
        real!("sendfile64" as SendfileFn, out_fd, in_fd, offset, count)
    })
}

/// `sendto`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `sendto`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    addr: *const sockaddr,
    addrlen: socklen_t,
) -> ssize_t {
    let args = [fd as u64, buf as u64, len as u64, flags as u64, addr as u64, addrlen as u64];
    let req = Request {
        nr: libc::SYS_sendto,
        args,
        check: Check::Socket(fd, flags),
        may_signal: flags & libc::MSG_NOSIGNAL == 0,
    };
    dispatch(
        Kind::Sendto,
        fd,
        || len as u64,
        Some(req),
        || {
            real!(
                "sendto"
                    as unsafe extern "C" fn(
                        c_int,
                        *const c_void,
                        size_t,
                        c_int,
                        *const sockaddr,
                        socklen_t,
                    ) -> ssize_t,
                fd,
                buf,
                len,
                flags,
                addr,
                addrlen
            )
        },
    ) as ssize_t
}

/// `recvfrom`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `recvfrom`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> ssize_t {
    let args = [fd as u64, buf as u64, len as u64, flags as u64, addr as u64, addrlen as u64];
    let req = request(libc::SYS_recvfrom, args, Check::Socket(fd, flags));
    dispatch(
        Kind::Recvfrom,
        fd,
        || len as u64,
        Some(req),
        || {
            real!(
                "recvfrom"
                    as unsafe extern "C" fn(
                        c_int,
                        *mut c_void,
                        size_t,
                        c_int,
                        *mut sockaddr,
                        *mut socklen_t,
                    ) -> ssize_t,
                fd,
                buf,
                len,
                flags,
                addr,
                addrlen
            )
        },
    ) as ssize_t
}

// ---- poll / select ---------------------------------------------------------------------

fn do_poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int, local: impl FnOnce() -> i64) -> c_int {
    // Only a poll that cannot wait goes across: a waiting one must stay interruptible by the
    // caller's signals.
    let req = (timeout == 0).then(|| request(libc::SYS_poll, [fds as u64, nfds, 0, 0, 0, 0], Check::Nothing));
    dispatch(Kind::Poll, -1, || 0, req, local) as c_int
}

/// `poll`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `poll`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    do_poll(fds, nfds, timeout, || {
        real!("poll" as unsafe extern "C" fn(*mut pollfd, nfds_t, c_int) -> c_int, fds, nfds, timeout)
    })
}

/// `__poll_chk`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `__poll_chk`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn __poll_chk(fds: *mut pollfd, nfds: nfds_t, timeout: c_int, fdslen: size_t) -> c_int {
    let real = || {
        real!(
            "__poll_chk" as unsafe extern "C" fn(*mut pollfd, nfds_t, c_int, size_t) -> c_int,
            fds,
            nfds,
            timeout,
            fdslen
        )
    };
    if (fdslen / core::mem::size_of::<pollfd>()) < nfds as usize {
        return real() as c_int;
    }
    do_poll(fds, nfds, timeout, real)
}

/// `select`, possibly run on a service thread.
///
/// # Safety
/// The contract of libc's `select`: every pointer valid for the call as libc documents it
/// (a bad one gives EFAULT where the kernel checks it, exactly as without this library).
#[no_mangle]
pub unsafe extern "C" fn select(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut timeval,
) -> c_int {
    // As for poll: only a select with a zero timeout goes across.
    let mut tv = [0u8; core::mem::size_of::<timeval>()];
    let zero_timeout =
        !timeout.is_null() && sys::read_user(timeout as u64, &mut tv) && tv.iter().all(|&b| b == 0);
    let args = [nfds as u64, readfds as u64, writefds as u64, exceptfds as u64, timeout as u64, 0];
    let req = zero_timeout.then(|| request(libc::SYS_select, args, Check::Nothing));
    dispatch(
        Kind::Select,
        -1,
        || 0,
        req,
        || {
            real!(
                "select"
                    as unsafe extern "C" fn(
                        c_int,
                        *mut libc::fd_set,
                        *mut libc::fd_set,
                        *mut libc::fd_set,
                        *mut timeval,
                    ) -> c_int,
                nfds,
                readfds,
                writefds,
                exceptfds,
                timeout
            )
        },
    ) as c_int
}
