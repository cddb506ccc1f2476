//! The interposed path: start-up from the environment, the decision and hand-off of each
//! call ([`dispatch`]), the fork handlers and the summary at exit (crate docs: "A call's path").

use core::cell::Cell;
use core::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::OnceLock;

use crate::config::{self, Config};
use crate::decide::{self, Desc, Policy, Shared};
use crate::lane::{Outcome, Request, Waiting};
use crate::service::{self, ServiceConfig, LANES, MAX_LANES};
use crate::{caught, memo, stats, sys, trace};
use corehop_policy::offload::{CallCost, CallKind};

const UNINIT: u32 = 0;
const INITIALIZING: u32 = 1;
const READY: u32 = 2;
const OFF: u32 = 3;

/// Library start-up state (UNINIT → INITIALIZING → READY or OFF).
static STATE: AtomicU32 = AtomicU32::new(UNINIT);
/// Service threads: not started, starting, running, or failed to start.
static SERVICE: AtomicU32 = AtomicU32::new(UNINIT);
static CONFIG: OnceLock<Config> = OnceLock::new();
static POLICY: Shared = Shared::new();
/// The process whose service threads the lanes belong to (a vfork child differs).
static PID: AtomicI32 = AtomicI32::new(0);
/// Whether this build interposes every libc way to start a process behind the fork handlers'
/// back (`children`: naked trampolines, x86-64 only). Elsewhere every offloaded call checks
/// its pid.
const WATCHES_CHILDREN: bool = cfg!(target_arch = "x86_64");
/// Whether an offloaded call must first check that it is made by process [`PID`].
///
/// A process may run this library's code on memory the lanes' [`PID`] also uses only if it
/// was started by `vfork`, by `clone` or `clone3` with CLONE_VM and without CLONE_THREAD
/// (sharing our memory: its calls would reach *our* service threads and act on our
/// descriptors and working directory), or by a fork that ran no fork handlers (`_Fork`, raw
/// `fork`/`clone`: a copy of our memory with our pid recorded and no service thread behind its
/// lanes, where each call would wait out the stall timeout). Every libc entry point that
/// starts one sets this flag first ([`before_unseen_child`]), so while it is false no such
/// process exists and the pid check, a system call, is skipped. Once set it stays set (but in
/// a fork child, whose memory is its own); the child is created by the system call after the
/// store, so it sees the flag (the kernel's clone orders the two). Not seen:
/// processes started with inline-assembly system calls, or through libc's functions reached
/// without the dynamic linker (`dlsym` on libc's own handle). glibc's `posix_spawn`, `system`
/// and `popen` start their children with an internal clone, and the child calls only
/// libc-internal functions until it execs, so it never reaches this library.
static CHECK_PID: AtomicBool = AtomicBool::new(!WATCHES_CHILDREN);
/// Whether calls run locally are timed (the policy learns, or a summary is wanted).
static TIMING: AtomicBool = AtomicBool::new(false);
/// Set while the default policy waits to be built ([`build_deferred_policy`]).
static DEFERRED: AtomicBool = AtomicBool::new(false);
/// When start-up ended (the library's clock, ns).
static STARTED_NS: AtomicU64 = AtomicU64::new(0);
/// When the process made its first intercepted call, if the start-up stub saw it (0: no stub;
/// see [`handover`]).
static FIRST_CALL_NS: AtomicU64 = AtomicU64::new(0);
/// The thread that made the first intercepted call, and the signals it had blocked then: what
/// [`outside_a_handler`] compares that thread's calls with (0: not known yet).
static FIRST_CALL_TID: AtomicI64 = AtomicI64::new(0);
static FIRST_CALL_BLOCKED: AtomicU64 = AtomicU64::new(0);
/// Set once started up with nothing that counts or records every call (no summary, no
/// trace): while the policy keeps every call local, a call may then pass the library by
/// ([`passes_by`]).
static QUIET: AtomicBool = AtomicBool::new(false);
static SPIN_NS: AtomicU64 = AtomicU64::new(config::DEFAULT_SPIN_NS);
static STALL_TIMEOUT_NS: AtomicU64 = AtomicU64::new(config::DEFAULT_STALL_TIMEOUT_NS);
static LANE_COUNT: AtomicUsize = AtomicUsize::new(1);
/// Hands out per-thread tickets that spread threads over lanes and slots.
static NEXT_TICKET: AtomicU32 = AtomicU32::new(1);
static FORK_HAD_LOCK: AtomicBool = AtomicBool::new(false);
/// Set once the policy's predictor started from what the run's processes before this one
/// learned ([`start_from_the_run`]), for the summary.
static INHERITED: AtomicBool = AtomicBool::new(false);
/// Set for good once a thread may have made itself differ from the service threads in what
/// the kernel checks (see [`thread_state_changes`]), or the process may have a memory limit
/// ([`memory_limit_comes`]): from then on every call runs locally.
static OUT_FOR_GOOD: AtomicBool = AtomicBool::new(false);
/// Set, before the first service thread would start, if a sanitizer's runtime is in the
/// process: its interceptors, which the program's calls reach through this library, check
/// each call in the thread that makes it (AddressSanitizer the buffers a call writes,
/// ThreadSanitizer the order of calls on a descriptor), and a call a service thread made
/// would pass them by. No service thread starts, and every call stays.
static SANITIZED: AtomicBool = AtomicBool::new(false);
/// Set once [`at_exit`] has run in this process: it writes once, from whichever end comes first.
static REPORTED: AtomicBool = AtomicBool::new(false);

