//! The service threads: one per service CPU, pinned there, running claimed requests with raw
//! system calls.
//!
//! A service thread blocks every signal (process-directed signals keep going to the program's
//! own threads) and runs only raw system calls, never an interposed libc function. Before a
//! call it checks whether the call could block in a way that only a signal to the *calling*
//! thread would end (a pipe or socket read, opening a FIFO), or whether its result depends on
//! the calling thread (`/proc/thread-self`); such calls are refused and the caller runs them
//! itself. Signals a call raises at the thread that made it (SIGPIPE on EPIPE, SIGXFSZ on
//! EFBIG) are taken off the service thread and handed back with the reply.

use core::ffi::c_void;
use core::sync::atomic::Ordering::SeqCst;
use core::sync::atomic::{AtomicU32, AtomicU64};

use crate::lane::{Check, Idle, Lane, Reply, Request};
use crate::sys;

pub use crate::lane::MAX_LANES;

/// One lane per possible service thread, in static memory: nothing is allocated per call.
pub static LANES: [Lane; MAX_LANES] = [const { Lane::new() }; MAX_LANES];

/// What each service thread is told at start.
pub struct ServiceConfig {
    /// Kernel CPU numbers, one per lane; `lanes` of them are used.
    pub cpus: [usize; MAX_LANES],
    pub lanes: usize,
    /// How long an idle service thread spins before it sleeps on its futex.
    pub spin_ns: u64,
    /// Test-only: sleep this long before claiming each batch (simulates a stalled service CPU).
    pub test_stall_ns: u64,
}

/// `ServiceConfig` as atomics, so the threads read it without locks.
static CPU_OF_LANE: [AtomicU64; MAX_LANES] = [const { AtomicU64::new(0) }; MAX_LANES];
static SPIN_NS: AtomicU64 = AtomicU64::new(0);
static TEST_STALL_NS: AtomicU64 = AtomicU64::new(0);
/// Set when a service thread could not be pinned (reported once at exit).
pub static PIN_FAILED: AtomicU32 = AtomicU32::new(0);
/// Service threads running in this process.
pub(crate) static LIVE: AtomicU64 = AtomicU64::new(0);
/// Per lane: the time its service thread spent polling for work, in ns.
pub static POLLED_NS: [AtomicU64; MAX_LANES] = [const { AtomicU64::new(0) }; MAX_LANES];

/// Starts `config.lanes` service threads. Returns false if a thread could not be created (the
/// caller then runs everything locally).
pub fn start(config: &ServiceConfig) -> bool {
    SPIN_NS.store(config.spin_ns, SeqCst);
    TEST_STALL_NS.store(config.test_stall_ns, SeqCst);
    for lane in 0..config.lanes.min(MAX_LANES) {
        CPU_OF_LANE[lane].store(config.cpus[lane] as u64, SeqCst);
        LANES[lane].reset();
        if !spawn(lane) {
            return false;
        }
    }
    true
}

fn spawn(lane: usize) -> bool {
    // SAFETY: attr is initialised by pthread_attr_init before use and destroyed after;
    // `service_main` matches the start-routine signature and takes the lane index by value.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_attr_init(&mut attr) != 0 {
            return false;
        }
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        libc::pthread_attr_setstacksize(&mut attr, 256 * 1024);
        let mut thread: libc::pthread_t = 0;
        let ok = libc::pthread_create(&mut thread, &attr, service_main, lane as *mut c_void) == 0;
        libc::pthread_attr_destroy(&mut attr);
        ok
    }
}

/// Whether only service threads are left in the process.
fn orphaned() -> bool {
    sys::running_threads().is_some_and(|running| running <= LIVE.load(SeqCst))
}

extern "C" fn service_main(arg: *mut c_void) -> *mut c_void {
    let lane = arg as usize;
    LIVE.fetch_add(1, SeqCst);
    sys::block_all_signals();
    if sys::pin_self(CPU_OF_LANE[lane].load(SeqCst) as usize) < 0 {
        PIN_FAILED.store(1, SeqCst);
    }
    // SAFETY: PR_SET_NAME reads a NUL-terminated name of at most 16 bytes; it names only
    // this thread.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"corehop-svc".as_ptr()) };
    let mut idle = Idle::new(SPIN_NS.load(SeqCst));
    let stall_ns = TEST_STALL_NS.load(SeqCst);
    let stall = || {
        if stall_ns > 0 {
            sys::sleep_ns(stall_ns);
        }
    };
    loop {
        LANES[lane].serve_batch(&mut idle, stall, execute);
        POLLED_NS[lane].store(idle.polled_ns, SeqCst);
        if core::mem::take(&mut idle.timed_out) && orphaned() {
            // The program's own threads are gone (its main thread called pthread_exit, or the
            // last one left with SYS_exit): without us the process would have ended. End.
            LIVE.fetch_sub(1, SeqCst);
            sys::exit_thread();
        }
    }
}

