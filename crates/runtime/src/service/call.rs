//! Offloadable system calls as values: the call and its arguments (buffers borrowed from the
//! caller), executed by raw system call with a raw result.
//!
//! A [`SysCall`] is `Send`, so it can be handed to a service core and executed there; its
//! result is the kernel's return value or error number, exactly as it would have been on the
//! calling thread (errno travels in the result, never through the thread-local `errno`). The
//! simulator costs the same values through [`SysCall::desc`].

use std::ffi::CStr;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::RawFd;

use corehop_policy::offload::{CallDesc, CallKind};

use crate::sys::{self, Errno};

/// The raw outcome of a system call: its non-negative return value or its error number.
pub type SysResult = Result<isize, Errno>;

/// One system call the papers switch cores on, with its arguments.
///
/// Each variant is the system call of the same name (`man 2 read`, …) and its fields are that
/// call's arguments under the manual's names, buffers as slices (their lengths are the
/// counts); only where the mapping is not one to one does a field say more.
#[allow(missing_docs)] // Variants and fields: the manual pages, as said above.
#[derive(Debug)]
pub enum SysCall<'a> {
    Read {
        fd: RawFd,
        buf: &'a mut [u8],
    },
    Write {
        fd: RawFd,
        buf: &'a [u8],
    },
    Pread {
        fd: RawFd,
        buf: &'a mut [u8],
        offset: i64,
    },
    Pwrite {
        fd: RawFd,
        buf: &'a [u8],
        offset: i64,
    },
    Readv {
        fd: RawFd,
        bufs: &'a mut [IoSliceMut<'a>],
    },
    Writev {
        fd: RawFd,
        bufs: &'a [IoSlice<'a>],
    },
    Open {
        path: &'a CStr,
        flags: i32,
        mode: u32,
    },
    Openat {
        dirfd: RawFd,
        path: &'a CStr,
        flags: i32,
        mode: u32,
    },
    Stat {
        path: &'a CStr,
        out: &'a mut libc::stat,
    },
    Fstat {
        fd: RawFd,
        out: &'a mut libc::stat,
    },
    Lstat {
        path: &'a CStr,
        out: &'a mut libc::stat,
    },
    Newfstatat {
        dirfd: RawFd,
        path: &'a CStr,
        out: &'a mut libc::stat,
        flags: i32,
    },
    Fsync {
        fd: RawFd,
    },
    Fdatasync {
        fd: RawFd,
    },
    /// `offset: None` reads from and advances `in_fd`'s file position.
    Sendfile {
        out_fd: RawFd,
        in_fd: RawFd,
        offset: Option<&'a mut i64>,
        count: usize,
    },
    /// `addr`: the raw bytes of a `sockaddr` (None for a connected socket).
    Sendto {
        fd: RawFd,
        buf: &'a [u8],
        flags: i32,
        addr: Option<&'a [u8]>,
    },
    /// `addr`: where to store the sender's address and its length (in: capacity).
    Recvfrom {
        fd: RawFd,
        buf: &'a mut [u8],
        flags: i32,
        addr: Option<(&'a mut libc::sockaddr_storage, &'a mut libc::socklen_t)>,
    },
    Poll {
        fds: &'a mut [libc::pollfd],
        timeout_ms: i32,
    },
    Select {
        nfds: i32,
        read: Option<&'a mut libc::fd_set>,
        write: Option<&'a mut libc::fd_set>,
        except: Option<&'a mut libc::fd_set>,
        timeout: Option<&'a mut libc::timeval>,
    },
}

fn ptr_mut<T>(r: &mut T) -> usize {
    r as *mut T as usize
}

fn opt_mut<T>(r: &mut Option<&mut T>) -> usize {
    r.as_deref_mut().map_or(0, |p| p as *mut T as usize)
}

