//! The service threads: one per service CPU, pinned there, running claimed requests with raw
//! system calls.
//!
//! A service thread blocks every signal but glibc's own (process-directed signals keep going
//! to the program's own threads; glibc's set*id broadcast reaches it, so it keeps the
//! program's credentials) and runs only raw system calls, never an interposed libc function.
//! It does not keep the process alive: when it wakes idle and finds no program thread left
//! (the last one left with `pthread_exit` or a raw `exit`), it ends the process with the main
//! thread's exit status, as glibc would have. Before a
//! call it checks whether the call could block in a way that only a signal to the *calling*
//! thread would end (a pipe or socket read, opening a FIFO), or whether its result depends on
//! the calling thread (`/proc/thread-self`); such calls are refused and the caller runs them
//! itself. Signals a call raises at the thread that made it (SIGPIPE on EPIPE, SIGXFSZ on
//! EFBIG) are taken off the service thread and handed back with the reply.

use core::ffi::c_void;
use core::sync::atomic::Ordering::{Relaxed, SeqCst};
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize};

use crate::lane::{Check, Idle, Lane, Reply, Request};
use crate::{memo, sys};

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
static RUNNING: AtomicUsize = AtomicUsize::new(0);
/// Service threads started by the last [`start`] that have pinned themselves and are about to
/// serve (a futex word: [`start`] waits on it).
static UP: AtomicU32 = AtomicU32::new(0);
/// How long [`start`] waits for its threads to be up: a thread that is not up by then serves
/// its lane when it is (calls withdraw at the stall timeout meanwhile).
const UP_WAIT_NS: u64 = 10_000_000;
/// The service threads (`pthread_t`, 0: none), joinable so [`stop`] can wait for them.
static THREADS: [AtomicU64; MAX_LANES] = [const { AtomicU64::new(0) }; MAX_LANES];
/// The kernel's id of each lane's service thread (0: not started yet), for [`stop`].
static TIDS: [AtomicI32; MAX_LANES] = [const { AtomicI32::new(0) }; MAX_LANES];
/// How long [`stop`] waits for a joined thread to leave the kernel's thread list.
const GONE_WAIT_NS: u64 = 20_000_000;
/// Set by [`stop`]: service threads leave after their current batch.
static STOP: AtomicBool = AtomicBool::new(false);
/// The process the service threads serve (set by [`start`], which runs in it): their own
/// process id, which they pass to the kernel when they read the program's memory.
static SERVICE_PID: AtomicI32 = AtomicI32::new(0);
/// Set by the one service thread that ends the process once the program's threads are gone.
static ENDING: AtomicBool = AtomicBool::new(false);
/// Per lane: the time its service thread spent polling for work, in ns.
pub static POLLED_NS: [AtomicU64; MAX_LANES] = [const { AtomicU64::new(0) }; MAX_LANES];
/// Per lane: the time its service thread spent in the system calls of the safety checks around
/// the calls it ran (what a caller waits for beyond its call's own run, besides the hand-off
/// itself), in ns. Look-ups in memory (a device's file system seen before) are not timed.
pub static CHECKED_NS: [AtomicU64; MAX_LANES] = [const { AtomicU64::new(0) }; MAX_LANES];