/// Called before a call that changes security state of the calling thread alone: raw
/// `syscall(SYS_setresuid, ...)` and the other per-thread credential calls, `setfsuid`,
/// `capset`, a per-thread seccomp filter, `PR_SET_NO_NEW_PRIVS`, Landlock, `unshare`,
/// `setns`. The service thread would then run the program's calls with other credentials,
/// filters or namespaces than the caller's, so offload stops for the whole process (a thread
/// the caller starts inherits its state, so per-thread bookkeeping would not be simpler).
/// glibc's own set*id functions change every thread, the service threads included, and need
/// nothing. Not seen: system calls made with inline assembly, and state set up before this
/// library loaded (the service threads inherit that).
pub(crate) fn thread_state_changes() {
    if !OUT_FOR_GOOD.swap(true, SeqCst) && SERVICE.load(SeqCst) == READY && sys::getpid() == PID.load(SeqCst)
    {
        service::stop();
    }
}

/// Called before a call that may leave the process with a finite address-space or data limit
/// (`setrlimit`, `prlimit`, their raw `syscall` forms: `watch::may_limit_memory`), and at the
/// first call of a process that has one. Under such a limit the room is the program's: the
/// library cannot know what its own later allocations would find, and a failed Rust
/// allocation aborts the program (a `cat` at `ulimit -v 3300` did, where it ran plainly). So
/// offload stops for good, as for [`thread_state_changes`], and nothing more is allocated: a
/// library not yet started never starts, the default policy is not built, no service thread
/// starts and no summary is written.
pub(crate) fn memory_limit_comes() {
    let _ = STATE.compare_exchange(UNINIT, OFF, SeqCst, SeqCst);
    thread_state_changes();
}

/// Called before a process starts that the fork handlers will not see (see [`CHECK_PID`]):
/// `vfork`, `clone` and `_Fork`, and raw `syscall(SYS_vfork, ...)` and friends.
pub(crate) fn before_unseen_child() {
    // Start up here, in the parent, if not yet: a child sharing our memory that started the
    // library would record its own pid as ours and start service threads on our thread list.
    ready();
    CHECK_PID.store(true, SeqCst);
}

/// A local call that ran at least this long is asked whether it waited for another party
/// (one `fstat`, small beside such a call) before the policy is shown it.
const WAITED_NS: u64 = 1_000_000;

/// What the library keeps per thread, in one thread-local: in a shared library every
/// thread-local access is a call to `__tls_get_addr`, so a call pays for one, not five.
struct Thread {
    /// Set while this thread is inside the library (re-entry runs locally).
    inside: Cell<bool>,
    /// Calls this thread completed that `DONE` does not count yet.
    uncounted: Cell<u64>,
    /// This thread's ticket (0: none yet).
    ticket: Cell<u32>,
    /// The return address of the entry point this thread is in (0: not known).
    site: Cell<u64>,
    /// The signals this thread blocked at the first call the library looked at (see
    /// [`outside_a_handler`]).
    first_blocked: Cell<Option<u64>>,
    /// The timed call the entry point is making for this thread ([`finish_timed`]).
    timed: Cell<Option<Timed>>,
    /// The last [`Timed::token`] given out.
    last_token: Cell<u32>,
}

/// A timed call that its entry point makes, as [`dispatch`] left it.
#[derive(Clone, Copy)]
struct Timed {
    call: Desc,
    counters: &'static stats::Counters,
    start: u64,
    /// Matches the call's end to its start (a signal handler's call may come in between).
    token: u32,
}

thread_local! {
    static THREAD: Thread = const {
        Thread {
            inside: Cell::new(false),
            uncounted: Cell::new(0),
            ticket: Cell::new(0),
            site: Cell::new(0),
            first_blocked: Cell::new(None),
            timed: Cell::new(None),
            last_token: Cell::new(0),
        }
    };
}

/// Notes the call site of the entry point the thread has just entered: the predictor keys its
/// table by it, and a recorded trace carries it.
pub(crate) fn enter_site(site: usize) {
    THREAD.with(|t| t.site.set(site as u64));
}

/// Marks the thread as inside the library for its lifetime.
struct Inside<'t>(&'t Thread);

