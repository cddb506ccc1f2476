//! Raw system calls: the `syscall` instruction with the kernel's raw result.
//!
//! On x86-64 and aarch64 the instruction is issued here; elsewhere through `libc::syscall`,
//! with errno read at once on the same thread. Nothing here calls a libc function that an
//! `LD_PRELOAD` library could interpose.

/// An error number returned by the kernel, carried explicitly (never read from `errno`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    /// The equivalent `std::io::Error`.
    pub fn to_io(self) -> std::io::Error {
        std::io::Error::from_raw_os_error(self.0)
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (errno {})", self.to_io(), self.0)
    }
}

impl std::error::Error for Errno {}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> std::io::Error {
        e.to_io()
    }
}

/// Whether a raw result is an error, i.e. `-errno` (`-4095..=-1`).
#[inline]
pub fn is_err(ret: i64) -> bool {
    (-4095..0).contains(&ret)
}

/// A raw result as `Ok(value)` or `Err(Errno)`.
#[inline]
pub fn check(ret: i64) -> Result<i64, Errno> {
    if is_err(ret) {
        Err(Errno(-ret as i32))
    } else {
        Ok(ret)
    }
}

/// Issues system call `nr` and returns the kernel's raw result (`-4095..=-1` is `-errno`).
///
/// # Safety
/// The arguments must be valid for system call `nr`: pointers must point to memory of the
/// size and mutability the call expects, for as long as the call uses it, and the call must
/// not break invariants Rust relies on (`munmap` of borrowed memory, `exit` of a thread that
/// owns live borrows, `clone` without a new stack).
#[cfg(target_arch = "x86_64")]
#[inline]
pub unsafe fn syscall(nr: i64, a: [u64; 6]) -> i64 {
    let ret: i64;
    // SAFETY: the Linux x86-64 syscall ABI: number in rax, arguments in rdi, rsi, rdx, r10,
    // r8, r9; the kernel clobbers rcx and r11 and returns in rax. Argument validity is the
    // caller's obligation.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") nr => ret,
            in("rdi") a[0], in("rsi") a[1], in("rdx") a[2],
            in("r10") a[3], in("r8") a[4], in("r9") a[5],
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// Issues system call `nr` and returns the kernel's raw result (`-4095..=-1` is `-errno`).
///
/// # Safety
/// As on x86-64: the arguments must be valid for system call `nr`.
#[cfg(target_arch = "aarch64")]
#[inline]
pub unsafe fn syscall(nr: i64, a: [u64; 6]) -> i64 {
    let ret: i64;
    // SAFETY: the Linux aarch64 syscall ABI: number in x8, arguments in x0..x5, result in x0.
    // Argument validity is the caller's obligation.
    unsafe {
        core::arch::asm!(
            "svc 0",
            in("x8") nr,
            inlateout("x0") a[0] as i64 => ret,
            in("x1") a[1], in("x2") a[2], in("x3") a[3], in("x4") a[4], in("x5") a[5],
            options(nostack),
        );
    }
    ret
}

/// Issues system call `nr` and returns the kernel's raw result (`-4095..=-1` is `-errno`).
///
/// # Safety
/// As on x86-64: the arguments must be valid for system call `nr`.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub unsafe fn syscall(nr: i64, a: [u64; 6]) -> i64 {
    // SAFETY: argument validity is the caller's obligation. errno is read right after the
    // call on the same thread.
    let ret = unsafe { libc::syscall(nr as libc::c_long, a[0], a[1], a[2], a[3], a[4], a[5]) };
    if ret == -1 {
        -(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO) as i64)
    } else {
        ret as i64
    }
}

/// The process id (a system call: glibc no longer caches it).
pub fn getpid() -> i32 {
    // SAFETY: getpid takes no arguments and cannot fail.
    unsafe { syscall(libc::SYS_getpid, [0; 6]) as i32 }
}

/// The kernel's id of the calling OS thread.
pub fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { syscall(libc::SYS_gettid, [0; 6]) as i32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_come_back_as_errno_without_touching_errno() {
        // close(-1) fails with EBADF.
        // SAFETY: close takes a plain integer.
        let ret = unsafe { syscall(libc::SYS_close, [u64::MAX, 0, 0, 0, 0, 0]) };
        assert_eq!(check(ret), Err(Errno(libc::EBADF)));
        assert!(is_err(ret));
        assert_eq!(getpid(), std::process::id() as i32);
        assert!(gettid() > 0);
    }
}