/// Starts `config.lanes` service threads and waits (at most `UP_WAIT_NS`) until they are up.
/// Returns false if a thread could not be created (the caller then runs everything locally).
///
/// The wait keeps a new thread's first scheduling and pinning, 100-200 µs here, out of the
/// first moved call's hand-off: a policy that measures what a move costs would otherwise take
/// that one-off for the price of every move (`--policy predicted` floors its N at it, and
/// moved nothing more for the rest of the process).
///
/// # Safety
/// No thread uses the lanes while this runs: it is called once per process, and once more in a
/// child after `fork`, before any caller can reach a lane.
pub unsafe fn start(config: &ServiceConfig) -> bool {
    SPIN_NS.store(config.spin_ns, SeqCst);
    TEST_STALL_NS.store(config.test_stall_ns, SeqCst);
    SERVICE_PID.store(sys::getpid(), SeqCst);
    memo::arm();
    RUNNING.store(0, SeqCst);
    UP.store(0, SeqCst);
    STOP.store(false, SeqCst);
    let lanes = config.lanes.min(MAX_LANES);
    for lane in 0..lanes {
        CPU_OF_LANE[lane].store(config.cpus[lane] as u64, SeqCst);
        // SAFETY: this function's contract: no thread uses the lane, and its service thread
        // starts below.
        unsafe { LANES[lane].reset() };
        let Some(thread) = spawn(lane) else { return false };
        THREADS[lane].store(thread, SeqCst);
        RUNNING.fetch_add(1, SeqCst);
    }
    let deadline = sys::now_ns() + UP_WAIT_NS;
    loop {
        let up = UP.load(SeqCst);
        let now = sys::now_ns();
        if up as usize >= lanes || now >= deadline {
            break;
        }
        corehop_sys::futex::wait(&UP, up, Some(deadline - now));
    }
    true
}

fn spawn(lane: usize) -> Option<u64> {
    // SAFETY: attr is initialised by pthread_attr_init before use and destroyed after;
    // `service_main` matches the start-routine signature and takes the lane index by value.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_attr_init(&mut attr) != 0 {
            return None;
        }
        libc::pthread_attr_setstacksize(&mut attr, 256 * 1024);
        let mut thread: libc::pthread_t = 0;
        let ok = libc::pthread_create(&mut thread, &attr, service_main, lane as *mut c_void) == 0;
        libc::pthread_attr_destroy(&mut attr);
        ok.then_some(thread as u64)
    }
}

/// Stops the service threads and waits until they are gone, so that later set*id broadcasts
/// of glibc no longer include them: once a program thread changed its own capabilities or
/// credentials, the service threads could not follow, and glibc aborts a process whose
/// threads' set*id results differ. Calls made meanwhile withdraw at the stall timeout.
pub fn stop() {
    STOP.store(true, SeqCst);
    for (lane, thread) in THREADS.iter().enumerate() {
        let thread = thread.swap(0, SeqCst);
        if thread != 0 {
            LANES[lane].kick();
            // SAFETY: a joinable thread this module created and nobody else joins (the swap
            // above hands it to one caller).
            unsafe { libc::pthread_join(thread as libc::pthread_t, core::ptr::null_mut()) };
            wait_gone(TIDS[lane].swap(0, SeqCst));
        }
    }
}

/// Waits until the kernel has taken the joined thread `tid` off the process's thread list.
/// `pthread_join` returns when the kernel clears the thread's id word, which it does before
/// that: an `unshare(CLONE_NEWUSER)` or `setns` made at once, which needs a process of one
/// thread, would still count two and fail with EINVAL where it succeeds plainly. Bounded, in
/// case the id were taken again by a new thread of the program meanwhile.
fn wait_gone(tid: i32) {
    if tid <= 0 {
        return;
    }
    let deadline = sys::now_ns() + GONE_WAIT_NS;
    while sys::tgkill_self(tid, 0) == 0 && sys::now_ns() < deadline {
        sys::sleep_ns(2_000);
    }
}

/// In a child after `fork`: the parent's service threads do not exist here.
pub fn forget() {
    // Only what is set is written: see `stats::reset`. The child has one thread.
    THREADS.iter().chain(&CHECKED_NS).chain(&POLLED_NS).for_each(crate::stats::zero);
    if RUNNING.load(SeqCst) != 0 {
        RUNNING.store(0, SeqCst);
    }
}