impl<'t> Inside<'t> {
    fn enter(thread: &'t Thread) -> Option<Inside<'t>> {
        (!thread.inside.replace(true)).then_some(Inside(thread))
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.inside.set(false);
    }
}

/// Runs `start` the first time for the state word `state` (UNINIT -> INITIALIZING -> READY or
/// OFF), where `stack` says, and says whether it is READY. A caller that finds it
/// INITIALIZING (another thread, or a call made from inside `start` itself) gets false and runs
/// its call locally, never waits.
fn start_once(state: &AtomicU32, start: impl FnOnce() -> bool, stack: Stack) -> bool {
    match state.load(Acquire) {
        READY => true,
        UNINIT => {
            if state.compare_exchange(UNINIT, INITIALIZING, SeqCst, SeqCst).is_err() {
                return false;
            }
            let ok = stack.run(start);
            state.store(if ok { READY } else { OFF }, Release);
            ok
        }
        _ => false,
    }
}

/// Whether the library is configured and offload may happen; starts it up on first use.
#[inline]
fn ready() -> bool {
    STATE.load(Acquire) == READY || start_unless_limited()
}

/// Starts the library up on a stack of its own if no thread has begun to, unless the process has a
/// memory limit ([`memory_limit_comes`]), which is looked at first: before the first
/// allocation, and before a stack of its own is mapped. Whether it is READY. (Loaded by the
/// stub, the library starts in [`handover`], after the stub's own check.)
#[cold]
fn start_unless_limited() -> bool {
    if STATE.load(Acquire) == UNINIT && sys::memory_limited() {
        memory_limit_comes();
        return false;
    }
    start_once(&STATE, start_up, Stack::Own)
}

fn env_bytes(name: &'static str) -> Option<Vec<u8>> {
    // What `corehop run` set, taken out of the program's sight.
    if let Some(value) = crate::hidden::setting(name) {
        return Some(value.to_vec());
    }
    let mut cname = [0u8; 64];
    cname[..name.len()].copy_from_slice(name.as_bytes());
    // secure_getenv: a set-user-ID program started with the library takes no settings (no
    // stats file to write as its owner) from whoever started it.
    // SAFETY: `cname` is NUL-terminated (names are short constants); secure_getenv returns
    // null or a NUL-terminated string owned by the environment, copied out at once.
    unsafe {
        let value = secure_getenv(cname.as_ptr() as *const libc::c_char);
        (!value.is_null()).then(|| core::ffi::CStr::from_ptr(value).to_bytes().to_vec())
    }
}

fn complain(what: &str) {
    let mut line = Vec::with_capacity(what.len() + 64);
    line.extend_from_slice(b"corehop-preload: ");
    line.extend_from_slice(what.as_bytes());
    line.extend_from_slice(b"; system-call offload is off\n");
    sys::write_all(2, &line);
}

fn start_up() -> bool {
    if FIRST_CALL_TID.load(SeqCst) == 0 {
        // Preloaded from the start: this is the first call.
        FIRST_CALL_TID.store(i64::from(sys::gettid()), SeqCst);
        FIRST_CALL_BLOCKED.store(sys::blocked_signals(), SeqCst);
    }
    let config = match config::parse(env_bytes, sys::last_allowed_cpu) {
        Ok(config) => config,
        Err(e) => {
            complain(&e.to_string());
            return false;
        }
    };
    // The default policy moves nothing in its first epoch (its measured arm's first probe
    // waits for 1 % of the calls' time to cover a service thread's start), and most processes
    // of a shell pipeline end inside it: it is built at a call after that epoch, so they do
    // not pay for its tables (docs/performance.md, "Seventeenth session").
    let policy = match config.policy.as_str() {
        spec if decide::is_default(spec) => None,
        spec => match Policy::parse(spec) {
            Ok(policy) => Some(policy),
            Err(e) => {
                complain(&format!("COREHOP_POLICY: {e}"));
                return false;
            }
        },
    };
    let tracing = config.trace_file.is_some() && trace::start();
    let learns = policy.as_ref().is_none_or(Policy::learns);
    TIMING.store(learns || config.stats_file.is_some() || tracing, SeqCst);
    if config.stats_file.is_some() {
        stats::enable();
    }
    SPIN_NS.store(config.spin_ns, SeqCst);
    STALL_TIMEOUT_NS.store(config.stall_timeout_ns, SeqCst);
    LANE_COUNT.store(config.service_cpus.len(), SeqCst);
    match policy {
        Some(mut policy) => {
            start_from_the_run(&config, &mut policy);
            if policy.offloads_nothing() {
                SERVICE.store(OFF, SeqCst);
            }
            POLICY.install(policy);
        }
        None => {
            let first_call = FIRST_CALL_NS.load(SeqCst);
            STARTED_NS.store(if first_call == 0 { sys::now_ns() } else { first_call }, SeqCst);
            POLICY.defer();
            DEFERRED.store(true, SeqCst);
        }
    }
    PID.store(sys::getpid(), SeqCst);
    // `_exit` is often called once, from a signal handler, where a first lookup would take
    // the loader's lock, held maybe by the code the signal interrupted: looked up now.
    sys::REAL_EXIT.get();
    // SAFETY: the three handlers are plain functions that only touch atomics and static state.
    unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork_parent), Some(after_fork_child)) };
    let quiet = config.stats_file.is_none() && config.trace_file.is_none();
    if config.writes_at_exit() {
        // Registered now, after the program's own early `atexit` handlers, so it runs before
        // them (they run in reverse): GNU tools close stderr in theirs.
        // SAFETY: `at_exit` is a plain function that touches static state and makes raw
        // syscalls.
        unsafe { libc::atexit(at_exit) };
    }
    let _ = CONFIG.set(config);
    QUIET.store(quiet, SeqCst);
    true
}