/// Runs one request on the calling (service) thread, or refuses it (module docs).
pub fn execute(request: &Request) -> Reply {
    if must_stay_with_caller(request.check) {
        return Reply { refused: true, ..Reply::default() };
    }
    let start = sys::now_ns();
    // SAFETY: the request carries the program's own arguments for this call, which it passed
    // to libc expecting this very system call; the caller keeps its memory alive while the
    // request is CLAIMED (lane protocol). Bad pointers give EFAULT, as they would locally.
    let ret = unsafe { sys::raw(request.nr, request.args) };
    let run_ns = sys::now_ns().saturating_sub(start);
    let signal = if request.may_signal && (ret == -(libc::EPIPE as i64) || ret == -(libc::EFBIG as i64)) {
        sys::take_write_signal()
    } else {
        0
    };
    Reply { ret, refused: false, signal, run_ns }
}

/// Whether the call must run on the calling thread: it could block until a signal to the
/// caller interrupts it, or its meaning depends on the calling thread.
fn must_stay_with_caller(check: Check) -> bool {
    match check {
        Check::Nothing => false,
        Check::Fd(fd) => fd_may_block(fd),
        Check::Fds(a, b) => fd_may_block(a) || fd_may_block(b),
        Check::Socket(fd, flags) => flags & libc::MSG_DONTWAIT == 0 && fd_may_block(fd),
        Check::Path { path } => names_thread_self(path),
        Check::Open { dirfd, path, flags } => names_thread_self(path) || open_may_block(dirfd, path, flags),
    }
}

/// A descriptor whose reads or writes can wait for another party: anything but a regular
/// file, a block device or a directory, unless it is in non-blocking mode. A bad descriptor
/// fails at once with EBADF, so it may go across.
fn fd_may_block(fd: i32) -> bool {
    let mut st = core::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one struct stat into `st`.
    let ret = unsafe { sys::raw(libc::SYS_fstat, [fd as u64, st.as_mut_ptr() as u64, 0, 0, 0, 0]) };
    if ret < 0 {
        return false;
    }
    // SAFETY: fstat succeeded, so the kernel filled `st`.
    let mode = unsafe { st.assume_init() }.st_mode & libc::S_IFMT;
    if matches!(mode, libc::S_IFREG | libc::S_IFBLK | libc::S_IFDIR) {
        return false;
    }
    // SAFETY: F_GETFL takes no pointer.
    let flags = unsafe { sys::raw(libc::SYS_fcntl, [fd as u64, libc::F_GETFL as u64, 0, 0, 0, 0]) };
    flags < 0 || flags & libc::O_NONBLOCK as i64 == 0
}

/// Opening a FIFO or a character device (a terminal, say) may wait in the kernel until a
/// signal; everything else opens without waiting for anyone.
fn open_may_block(dirfd: i32, path: u64, flags: i32) -> bool {
    if flags & (libc::O_NONBLOCK | libc::O_PATH) != 0 {
        return false;
    }
    let follow = if flags & libc::O_NOFOLLOW != 0 { libc::AT_SYMLINK_NOFOLLOW } else { 0 };
    let mut st = core::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: newfstatat reads the path (EFAULT if bad) and writes one struct stat.
    let ret = unsafe {
        sys::raw(libc::SYS_newfstatat, [dirfd as u64, path, st.as_mut_ptr() as u64, follow as u64, 0, 0])
    };
    if ret < 0 {
        return false; // the open fails (or creates a regular file) without waiting
    }
    // SAFETY: newfstatat succeeded, so the kernel filled `st`.
    let mode = unsafe { st.assume_init() }.st_mode & libc::S_IFMT;
    matches!(mode, libc::S_IFIFO | libc::S_IFCHR)
}

/// Whether the path starts with `/proc/thread-self`, which names the calling thread. Read
/// through the kernel, so a bad pointer is not a crash here but the call's own EFAULT.
fn names_thread_self(path: u64) -> bool {
    const PREFIX: &[u8] = b"/proc/thread-self";
    let mut buf = [0u8; PREFIX.len()];
    sys::read_user(path, &mut buf) && buf == *PREFIX
}