extern "C" fn service_main(arg: *mut c_void) -> *mut c_void {
    let lane = arg as usize;
    TIDS[lane].store(sys::gettid(), SeqCst);
    sys::block_all_signals();
    if sys::pin_self(CPU_OF_LANE[lane].load(SeqCst) as usize) < 0 {
        PIN_FAILED.store(1, SeqCst);
    }
    // SAFETY: PR_SET_NAME reads a NUL-terminated name of at most 16 bytes; it names only
    // this thread.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"corehop-svc".as_ptr()) };
    UP.fetch_add(1, SeqCst);
    corehop_sys::futex::wake(&UP, u32::MAX);
    // Sleeps end after `IDLE_CHECK_NS` to look whether the program's threads are all gone
    // (they may leave with `pthread_exit` or a raw `exit`, and then only the service threads
    // would keep the process alive).
    let mut idle = Idle::new(SPIN_NS.load(SeqCst));
    let stall_ns = TEST_STALL_NS.load(SeqCst);
    let stall = || {
        if stall_ns > 0 {
            sys::sleep_ns(stall_ns);
        }
    };
    while !STOP.load(SeqCst) {
        LANES[lane].serve_batch(&mut idle, stall, |request| execute(request, &CHECKED_NS[lane]));
        POLLED_NS[lane].store(idle.polled_ns, SeqCst);
        if core::mem::take(&mut idle.timed_out) && main_thread_left() {
            if let Some(status) = program_gone() {
                end_process(status);
            }
        }
    }
    RUNNING.fetch_sub(1, SeqCst);
    core::ptr::null_mut()
}

/// Whether the main thread has left: `/proc/self/exe` no longer resolves once it has (its
/// memory is gone). Asked first because it takes no descriptor: a descriptor taken here,
/// however briefly, could shift the number a program thread's `open` gets meanwhile.
fn main_thread_left() -> bool {
    let mut buf = [0u8; 8];
    // SAFETY: readlinkat writes at most buf.len() bytes into `buf`.
    let ret = unsafe {
        sys::raw(
            libc::SYS_readlinkat,
            [
                libc::AT_FDCWD as u64,
                c"/proc/self/exe".as_ptr() as u64,
                buf.as_mut_ptr() as u64,
                buf.len() as u64,
                0,
                0,
            ],
        )
    };
    ret == -(libc::ENOENT as i64)
}

/// When no thread of the program is left (only service threads live), the exit status the
/// process would have had without them: that of its main thread, which then is a zombie.
/// `None` while a program thread lives, or when `/proc` cannot be read.
fn program_gone() -> Option<i32> {
    let mut buf = [0u8; 1024];
    let n = sys::read_file(c"/proc/self/stat", &mut buf)?;
    let (state, threads, exit_code) = parse_stat(&buf[..n])?;
    // A main thread that has left stays, as a zombie, among the counted threads.
    let live = threads.checked_sub(u64::from(state == b'Z'))?;
    (live <= RUNNING.load(SeqCst) as u64).then_some(((exit_code >> 8) & 0xff) as i32)
}