/// Starts the library up on behalf of the start-up stub (`crates/preload-stub`), which loaded it
/// with `dlopen` once the process outlived its first epoch. `first_call_ns` (the library's clock) is when the stub saw the process's first
/// intercepted call: the default policy's first epoch counts from then, as it would have with
/// this library loaded from the start. `child_seen`: the stub saw a call start a process the
/// fork handlers do not see (as [`before_unseen_child`] would have noted). Returns whether
/// offload may happen.
/// `stack`: [`Stack::Callers`] when the stub calls on a stack of its own as big as
/// [`on_a_stack_of_its_own`]'s, where the start-up and the default policy's build run in
/// place (each stack of their own cost a map and an unmap, 20-100 µs of the load here).
pub(crate) fn handover(first_call_ns: u64, child_seen: bool, first_thread: (i64, u64), stack: Stack) -> bool {
    FIRST_CALL_NS.store(first_call_ns, SeqCst);
    FIRST_CALL_TID.store(first_thread.0, SeqCst);
    FIRST_CALL_BLOCKED.store(first_thread.1, SeqCst);
    if child_seen {
        CHECK_PID.store(true, SeqCst);
    }
    // A library loaded by `dlopen` gets its thread-locals on a thread's first access to them,
    // from `malloc`: on the loading thread (not in a handler, see the stub) that is now.
    std::hint::black_box(THREAD.with(|thread| thread as *const Thread));
    // No limit check here: the stub made it before `dlopen`, and has watched every call that
    // could set a limit since.
    if !start_once(&STATE, start_up, stack) {
        return false;
    }
    // The stub loads a process that outlived the first epoch, whose next call would build the
    // default policy: built now, outside any handler (the stub saw to that), on this stack.
    build_deferred_policy_if(stack, || true);
    true
}

/// Whether this call can go straight to libc, before the library looks at it at all: the
/// policy keeps every call local now, nothing counts calls, and (if the policy learns) the
/// call is not one of those it times (one in [`Shared::time_every`]). That is most calls of
/// most programs under the default policy, which moves nothing until moving pays; they then
/// cost a few loads instead of the thread-local lookups and bookkeeping of [`dispatch`]
/// (about 100 ns a call in a `grep` over many small files here). The first call, and every
/// call while something counts them, takes the full path.
#[inline]
pub(crate) fn passes_by() -> bool {
    QUIET.load(Relaxed)
        && POLICY.keeps_all_local()
        && !(TIMING.load(Relaxed) && sys::one_in(POLICY.time_every()))
}

/// Whether `thread` is, as far as can be told, not in a signal handler: a step that allocates
/// waits for a call that is (see `corehop_sys::stub_state::outside_a_handler`). The process's
/// first call's thread is compared with what it blocked at that call, any other thread with
/// what it blocked at the first call the library looked at. Two system calls: only on the way
/// to such a step.
fn outside_a_handler(thread: &Thread) -> bool {
    let blocked = sys::blocked_signals();
    let reference = if i64::from(sys::gettid()) == FIRST_CALL_TID.load(Relaxed) {
        FIRST_CALL_BLOCKED.load(Relaxed)
    } else {
        thread.first_blocked.get().unwrap_or(blocked)
    };
    !corehop_sys::stub_state::blocks_more(blocked, reference)
}

/// Starts the service threads on first need; false if they are not (yet) running (the call
/// then runs where it is). Not from a signal handler: `pthread_create` allocates.
fn service_running(thread: &Thread) -> bool {
    if SERVICE.load(Acquire) == UNINIT && !outside_a_handler(thread) {
        return false;
    }
    start_once(
        &SERVICE,
        || {
            let Some(config) = CONFIG.get() else { return false };
            // Here, where a call is about to move (not in a handler), and only in a process
            // that moves one.
            if sys::sanitizer_loaded() {
                SANITIZED.store(true, SeqCst);
                return false;
            }
            caught::ask_the_kernel();
            let mut cpus = [0; MAX_LANES];
            cpus[..config.service_cpus.len()].copy_from_slice(&config.service_cpus);
            // SAFETY: callers reach a lane only once `service_running` has returned true, which
            // `start_once` says only after this closure returned, and runs it in one thread only.
            // Its state goes back to UNINIT only in a child after `fork`, whose one thread is in
            // `fork`, not in a lane.
            unsafe {
                service::start(&ServiceConfig {
                    cpus,
                    lanes: config.service_cpus.len(),
                    spin_ns: config.spin_ns,
                    test_stall_ns: config.test_stall_ns,
                })
            }
        },
        Stack::Own,
    )
}

extern "C" fn before_fork() {
    FORK_HAD_LOCK.store(POLICY.lock_for_fork(100_000), SeqCst);
}

// The three run in the thread that forks (the child's one thread is its copy), `before_fork`
// first, and glibc holds its atfork lock from the first to the last, so no other fork's run
// between them: `FORK_HAD_LOCK` says whether this thread holds the policy's lock.
extern "C" fn after_fork_parent() {
    // SAFETY: see above; the parent's handler runs once per fork.
    unsafe { POLICY.after_fork(FORK_HAD_LOCK.load(SeqCst), false) };
}

extern "C" fn after_fork_child() {
    // SAFETY: see above; in the child, the process has this one thread.
    unsafe { POLICY.after_fork(FORK_HAD_LOCK.load(SeqCst), true) };
    PID.store(sys::getpid(), SeqCst);
    REPORTED.store(false, SeqCst);
    // The child's one thread is the one that forked, with what it blocked then.
    FIRST_CALL_TID.store(i64::from(sys::gettid()), SeqCst);
    FIRST_CALL_BLOCKED.store(sys::blocked_signals(), SeqCst);
    // This copy of our memory is ours alone: no child of the parent shares it.
    CHECK_PID.store(!WATCHES_CHILDREN, SeqCst);
    stats::reset();
    trace::after_fork_child();
    service::forget();
    // The parent's service threads do not exist here; start our own when first needed.
    if SERVICE.load(SeqCst) != OFF {
        SERVICE.store(UNINIT, SeqCst);
    }
}

