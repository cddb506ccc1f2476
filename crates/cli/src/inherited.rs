//! The signal state corehop was started with, which the program it runs must start with too.
//!
//! A program started from a shell inherits the shell's ignored signals and its signal mask.
//! Before `main`, Rust's runtime sets SIGPIPE to be ignored, and `Command` starts a child
//! with SIGPIPE's default action and an empty mask. So with SIGPIPE ignored by the shell
//! (`trap '' PIPE`), `yes | head -1` plain has `yes` report EPIPE and exit 1, while under
//! `corehop run` it died by the signal. The runtime also opens `/dev/null` on any of the
//! descriptors 0, 1 and 2 that is closed, so `cat <&-` read nothing and succeeded where the
//! plain run fails with EBADF. A constructor, which runs before Rust's runtime, records the
//! state; [`keep_for`] puts it back in the child.
//!
//! Our own constructor rather than the `ctor` crate: one function pointer in `.init_array` is
//! all it takes.

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};

/// Whether SIGPIPE was ignored when corehop started.
static PIPE_IGNORED: AtomicBool = AtomicBool::new(false);
/// The signals blocked when corehop started: bit `s - 1` for signal `s` (1 to 64, all Linux has).
static BLOCKED: AtomicU64 = AtomicU64::new(0);
/// Which of the descriptors 0, 1 and 2 were closed when corehop started: bit `fd`.
static CLOSED: AtomicU8 = AtomicU8::new(0);

#[used]
#[link_section = ".init_array"]
static RECORD: extern "C" fn() = record;

extern "C" fn record() {
    PIPE_IGNORED.store(ignored(libc::SIGPIPE), Relaxed);
    // SAFETY: queries only (F_GETFD, a null new mask) into a zeroed out-parameter of the
    // right type; nothing else runs yet (the constructor runs before `main` and any thread).
    unsafe {
        let closed = (0..3).filter(|&fd| libc::fcntl(fd, libc::F_GETFD) == -1);
        CLOSED.store(closed.fold(0, |bits, fd| bits | 1 << fd), Relaxed);
        let mut set: libc::sigset_t = std::mem::zeroed();
        if libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set) == 0 {
            let blocked = (1..=64).filter(|&s| libc::sigismember(&set, s) == 1);
            BLOCKED.store(blocked.fold(0, |bits, s| bits | 1 << (s - 1)), Relaxed);
        }
    }
}

/// Whether `signal` is ignored in this process now, asked of the kernel itself: glibc's
/// `sigaction` refuses its two internal signals (32 and 33).
pub fn ignored(signal: i32) -> bool {
    /// The kernel's `struct sigaction` on x86-64 and aarch64.
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: u64,
        restorer: usize,
        mask: u64,
    }
    let mut old = KernelSigaction { handler: 0, flags: 0, restorer: 0, mask: 0 };
    // SAFETY: a query (no new action) into a value of the kernel's layout, with the size of
    // its 64-bit mask.
    let rc = unsafe {
        libc::syscall(libc::SYS_rt_sigaction, signal, std::ptr::null::<KernelSigaction>(), &mut old, 8usize)
    };
    rc == 0 && old.handler == libc::SIG_IGN
}

/// Makes `command` start its program with the SIGPIPE action, the signal mask and the closed
/// standard descriptors corehop started with; `captured`: its stdout and stderr are pipes of
/// corehop's, to be left open. Only where the state differs from what `Command` gives (a
/// hook makes `Command` fork and exec instead of its faster `posix_spawn`).
pub fn keep_for(command: &mut Command, captured: bool) {
    let closed = CLOSED.load(Relaxed) & if captured { 0b001 } else { 0b111 };
    if PIPE_IGNORED.load(Relaxed) || BLOCKED.load(Relaxed) != 0 || closed != 0 {
        // SAFETY: `restore` makes only async-signal-safe calls and touches no lock or
        // allocation, as a hook between fork and exec must.
        unsafe {
            command.pre_exec(move || restore(closed));
        }
    }
}

/// Puts back, in a child between `fork` and `exec`, the SIGPIPE action and the signal mask
/// corehop started with, and closes the standard descriptors in `closed` (bit `fd`) that the
/// runtime opened on `/dev/null`.
fn restore(closed: u8) -> std::io::Result<()> {
    let blocked = BLOCKED.load(Relaxed);
    // SAFETY: a zeroed sigaction with SIG_IGN and an empty mask, a mask built with
    // sigemptyset/sigaddset, and descriptors 0 to 2: valid arguments to async-signal-safe
    // calls. The descriptors closed are the child's own copies.
    unsafe {
        if PIPE_IGNORED.load(Relaxed) {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = libc::SIG_IGN;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGPIPE, &action, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in (1..=64).filter(|s| blocked & (1 << (s - 1)) != 0) {
            libc::sigaddset(&mut set, signal);
        }
        let rc = libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        for fd in (0..3).filter(|fd| closed & (1 << fd) != 0) {
            libc::close(fd);
        }
    }
    Ok(())
}

/// The signal state and standard descriptors corehop was started with.
#[derive(Clone, Copy, Debug)]
pub struct StartedWith {
    /// Whether SIGPIPE was ignored.
    pub pipe_ignored: bool,
    /// The signals blocked: bit `s - 1` for signal `s`.
    pub blocked: u64,
    /// Which of the descriptors 0, 1 and 2 were closed: bit `fd`.
    pub closed: u8,
}

/// What [`record`] found at corehop's start (for a spawn that sets it up itself).
pub fn started_with() -> StartedWith {
    StartedWith {
        pipe_ignored: PIPE_IGNORED.load(Relaxed),
        blocked: BLOCKED.load(Relaxed),
        closed: CLOSED.load(Relaxed),
    }
}