/// `(state, num_threads, exit_code)` from the text of `/proc/<pid>/stat` (proc(5)).
fn parse_stat(text: &[u8]) -> Option<(u8, u64, u64)> {
    let close = text.iter().rposition(|&b| b == b')')?;
    let rest = core::str::from_utf8(&text[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    // After the command: field 3 is the state, 20 the thread count, 52 the exit code.
    let state = *fields.next()?.as_bytes().first()?;
    let threads = fields.nth(16)?.parse().ok()?;
    let exit_code = fields.nth(31).and_then(|f| f.parse().ok()).unwrap_or(0);
    Some((state, threads, exit_code))
}

/// Ends the process as glibc does when the last thread of a program leaves: `exit`, so the
/// program's `atexit` handlers and this library's summary run.
fn end_process(status: i32) -> ! {
    if ENDING.swap(true, SeqCst) {
        loop {
            sys::sleep_ns(1_000_000_000); // another service thread is ending the process
        }
    }
    // SAFETY: exit runs the atexit handlers and ends the process; no program thread is left
    // to race with them.
    unsafe { libc::exit(status) }
}

/// Runs one request on the calling (service) thread, or refuses it (module docs). The time
/// its safety checks took is added to `checked_ns` (this thread is its only writer); the clock
/// is read for them only around checks that make a system call.
pub fn execute(request: &Request, checked_ns: &AtomicU64) -> Reply {
    let checked = |ns: u64| checked_ns.store(checked_ns.load(Relaxed).wrapping_add(ns), Relaxed);
    // Before the checks too: they read the program's paths as the call will.
    sys::set_pkru(request.pkru);
    let checks_first = checks_before(request.check);
    let before = if checks_first { sys::now_ns() } else { 0 };
    if checks_first && must_stay_with_caller(request, || SERVICE_PID.load(Relaxed)) {
        checked(sys::now_ns().saturating_sub(before));
        return Reply { refused: true, ..Reply::default() };
    }
    let start = sys::now_ns();
    if checks_first {
        checked(start.saturating_sub(before));
    }
    // SAFETY: the request carries the program's own arguments for this call, which it passed
    // to libc expecting this very system call; the caller keeps its memory alive while the
    // request is CLAIMED (lane protocol). Bad pointers give EFAULT, as they would locally.
    let ret = unsafe { sys::raw(request.nr, request.args) };
    let run_ns = sys::now_ns().saturating_sub(start);
    if ret == 0 && is_stat(request.nr) && stat_names_proc(request, checked) {
        // A stat that reached /proc by another name (a symlink, a /proc descriptor) may have
        // described this thread; the caller asks again itself. A stat changes nothing.
        return Reply { refused: true, ..Reply::default() };
    }
    let signal = if request.may_signal && (ret == -(libc::EPIPE as i64) || ret == -(libc::EFBIG as i64)) {
        sys::take_write_signal()
    } else {
        0
    };
    Reply { ret, refused: false, signal, run_ns }
}

/// Whether [`execute`] would refuse `check`'s call before running it. Asked by a caller before
/// any service thread runs: a call that must stay anyway then starts none.
pub(crate) fn refuses(request: &Request) -> bool {
    checks_before(request.check) && must_stay_with_caller(request, sys::getpid)
}

/// Whether [`must_stay_with_caller`] has anything to ask the kernel. An O_CREAT|O_EXCL open
/// never opens an existing file (no FIFO or device to wait for): it creates a regular file or
/// fails (EEXIST, ENOENT, EACCES on /proc alike for every thread), and a stat first would walk
/// the same path. Not with O_PATH, which drops both flags and opens what exists.
fn checks_before(check: Check) -> bool {
    const CREATES: i32 = libc::O_CREAT | libc::O_EXCL;
    match check {
        Check::Nothing => false,
        Check::Open { flags, .. } => flags & (CREATES | libc::O_PATH) != CREATES,
        Check::Positioned(fd) => memo::positioned(fd) != memo::Positioned::Safe,
        _ => true,
    }
}

/// Whether the call must run on the calling thread: it could block until a signal to the
/// caller interrupts it, or its meaning depends on the calling thread. `pid`: this process's,
/// asked only by a call whose arguments are read.
fn must_stay_with_caller(request: &Request, pid: impl FnOnce() -> i32) -> bool {
    match request.check {
        Check::Nothing => false,
        Check::Fd(fd) => fd_may_block(fd),
        Check::Positioned(fd) => positioned_may_block(fd),
        Check::Fds(a, b) => fd_may_block(a) || fd_may_block(b),
        Check::Socket(fd, flags) => flags & libc::MSG_DONTWAIT == 0 && fd_may_block(fd),
        Check::Open { dirfd, path, flags } => open_stays(dirfd, path, flags),
        Check::Watched => watches_thread_bound(request.nr, &request.args, pid()),
    }
}

/// The most descriptors a moved `poll` or `select` may watch: each is looked at first.
const MAX_WATCHED: usize = 64;

/// Whether a `poll` or `select` (`nr`, with `args`, made in process `pid`) watches an
/// anonymous inode: a signalfd is ready when the thread that polls it has a signal pending
/// (the service thread never has), and an epoll set may hold one. Also when it watches more
/// than [`MAX_WATCHED`] descriptors. Memory that cannot be read says nothing: the call fails
/// with EFAULT alike on either thread.
fn watches_thread_bound(nr: i64, args: &[u64; 6], pid: i32) -> bool {
    let mut fds = [0i32; MAX_WATCHED];
    let mut count = 0;
    if nr == libc::SYS_poll {
        let nfds = args[1] as usize;
        if nfds > MAX_WATCHED {
            return true;
        }
        let mut raw = [0u8; MAX_WATCHED * 8];
        let raw = &mut raw[..nfds * 8];
        if !sys::read_user_of(pid, args[0], raw) {
            return false;
        }
        // A `struct pollfd` is the descriptor, then two shorts.
        for entry in raw.chunks_exact(8) {
            fds[count] = i32::from_ne_bytes([entry[0], entry[1], entry[2], entry[3]]);
            count += 1;
        }
    } else {
        let nfds = (args[0] as i32).max(0) as usize;
        if nfds > libc::FD_SETSIZE {
            return true;
        }
        let bytes = nfds.div_ceil(64) * 8;
        for &set in &args[1..4] {
            let mut raw = [0u8; libc::FD_SETSIZE / 8];
            if set == 0 || !sys::read_user_of(pid, set, &mut raw[..bytes]) {
                continue;
            }
            for fd in (0..nfds).filter(|&fd| raw[fd / 8] & (1 << (fd % 8)) != 0) {
                if count == MAX_WATCHED {
                    return true;
                }
                fds[count] = fd as i32;
                count += 1;
            }
        }
    }
    fds[..count].iter().any(|&fd| fd >= 0 && is_anonymous(fd))
}

/// Whether `fd` is an anonymous inode (a signalfd, eventfd, epoll set, timerfd...): its file
/// type is none of the usual ones.
fn is_anonymous(fd: i32) -> bool {
    sys::fstat(fd).is_some_and(|st| st.st_mode & libc::S_IFMT == 0)
}

/// A descriptor whose calls can wait for another party, or whose answer depends on the
/// thread asking: anything but a regular file, a block device or a directory, unless it is
/// in non-blocking mode; a regular file on a file system whose reads may wait (tracefs
/// `trace_pipe`, `/proc/kmsg`, FUSE); an anonymous inode (a signalfd reads the pending
/// signals of the thread that reads it). A bad descriptor fails at once with EBADF, so it
/// may go across.
pub(crate) fn fd_may_block(fd: i32) -> bool {
    fd_kind(fd) == FdKind::MayBlock
}

/// What [`fd_may_block`] found.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FdKind {
    MayBlock,
    /// Cannot block now: a bad descriptor (EBADF at once), or O_NONBLOCK, which the program
    /// may clear.
    NonBlockingNow,
    /// Cannot block while the descriptor names this file.
    NeverBlocks,
}

fn fd_kind(fd: i32) -> FdKind {
    let Some(st) = sys::fstat(fd) else { return FdKind::NonBlockingNow };
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG if fs::of_dev(st.st_dev, || fs::fd_type(fd)) != fs::Kind::Plain => {
            return FdKind::MayBlock
        }
        libc::S_IFREG | libc::S_IFBLK | libc::S_IFDIR => return FdKind::NeverBlocks,
        0 => return FdKind::MayBlock,
        _ => {}
    }
    // SAFETY: F_GETFL takes no pointer.
    let flags = unsafe { sys::raw(libc::SYS_fcntl, [fd as u64, libc::F_GETFL as u64, 0, 0, 0, 0]) };
    if flags < 0 || flags & libc::O_NONBLOCK as i64 == 0 {
        FdKind::MayBlock
    } else {
        FdKind::NonBlockingNow
    }
}