impl SysCall<'_> {
    /// The policy's view of this call: kind, descriptor, bytes asked for, and `site`.
    pub fn desc(&self, site: u64) -> CallDesc {
        let (kind, fd, size) = match self {
            SysCall::Read { fd, buf } => (CallKind::Read, *fd, buf.len()),
            SysCall::Write { fd, buf } => (CallKind::Write, *fd, buf.len()),
            SysCall::Pread { fd, buf, .. } => (CallKind::Pread, *fd, buf.len()),
            SysCall::Pwrite { fd, buf, .. } => (CallKind::Pwrite, *fd, buf.len()),
            SysCall::Readv { fd, bufs } => (CallKind::Readv, *fd, bufs.iter().map(|b| b.len()).sum()),
            SysCall::Writev { fd, bufs } => (CallKind::Writev, *fd, bufs.iter().map(|b| b.len()).sum()),
            SysCall::Open { .. } => (CallKind::Open, -1, 0),
            SysCall::Openat { dirfd, .. } => (CallKind::Openat, *dirfd, 0),
            SysCall::Stat { .. } => (CallKind::Stat, -1, 0),
            SysCall::Fstat { fd, .. } => (CallKind::Fstat, *fd, 0),
            SysCall::Lstat { .. } => (CallKind::Lstat, -1, 0),
            SysCall::Newfstatat { dirfd, .. } => (CallKind::Newfstatat, *dirfd, 0),
            SysCall::Fsync { fd } => (CallKind::Fsync, *fd, 0),
            SysCall::Fdatasync { fd } => (CallKind::Fdatasync, *fd, 0),
            SysCall::Sendfile { out_fd, count, .. } => (CallKind::Sendfile, *out_fd, *count),
            SysCall::Sendto { fd, buf, .. } => (CallKind::Sendto, *fd, buf.len()),
            SysCall::Recvfrom { fd, buf, .. } => (CallKind::Recvfrom, *fd, buf.len()),
            SysCall::Poll { fds, .. } => (CallKind::Poll, -1, fds.len()),
            SysCall::Select { nfds, .. } => (CallKind::Select, -1, *nfds as usize),
        };
        CallDesc::new(kind, fd, size as u64, site)
    }

    /// Runs the call on the current thread by raw system call.
    pub fn execute(&mut self) -> SysResult {
        let (nr, args) = self.raw();
        // SAFETY: `raw` builds the arguments from references borrowed for the lifetime of
        // `self`: every pointer is valid and correctly sized and mutable for what the kernel
        // reads or writes (buffer lengths are the slices' lengths, the stat/pollfd/fd_set/
        // timeval/sockaddr out-parameters are exclusive borrows of the right types, the paths
        // are NUL-terminated CStrs). None of these calls affects memory Rust relies on beyond
        // those borrows.
        unsafe { sys::syscall(nr, args) }
    }

    fn raw(&mut self) -> (libc::c_long, [usize; 6]) {
        const CWD: usize = libc::AT_FDCWD as usize;
        let fd = |fd: &RawFd| *fd as isize as usize;
        match self {
            SysCall::Read { fd: f, buf } => {
                (libc::SYS_read, [fd(f), buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0])
            }
            SysCall::Write { fd: f, buf } => {
                (libc::SYS_write, [fd(f), buf.as_ptr() as usize, buf.len(), 0, 0, 0])
            }
            SysCall::Pread { fd: f, buf, offset } => {
                (libc::SYS_pread64, [fd(f), buf.as_mut_ptr() as usize, buf.len(), *offset as usize, 0, 0])
            }
            SysCall::Pwrite { fd: f, buf, offset } => {
                (libc::SYS_pwrite64, [fd(f), buf.as_ptr() as usize, buf.len(), *offset as usize, 0, 0])
            }
            // IoSlice/IoSliceMut are ABI-compatible with struct iovec on Unix.
            SysCall::Readv { fd: f, bufs } => {
                (libc::SYS_readv, [fd(f), bufs.as_mut_ptr() as usize, bufs.len(), 0, 0, 0])
            }
            SysCall::Writev { fd: f, bufs } => {
                (libc::SYS_writev, [fd(f), bufs.as_ptr() as usize, bufs.len(), 0, 0, 0])
            }
            SysCall::Open { path, flags, mode } => {
                (libc::SYS_openat, [CWD, path.as_ptr() as usize, *flags as usize, *mode as usize, 0, 0])
            }
            SysCall::Openat { dirfd, path, flags, mode } => {
                (libc::SYS_openat, [fd(dirfd), path.as_ptr() as usize, *flags as usize, *mode as usize, 0, 0])
            }
            SysCall::Stat { path, out } => {
                (libc::SYS_newfstatat, [CWD, path.as_ptr() as usize, ptr_mut(*out), 0, 0, 0])
            }
            SysCall::Fstat { fd: f, out } => (libc::SYS_fstat, [fd(f), ptr_mut(*out), 0, 0, 0, 0]),
            SysCall::Lstat { path, out } => (
                libc::SYS_newfstatat,
                [CWD, path.as_ptr() as usize, ptr_mut(*out), libc::AT_SYMLINK_NOFOLLOW as usize, 0, 0],
            ),
            SysCall::Newfstatat { dirfd, path, out, flags } => (
                libc::SYS_newfstatat,
                [fd(dirfd), path.as_ptr() as usize, ptr_mut(*out), *flags as usize, 0, 0],
            ),
            SysCall::Fsync { fd: f } => (libc::SYS_fsync, [fd(f), 0, 0, 0, 0, 0]),
            SysCall::Fdatasync { fd: f } => (libc::SYS_fdatasync, [fd(f), 0, 0, 0, 0, 0]),
            SysCall::Sendfile { out_fd, in_fd, offset, count } => {
                (libc::SYS_sendfile, [fd(out_fd), fd(in_fd), opt_mut(offset), *count, 0, 0])
            }
            SysCall::Sendto { fd: f, buf, flags, addr } => {
                let (a, len) = addr.map_or((0, 0), |a| (a.as_ptr() as usize, a.len()));
                (libc::SYS_sendto, [fd(f), buf.as_ptr() as usize, buf.len(), *flags as usize, a, len])
            }
            SysCall::Recvfrom { fd: f, buf, flags, addr } => {
                let (a, len) = addr.as_mut().map_or((0, 0), |(a, l)| (ptr_mut(*a), ptr_mut(*l)));
                (libc::SYS_recvfrom, [fd(f), buf.as_mut_ptr() as usize, buf.len(), *flags as usize, a, len])
            }
            SysCall::Poll { fds, timeout_ms } => poll_raw(fds, *timeout_ms),
            SysCall::Select { nfds, read, write, except, timeout } => {
                select_raw(*nfds, opt_mut(read), opt_mut(write), opt_mut(except), timeout)
            }
        }
    }
}