/// Builds the default policy once its first epoch has passed (see `start_up`); the calls
/// until then ran locally, as its first arm would have run them.
#[cold]
fn build_deferred_policy(thread: &Thread) {
    // Not from a signal handler: building the policy allocates its tables.
    build_deferred_policy_if(Stack::Own, || outside_a_handler(thread));
}

/// [`build_deferred_policy`] where `allowed` (asked only once the epoch has passed) says the
/// call may allocate, on `stack`.
fn build_deferred_policy_if(stack: Stack, allowed: impl FnOnce() -> bool) {
    // Out for good, no policy is built: under a memory limit its tables could abort the
    // program.
    if !OUT_FOR_GOOD.load(Relaxed)
        && sys::now_ns().saturating_sub(STARTED_NS.load(Relaxed)) >= decide::EPOCH_NS
        && allowed()
        && DEFERRED.compare_exchange(true, false, SeqCst, Relaxed).is_ok()
    {
        install_the_default_policy(stack);
    }
}

/// [`build_deferred_policy`]'s work, in a frame of its own: with it inlined, the 4 KiB frame
/// of the build (in place, where no stack of its own can be had) was taken by every call that
/// came this way, a signal handler's too. On an alternate signal stack of 7 KiB, where a
/// handler's `write` runs plainly, that ran off its end into the heap below it.
#[inline(never)]
fn install_the_default_policy(stack: Stack) {
    let built = stack.run(|| {
        let mut policy = Policy::parse(decide::DEFAULT_SPEC)?;
        if let Some(config) = CONFIG.get() {
            start_from_the_run(config, &mut policy);
        }
        Ok::<_, String>(policy)
    });
    match built {
        Ok(policy) => POLICY.install(policy),
        // Unreachable (a unit test parses it); every call would simply stay local.
        Err(e) => complain(&format!("the default policy: {e}")),
    }
}

/// Starts `policy`'s timed predictors from what the run's processes before this one learned
/// (`COREHOP_LEARNED`, see [`crate::learned`]), if it has any and the run hands on.
fn start_from_the_run(config: &Config, policy: &mut Policy) {
    // Not after a filter of the process's own: it may kill at a call the program never makes.
    if OUT_FOR_GOOD.load(SeqCst) {
        return;
    }
    if let Some(path) = &config.learned_file {
        if let Some(learned) = policy.learned().and_then(|_| crate::learned::read(path)) {
            policy.start_from(&learned);
            INHERITED.store(true, SeqCst);
        }
    }
}

/// Where a step that needs some KiB of stack runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stack {
    /// On a stack of its own ([`on_a_stack_of_its_own`]): the caller's may be small.
    Own,
    /// On the caller's, which is at least as big.
    Callers,
}

impl Stack {
    fn run<R>(self, f: impl FnOnce() -> R) -> R {
        match self {
            Stack::Own => on_a_stack_of_its_own(f),
            Stack::Callers => in_place(f),
        }
    }
}

/// Runs `f` on a fresh stack: the program may call from a coroutine with a few KiB of stack,
/// where building the default policy (about 7 KiB), starting up (2 KiB) or starting a service
/// thread would overflow it (a coroutine with 8 KiB crashed under the default policy). In
/// place if the stack cannot be had.
fn on_a_stack_of_its_own<R>(f: impl FnOnce() -> R) -> R {
    const BYTES: usize = 256 * 1024;
    match corosensei::stack::DefaultStack::new(BYTES) {
        Ok(stack) => corosensei::on_stack(stack, f),
        Err(_) => in_place(f),
    }
}

/// Runs `f` here, in a frame of its own: inlined into [`on_a_stack_of_its_own`], `f`'s frame
/// (4 KiB for the start-up) was taken on the caller's stack however `f` ran.
#[inline(never)]
fn in_place<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// Before `_exit` ends the process without running `atexit` handlers (a forked worker of
/// Python's `multiprocessing`, a child whose `exec` failed): writes what [`at_exit`] would
/// have. Not in a child that shares our memory (`vfork`, a raw `clone`), whose pid is not the
/// one this memory was started in: what it holds is the parent's.
pub(crate) fn before_exit() {
    if CONFIG.get().is_some_and(Config::writes_at_exit) && sys::getpid() == PID.load(SeqCst) {
        at_exit();
    }
}