/// [`fd_may_block`] for a positioned call, asking the kernel only once per opened file.
fn positioned_may_block(fd: i32) -> bool {
    let generation = match memo::positioned(fd) {
        memo::Positioned::Safe => return false,
        memo::Positioned::Unknown(generation) => Some(generation),
        memo::Positioned::Untracked => None,
    };
    let kind = fd_kind(fd);
    if let (FdKind::NeverBlocks, Some(generation)) = (kind, generation) {
        memo::remember_positioned_safe(fd, generation);
    }
    kind == FdKind::MayBlock
}

/// Whether an open must stay with the caller: opening a FIFO or a character device (a
/// terminal, say) may wait in the kernel until a signal; a file on /proc (reached by any name,
/// `/proc/thread-self` among them) may name the calling thread; a file on tracefs, debugfs or
/// FUSE may block its reader.
///
/// The path's text is not looked at: a `thread-self` path that leaves /proc (`root/`, `cwd/`,
/// `fd/N`, `exe`, `ns/*`) names state the program's threads share (an `unshare` or `setns`
/// ends offload, see `intercept::thread_state_changes`), so it resolves alike on both threads.
fn open_stays(dirfd: i32, path: u64, flags: i32) -> bool {
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
    let st = unsafe { st.assume_init() };
    let mode = st.st_mode & libc::S_IFMT;
    if matches!(mode, libc::S_IFIFO | libc::S_IFCHR) && flags & (libc::O_NONBLOCK | libc::O_PATH) == 0 {
        return true;
    }
    fs::of_dev(st.st_dev, || fs::path_type(dirfd, path, follow)) != fs::Kind::Plain
}