/// `poll` is `ppoll` with a timespec on architectures without `SYS_poll`.
#[cfg(target_arch = "x86_64")]
fn poll_raw(fds: &mut [libc::pollfd], timeout_ms: i32) -> (libc::c_long, [usize; 6]) {
    (libc::SYS_poll, [fds.as_mut_ptr() as usize, fds.len(), timeout_ms as isize as usize, 0, 0, 0])
}

/// No `SYS_poll` here: the kernel answers ENOSYS (use `Sendto`/`Recvfrom` or a local ppoll).
#[cfg(not(target_arch = "x86_64"))]
fn poll_raw(_fds: &mut [libc::pollfd], _timeout_ms: i32) -> (libc::c_long, [usize; 6]) {
    (-1, [0; 6])
}

#[cfg(target_arch = "x86_64")]
fn select_raw(
    nfds: i32,
    read: usize,
    write: usize,
    except: usize,
    timeout: &mut Option<&mut libc::timeval>,
) -> (libc::c_long, [usize; 6]) {
    // The kernel reads and writes `nfds` bits of each set, up to the size of the descriptor
    // table, but an `fd_set` holds FD_SETSIZE: past it, a negative count, which the kernel
    // refuses with EINVAL before it touches a set.
    let nfds = if (0..=libc::FD_SETSIZE as i32).contains(&nfds) { nfds as isize } else { -1 };
    (libc::SYS_select, [nfds as usize, read, write, except, opt_mut(timeout), 0])
}

/// No `SYS_select` here: the kernel answers ENOSYS.
#[cfg(not(target_arch = "x86_64"))]
fn select_raw(
    _nfds: i32,
    _read: usize,
    _write: usize,
    _except: usize,
    _timeout: &mut Option<&mut libc::timeval>,
) -> (libc::c_long, [usize; 6]) {
    (-1, [0; 6])
}