/// At exit (registered only when a stats, trace or learned file is asked for): hand on what
/// the policy learned, append the trace and this process's summary. Nothing in a process that
/// changed its own security state ([`thread_state_changes`]): a seccomp filter may kill it at
/// a call it never made plainly (its summary and trace are then missing); nor in one that may
/// have a memory limit ([`memory_limit_comes`]), where writing them may allocate.
extern "C" fn at_exit() {
    if STATE.load(Acquire) != READY || OUT_FOR_GOOD.load(SeqCst) || REPORTED.swap(true, SeqCst) {
        return;
    }
    if let Some(path) = CONFIG.get().and_then(|c| c.learned_file.as_deref()) {
        // Some 6 KiB of stack: `exit` may be called from a coroutine's small one.
        on_a_stack_of_its_own(|| {
            if let Some(learned) = POLICY.with_spinning(|p| p.learned()).flatten() {
                crate::learned::write(path, &learned);
            }
        });
    }
    if let Some(path) = CONFIG.get().and_then(|c| c.trace_file.as_deref()) {
        trace::write(path);
    }
    if let Some(path) = CONFIG.get().and_then(|c| c.stats_file.as_deref()) {
        let lanes = if SERVICE.load(SeqCst) == READY { LANE_COUNT.load(SeqCst) } else { 0 };
        let process = corehop_sys::wire::Process {
            pid: sys::getpid(),
            lanes,
            pinned: service::PIN_FAILED.load(SeqCst) == 0,
            polled_ns: service::POLLED_NS.iter().map(|p| p.load(SeqCst)).sum(),
            spun_ns: stats::SPUN_NS.load(SeqCst),
            checked_ns: service::CHECKED_NS.iter().map(|c| c.load(SeqCst)).sum(),
            inherited: INHERITED.load(SeqCst),
            sanitized: SANITIZED.load(SeqCst),
            standing: if DEFERRED.load(SeqCst) {
                Some(decide::UNBUILT)
            } else {
                POLICY.with_spinning(|p| p.standing()).flatten()
            },
        };
        stats::write_summary(path, &process);
    }
}

/// Intercepted calls completed by this process (each thread adds its own in batches): the
/// progress an adaptive policy's epochs are scored by (an unmodified program offers no other).
static DONE: AtomicU64 = AtomicU64::new(0);

/// What [`dispatch`] returns for a call it leaves to libc: the entry point then makes it
/// with the program's registers once the library's frames are gone (see
/// `interpose::exported!`). `TO_LIBC` itself: nothing to do after it, the entry point jumps,
/// and libc returns straight to the program. `TO_LIBC + token` ([`to_libc_token`]): a timed
/// call, after which the entry point calls [`finish_timed`] with the token. No
/// libc-convention result lies in that range.
pub(crate) const TO_LIBC: i64 = i64::MIN;

/// The token of a [`TO_LIBC`] answer (0: untimed), or `None` for a result.
pub(crate) fn to_libc_token(result: i64) -> Option<u32> {
    u32::try_from(result.wrapping_sub(TO_LIBC)).ok()
}

/// A bit of a [`TO_LIBC`] token: the call returns a new descriptor, which [`finish_timed`]
/// tells `memo` about. Timed calls' own tokens stay below it.
pub(crate) const NEW_FD: u32 = 1 << 31;

/// `result` of [`dispatch`] for a call that returns a new descriptor, which `memo` is told
/// of: now, for a call that moved; in [`finish_timed`], for one left to libc. libc's function
/// so runs from the entry point, with no frame of ours under it, as every call left to libc
/// does (an `open` of a FIFO blocks, and may be cancelled there: see
/// [`act_on_a_pending_cancellation`]).
pub(crate) fn new_fd(result: i64) -> i64 {
    match to_libc_token(result) {
        Some(token) => TO_LIBC + i64::from(token | NEW_FD),
        None => {
            memo::reassigned(result as i32);
            result
        }
    }
}

/// A call that stays, timed: libc's function, made by the entry point, which then calls
/// [`finish_timed`]. Out of line: one call in `time_every` comes here, and the others' path
/// stays short.
#[inline(never)]
fn to_libc_timed(thread: &Thread, counters: &'static stats::Counters, call: &Desc) -> i64 {
    let token = ((thread.last_token.get() + 1) % NEW_FD).max(1);
    thread.last_token.set(token);
    thread.timed.set(Some(Timed { call: *call, counters, start: sys::now_ns(), token }));
    TO_LIBC + i64::from(token)
}

/// The end of a call its entry point made (`result`, libc's, passed back unchanged): shows
/// the policy a timed one's cost, and `memo` a new descriptor ([`NEW_FD`]). Touches no errno.
pub(crate) extern "C" fn finish_timed(result: i64, token: u32) -> i64 {
    if token & NEW_FD != 0 {
        // libc's function returns an int: the upper half of the register is not its.
        memo::reassigned(result as i32);
    }
    let token = token & !NEW_FD;
    if token == 0 {
        return result;
    }
    let _ = THREAD.try_with(|thread| {
        let Some(timed) = thread.timed.get().filter(|t| t.token == token) else { return };
        thread.timed.set(None);
        // A call that a signal handler made inside this one's bookkeeping runs plainly.
        if let Some(_inside) = Inside::enter(thread) {
            end_timed(thread, timed.counters, &timed.call, timed.start);
        }
    });
    result
}