/// Whether `nr` is a stat-family call whose result [`stat_names_proc`] looks at.
fn is_stat(nr: i64) -> bool {
    matches!(nr, libc::SYS_newfstatat | libc::SYS_statx)
}

/// Whether a successful stat-family request described a file on /proc (or another file
/// system whose files stay with the caller). A device seen before is looked up in memory; the
/// `statfs` for a new one is timed into `checked`.
fn stat_names_proc(request: &Request, checked: impl Fn(u64)) -> bool {
    // The kernel has just written the result there, so it is mapped and writable; the caller
    // waits for the reply and keeps it alive (lane protocol).
    let dev = match request.nr {
        // SAFETY: as above; one struct stat at args[2].
        libc::SYS_newfstatat => {
            unsafe { core::ptr::read_unaligned(request.args[2] as *const libc::stat) }.st_dev
        }
        libc::SYS_statx => {
            // SAFETY: as above; one struct statx at args[4].
            let stx = unsafe { core::ptr::read_unaligned(request.args[4] as *const libc::statx) };
            libc::makedev(stx.stx_dev_major, stx.stx_dev_minor)
        }
        _ => return false,
    };
    let (dirfd, path, follow) = match request.nr {
        libc::SYS_newfstatat => (request.args[0] as i32, request.args[1], request.args[3] as i32),
        _ => (request.args[0] as i32, request.args[1], request.args[2] as i32),
    };
    let f_type = || {
        let start = sys::now_ns();
        let f_type = fs::path_type(dirfd, path, follow & libc::AT_SYMLINK_NOFOLLOW);
        checked(sys::now_ns().saturating_sub(start));
        f_type
    };
    fs::of_dev(dev, f_type) != fs::Kind::Plain
}