/// The interposed path of every call: decide, offload or leave to libc, count.
///
/// `request` is `None` when the call must stay with its caller whatever the policy says. A
/// call that stays is not made here: the result is [`TO_LIBC`] (or `TO_LIBC` and a token),
/// and the entry point makes the call to its own libc function with the program's arguments
/// once the library's frames are gone, so the caller must pass the result on unchanged (or
/// through [`new_fd`]).
pub(crate) fn dispatch(kind: CallKind, fd: i32, size: impl FnOnce() -> u64, request: Option<Request>) -> i64 {
    // The caller's signal mask while a call of its was away (see `sys::hold_signals`), given
    // back once the thread is no longer inside the library: a handler that runs then may leave
    // with `siglongjmp`, and finds nothing of ours to undo.
    let mut held = None;
    // The errno of a moved call that failed, set once the held signals are given back: a
    // handler that runs then (a SIGPIPE the call raised, a SIGCHLD that came meanwhile) runs
    // plainly before libc sets errno, so errno is the call's whatever the handler left in it.
    let mut failed = None;
    let result = THREAD.with(|thread| {
        let Some(_inside) = Inside::enter(thread) else {
            if STATE.load(Acquire) == READY {
                stats::bump(&stats::of(kind).seen);
                stats::bump(&stats::of(kind).busy);
            }
            return TO_LIBC;
        };
        // The call that starts the library up did not come as a sample of `passes_by`.
        let sampled = STATE.load(Acquire) == READY;
        if !ready() {
            return TO_LIBC;
        }
        if thread.first_blocked.get().is_none() {
            thread.first_blocked.set(Some(sys::blocked_signals()));
        }
        if DEFERRED.load(Relaxed) {
            build_deferred_policy(thread);
            if DEFERRED.load(Relaxed) && QUIET.load(Relaxed) {
                // Still waiting, and nothing counts calls: this call came only to look at the
                // clock, and there is no policy to time it for.
                return TO_LIBC;
            }
        }
        let counters = stats::of(kind);
        stats::bump(&counters.seen);
        if OUT_FOR_GOOD.load(Relaxed) || SANITIZED.load(Relaxed) {
            stats::bump(&counters.kept);
            return run_local(thread, counters, &Desc { kind, fd, size: 0, site: 0 });
        }
        let call = Desc { kind, fd, size: size(), site: thread.site.get() };
        if POLICY.keeps_all_local() {
            // Nothing moves now: no need to ask whether this call could (counted as local).
            stats::bump(&counters.local);
            if sampled && QUIET.load(Relaxed) && TIMING.load(Relaxed) {
                // One in `time_every` calls comes here (`passes_by`); it stands for them all.
                thread.uncounted.set(thread.uncounted.get() + u64::from(POLICY.time_every()) - 1);
                return to_libc_timed(thread, counters, &call);
            }
            return run_local(thread, counters, &call);
        }
        let Some(request) =
            request.filter(|r| !r.check.fds().iter().flatten().any(|&fd| memo::may_block(fd)))
        else {
            stats::bump(&counters.kept);
            return run_local(thread, counters, &call);
        };
        match POLICY.decide(&call) {
            Some(true) => {}
            Some(false) => {
                stats::bump(&counters.local);
                return run_local(thread, counters, &call);
            }
            None => {
                stats::bump(&counters.busy);
                return run_local(thread, counters, &call);
            }
        }
        // A child sharing our memory must not reach our service threads (see CHECK_PID).
        if CHECK_PID.load(Relaxed) && sys::getpid() != PID.load(Relaxed) {
            stats::bump(&counters.busy);
            return run_local(thread, counters, &call);
        }
        // A call the service would refuse does not start it: once a process has a second
        // thread, glibc toggles cancellation around each of its calls for good (about 1 % of a
        // one-byte read of /dev/zero here).
        if SERVICE.load(Acquire) == UNINIT && service::refuses(&request) {
            return run_refused(thread, counters, &call, request);
        }
        if !service_running(thread) {
            stats::bump(if SANITIZED.load(Relaxed) { &counters.kept } else { &counters.busy });
            return run_local(thread, counters, &call);
        }
        if thread.ticket.get() == 0 {
            thread.ticket.set(NEXT_TICKET.fetch_add(1, SeqCst));
        }
        let ticket = thread.ticket.get() as usize;
        let lanes = LANE_COUNT.load(SeqCst).max(1);
        let waiting =
            Waiting { spin_ns: SPIN_NS.load(SeqCst), stall_timeout_ns: STALL_TIMEOUT_NS.load(SeqCst) };
        let hold = caught::to_hold();
        let start = sys::now_ns();
        // What giving the mask back after the call will cost: what taking it did.
        let mut release_ns = 0;
        if hold != 0 {
            held = Some(sys::hold_signals(hold));
            release_ns = sys::now_ns().saturating_sub(start);
        }
        let (outcome, slept_after) = LANES[ticket % lanes].call_spun(request, start, ticket / lanes, waiting);
        // Read first: the counters' locked adds below wait for the slot's line to come back.
        let end = sys::now_ns();
        let waited = end.saturating_sub(start) + release_ns;
        // The caller's polling cost: the whole wait if it never slept.
        stats::add(&stats::SPUN_NS, slept_after.unwrap_or(waited));
        match outcome {
            Outcome::Done(reply) if reply.refused => run_refused(thread, counters, &call, request),
            Outcome::Done(reply) => {
                stats::bump(&counters.offloaded);
                stats::add(&counters.service_ns, reply.run_ns);
                stats::add(&counters.wait_ns, waited);
                stats::record_handoff(kind, waited.saturating_sub(reply.run_ns));
                POLICY.observe(&call, CallCost::moved(reply.run_ns, waited), end, || count_done(thread));
                if trace::on() {
                    trace::record(kind, fd, call.size, call.site, reply.run_ns);
                }
                if reply.signal != 0 {
                    sys::tgkill_self(sys::gettid(), reply.signal);
                }
                if sys::is_err(reply.ret) {
                    failed = Some(-reply.ret as i32);
                    -1
                } else {
                    reply.ret
                }
            }
            Outcome::Withdrawn => {
                stats::bump(&counters.withdrawn);
                run_local(thread, counters, &call)
            }
            Outcome::Full => {
                stats::bump(&counters.busy);
                run_local(thread, counters, &call)
            }
        }
    });
    if let Some(mask) = held {
        sys::release_signals(mask);
    }
    if let Some(errno) = failed {
        sys::set_errno(errno);
    }
    result
}