/// File systems, told apart by `statfs` once per device and remembered.
mod fs {
    use core::sync::atomic::AtomicU64;
    use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};

    use crate::sys;

    #[derive(Clone, Copy, PartialEq, Debug)]
    pub enum Kind {
        /// Reads and opens never wait for another party nor depend on the calling thread.
        Plain,
        /// /proc (per-thread files), tracefs, debugfs, FUSE (reads that wait).
        Stays,
    }

    const PROC: i64 = 0x9fa0;
    const TRACEFS: i64 = 0x7472_6163;
    const DEBUGFS: i64 = 0x6462_6720;
    const FUSE: i64 = 0x6573_5546;

    fn kind_of(f_type: i64) -> Kind {
        if matches!(f_type, PROC | TRACEFS | DEBUGFS | FUSE) {
            Kind::Stays
        } else {
            Kind::Plain
        }
    }

    /// Remembered devices: `dev + 1` (0: empty) and the kind, in a small open-addressed table.
    const SLOTS: usize = 64;
    static DEVS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
    static KINDS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

    /// The kind of file system on device `dev`; `f_type` asks the kernel (None: it could not
    /// say, then the call goes across as before and nothing is remembered).
    pub fn of_dev(dev: u64, f_type: impl FnOnce() -> Option<i64>) -> Kind {
        let key = dev.wrapping_add(1);
        let start = (dev.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize;
        let mut free = None;
        for i in 0..SLOTS {
            let at = (start + i) % SLOTS;
            match DEVS[at].load(Acquire) {
                k if k == key => return if KINDS[at].load(Acquire) == 1 { Kind::Stays } else { Kind::Plain },
                0 => {
                    free = Some(at);
                    break;
                }
                _ => {}
            }
        }
        let Some(f_type) = f_type() else { return Kind::Plain };
        let kind = kind_of(f_type);
        if let Some(at) = free {
            // Racing threads may both fill a slot; they write the same answer.
            KINDS[at].store(u64::from(kind == Kind::Stays), Release);
            DEVS[at].store(key, Release);
        }
        kind
    }

    pub fn fd_type(fd: i32) -> Option<i64> {
        let mut sfs = core::mem::MaybeUninit::<libc::statfs>::uninit();
        // SAFETY: fstatfs writes one struct statfs.
        let ret = unsafe { sys::raw(libc::SYS_fstatfs, [fd as u64, sfs.as_mut_ptr() as u64, 0, 0, 0, 0]) };
        // SAFETY: on success the kernel filled `sfs`.
        (ret == 0).then(|| unsafe { sfs.assume_init() }.f_type)
    }

    /// The file system type of `path` relative to `dirfd`. `statfs` takes no descriptor (one
    /// taken here could shift the number a program thread's `open` gets meanwhile); a path
    /// relative to a directory descriptor is opened with O_PATH (which neither waits nor
    /// changes anything) and asked with fstatfs.
    pub fn path_type(dirfd: i32, path: u64, nofollow: i32) -> Option<i64> {
        let mut first = [0u8; 1];
        let pid = super::SERVICE_PID.load(Relaxed);
        if dirfd == libc::AT_FDCWD || (sys::read_user_of(pid, path, &mut first) && first[0] == b'/') {
            let mut sfs = core::mem::MaybeUninit::<libc::statfs>::uninit();
            // SAFETY: statfs reads the path (EFAULT if bad) and writes one struct statfs.
            let ret = unsafe { sys::raw(libc::SYS_statfs, [path, sfs.as_mut_ptr() as u64, 0, 0, 0, 0]) };
            // SAFETY: on success the kernel filled `sfs`.
            return (ret == 0).then(|| unsafe { sfs.assume_init() }.f_type);
        }
        let flags = libc::O_PATH | libc::O_CLOEXEC | if nofollow != 0 { libc::O_NOFOLLOW } else { 0 };
        // SAFETY: openat reads the path (EFAULT if bad).
        let fd = unsafe { sys::raw(libc::SYS_openat, [dirfd as u64, path, flags as u64, 0, 0, 0]) };
        if fd < 0 {
            return None;
        }
        let f_type = fd_type(fd as i32);
        // SAFETY: closes the descriptor opened just above.
        unsafe { sys::raw(libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0]) };
        f_type
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_state_threads_and_exit_code_from_proc_stat() {
        let line = b"29229 (a) b) Z 29214 29214 19168 0 -1 4227084 112 0 0 0 0 0 0 0 20 0 2 0 1224480 0 0 \
            18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 768\n";
        assert_eq!(parse_stat(line), Some((b'Z', 2, 768)));
        assert_eq!(parse_stat(b"1 (x) R 0"), None);
    }
}