/// Leaves the call to the entry point, to make on the calling thread, timing one call in
/// `time_every` when someone wants to know, picked by [`sys::one_in`].
#[inline]
fn run_local(thread: &Thread, counters: &'static stats::Counters, call: &Desc) -> i64 {
    if !TIMING.load(Relaxed) {
        return TO_LIBC;
    }
    let timed = trace::on() || sys::one_in(POLICY.time_every());
    if !timed {
        thread.uncounted.set(thread.uncounted.get() + 1);
        return TO_LIBC;
    }
    to_libc_timed(thread, counters, call)
}

/// A call the policy chose to move that the service refuses: its descriptors' later calls
/// stay without asking, it counts as kept, and it runs here, timed whenever the policy
/// learns, so that a probe due on its key is taken by it. Untimed, the probe stayed due until
/// the next timed call of the process, and every call until then took the full path.
fn run_refused(thread: &Thread, counters: &'static stats::Counters, call: &Desc, request: Request) -> i64 {
    request.check.fds().iter().flatten().for_each(|&fd| memo::mark(fd));
    stats::bump(&counters.kept);
    if TIMING.load(Relaxed) {
        return to_libc_timed(thread, counters, call);
    }
    run_local(thread, counters, call)
}

/// Shows the policy what a call that ran here from `start` until now cost. Nothing here
/// touches errno: it follows the call.
fn end_timed(thread: &Thread, counters: &stats::Counters, call: &Desc, start: u64) {
    let end = sys::now_ns();
    let run_ns = end.saturating_sub(start);
    stats::add(&counters.local_ns, run_ns);
    stats::bump(&counters.local_timed);
    if run_ns >= WAITED_NS && call.fd >= 0 && service::fd_may_block(call.fd) {
        // It waited for another party (a pipe, socket or terminal): no kernel work a move
        // could take off this CPU, and a call that never moves. Its descriptor's calls now
        // stay without a round trip, and the wait stays out of what the policy weighs (a
        // shell that waits 50 ms for a child would otherwise fund probes, and a service
        // thread's start, from it).
        memo::mark(call.fd);
        thread.uncounted.set(thread.uncounted.get() + 1);
    } else {
        POLICY.observe(call, CallCost::local(run_ns), end, || count_done(thread));
    }
    if trace::on() {
        trace::record(call.kind, call.fd, call.size, call.site, run_ns);
    }
}

/// Adds this thread's completed calls to [`DONE`] and returns the total.
fn count_done(thread: &Thread) -> u64 {
    let mine = thread.uncounted.replace(0) + 1;
    DONE.fetch_add(mine, Relaxed) + mine
}

/// Whether the libc function `name` is a cancellation point: one that acts on a pending
/// `pthread_cancel` at its start, and while it blocks, by unwinding the thread's stack (the
/// stat family, `sendfile`, `statx`, `dup2` are not).
pub(crate) const fn cancellation_point(name: &str) -> bool {
    matches!(
        name.as_bytes(),
        b"read"
            | b"write"
            | b"pread"
            | b"pread64"
            | b"pwrite"
            | b"pwrite64"
            | b"readv"
            | b"writev"
            | b"open"
            | b"open64"
            | b"openat"
            | b"openat64"
            | b"__open_2"
            | b"__open64_2"
            | b"__openat_2"
            | b"__openat64_2"
            | b"fsync"
            | b"fdatasync"
            | b"sendto"
            | b"recvfrom"
            | b"poll"
            | b"select"
            | b"close"
            | b"__read_chk"
            | b"__pread_chk"
            | b"__pread64_chk"
            | b"__poll_chk"
    )
}

/// Acts on a pending cancellation at the start of a call to a cancellation point that the
/// library may make elsewhere (moved, its libc function is not the one that runs), as libc's
/// own wrapper would; unless the thread is inside the library already (a signal handler's
/// call), where the unwinding would cross the frames it interrupted.
///
/// glibc cancels by unwinding with the unwinder it loads (libgcc_s), and this library carries
/// its own copy (`build.rs`), whose state that unwinding never set up: a frame of ours with
/// anything to clean up on the way aborts the process in our personality routine. So this is
/// called only from the entry points' first frame (`route`, `body`), which holds nothing to
/// clean up, and is `extern "C-unwind"`, as is everything between it and libc's functions.
#[inline(always)]
pub(crate) fn act_on_a_pending_cancellation() {
    if THREAD.try_with(|thread| !thread.inside.get()).unwrap_or(false) {
        // SAFETY: pthread_testcancel has no preconditions.
        unsafe { pthread_testcancel() };
    }
}

extern "C-unwind" {
    /// Unwinds the calling thread if a cancellation is pending (see
    /// [`act_on_a_pending_cancellation`]).
    fn pthread_testcancel();
}

extern "C" {
    fn secure_getenv(name: *const libc::c_char) -> *const libc::c_char;
}
