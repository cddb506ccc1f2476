//! Which calls go across: the offload policy, shared by all threads of the process.
//!
//! The policies that keep no state (`never`, `always`, `size`) decide without any lock, so
//! their decisions never depend on what other threads do. The others (`predicted`,
//! `adaptive`) are one value behind a spin lock held for a few hundred nanoseconds. A caller
//! spins for it for a bounded time and otherwise runs the call itself, counted as busy (a
//! result never changes either way). A signal handler that interrupts the holder cannot
//! spin on it: the interposed path does not re-enter itself (`intercept::Inside`).

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use corehop_policy::offload::{CallCost, CallDesc, Decision, Learned, OffloadPolicy};

use corehop_policy::offload::CallKind;

/// One call as the policy sees it.
#[derive(Clone, Copy, Debug)]
pub struct Desc {
    pub kind: CallKind,
    /// The descriptor, or -1 for path calls.
    pub fd: i32,
    /// Bytes asked for; 0 for calls that move no buffer.
    pub size: u64,
    /// The entry point's return address in the program (0: not known).
    pub site: u64,
}

impl Desc {
    /// The policy crate's description.
    fn to_policy(self) -> CallDesc {
        CallDesc::new(self.kind, self.fd, self.size, self.site)
    }
}

/// Length of an epoch for `predicted:…:tuned` and `adaptive` (wall time between feedback
/// reports; an adaptive policy's trials are shorter).
pub const EPOCH_NS: u64 = corehop_sys::watch::FIRST_EPOCH_NS;

/// The policy `corehop run --offload` asks for by default: `adaptive` with its default arms.
pub const DEFAULT_SPEC: &str = corehop_sys::wire::DEFAULT_POLICY;

/// Where the default policy stands before it is built ([`Shared::defer`]): in its first arm,
/// `measured`, with no round sampled and nothing moved, as it stands when built.
pub const UNBUILT: Standing<'static> =
    Standing { settled: "measured", rounds: 0, switches: 0, taken_back: 0, regret_ppm: 0 };

/// Whether `spec` names the default policy.
pub fn is_default(spec: &str) -> bool {
    spec.trim().eq_ignore_ascii_case(DEFAULT_SPEC)
}

/// A call run locally is timed, and shown to the policy, one time in this many at least: two
/// clock reads and the policy's lock on every call would cost more than most calls' own
/// kernel time (docs/performance.md, "preload per-call cost").
const TIME_EVERY_MIN: u32 = 16;

/// ... and one in this many at most: a process whose calls come faster than one per 40 ns
/// still gets a thousand timed calls an epoch.
const TIME_EVERY_MAX: u32 = 1024;

/// What timing one call costs the caller besides the policy's update, which is measured
/// ([`Policy::timed_call_took`]): the library's full path around it and two reads of the vDSO
/// clock. By `callgrind`, that path is about 450 instructions and the default policy's update
/// 2 650, which took about 215 ns here (docs/performance.md, "Fortieth session"). A constant
/// 200 ns for the whole, the thirty-first session's measure, had timing take about 2 % of
/// one-byte reads of /dev/zero by `perf`, four times its budget.
const TIMED_PATH_NS: f64 = 100.0;

/// What the policy's update is taken to cost before one was measured.
const UPDATE_PRIOR_NS: f64 = 200.0;

/// The share of a process's time that timing its calls may take.
const TIMING_BUDGET: f64 = 0.005;

/// How often to time a call when the process completed `calls` intercepted calls in
/// `elapsed_ns`: often enough to learn from (at least one in [`TIME_EVERY_MAX`]), rarely
/// enough that timing costs at most [`TIMING_BUDGET`] of the process's time (a `dd` of 64-byte
/// blocks makes a call every 150 ns; timing one in 16 cost it 4 %).
/// `timed_call_ns` is what timing one call costs.
fn time_every(calls: f64, elapsed_ns: u64, timed_call_ns: f64) -> u32 {
    if elapsed_ns == 0 {
        return TIME_EVERY_MIN;
    }
    let needed = calls * timed_call_ns / (elapsed_ns as f64 * TIMING_BUDGET);
    needed.ceil().clamp(f64::from(TIME_EVERY_MIN), f64::from(TIME_EVERY_MAX)) as u32
}

/// How many times a caller tries the lock of a stateful policy before running its call
/// itself (about 10 µs: far more than the lock is ever held).
const LOCK_SPINS: u32 = 4_000;

/// An offload policy from `corehop_policy` (`never`, `always`, `size[:BYTES]`,
/// `static:CALL,…`, `predicted[:fa|dm|time][:N|tuned]`, `adaptive[:ARM+…]`, N in ns), plus the epoch bookkeeping that
/// feeds a tuned predictor: the feedback is the program's rate of completed intercepted
/// calls, the only progress signal an unmodified program offers.
///
/// `corehop run` asks for the timed predictor (`predicted:time:…`): its table is one vector
/// allocated at start-up, whereas the fully associative form's key index (a hash map)
/// may grow once, and an allocation inside an interposed call can deadlock a program that
/// calls `write` from a signal handler that interrupted `malloc`.
#[derive(Debug)]
pub struct Policy {
    inner: OffloadPolicy,
    epoch_start_ns: u64,
    epoch_calls: u64,
    /// One local call in this many is timed ([`time_every`] of the last epoch).
    time_every: u32,
    /// What the update after a timed local call took lately, in ns (see
    /// [`Policy::timed_call_took`]).
    update_ns: f64,
}

/// How a policy that keeps no state decides, as one word (read without the lock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stateless {
    /// Not stateless: ask the policy under the lock.
    No,
    Never,
    Always,
    /// The 4 KB rule with this threshold.
    Size(u64),
}

impl Stateless {
    fn of(policy: &OffloadPolicy) -> Stateless {
        match policy {
            OffloadPolicy::Never => Stateless::Never,
            OffloadPolicy::Always => Stateless::Always,
            OffloadPolicy::SizeThreshold { bytes } => Stateless::Size(*bytes),
            _ => Stateless::No,
        }
    }

    /// Packs into a word: 0 no, 1 never, 2 always, 3 + bytes for size (bytes saturated).
    fn encode(self) -> u64 {
        match self {
            Stateless::No => 0,
            Stateless::Never => 1,
            Stateless::Always => 2,
            Stateless::Size(bytes) => bytes.saturating_add(3),
        }
    }

    fn decode(word: u64) -> Stateless {
        match word {
            0 => Stateless::No,
            1 => Stateless::Never,
            2 => Stateless::Always,
            n => Stateless::Size(n - 3),
        }
    }
}

use corehop_sys::wire::Standing;

impl Policy {
    pub fn parse(spec: &str) -> Result<Policy, String> {
        let mut inner: OffloadPolicy =
            spec.parse().map_err(|e: corehop_policy::offload::OffloadError| e.to_string())?;
        // While every call stays, the library shows the policy one call in `time_every`.
        inner.shown_a_sample_of_staying_calls();
        Ok(Policy {
            inner,
            epoch_start_ns: 0,
            epoch_calls: 0,
            time_every: TIME_EVERY_MIN,
            update_ns: UPDATE_PRIOR_NS,
        })
    }

    /// Where an adaptive policy stands (`None` for the others).
    pub fn standing(&self) -> Option<Standing<'static>> {
        let OffloadPolicy::Adaptive(a) = &self.inner else { return None };
        let sampler = a.sampler();
        let (rounds, switches) = sampler.rounds();
        // Labels are built without allocating: the arms are parsed from fixed specs.
        let settled = match self.inner.settled() {
            OffloadPolicy::Never => "never",
            OffloadPolicy::Always => "always",
            OffloadPolicy::SizeThreshold { .. } => "size",
            OffloadPolicy::StaticProfile(_) => "static",
            OffloadPolicy::Predicted(_) => "predicted",
            OffloadPolicy::Measured(_) => "measured",
            OffloadPolicy::Adaptive(_) => "adaptive",
        };
        Some(Standing {
            settled,
            rounds,
            switches,
            taken_back: sampler.taken_back(),
            regret_ppm: (sampler.regret_share() * 1e6) as u64,
        })
    }

    /// What the policy's timed predictor learned that holds beyond this process.
    pub fn learned(&self) -> Option<Learned> {
        self.inner.learned()
    }

    /// Starts the policy's timed predictors from what another process learned.
    pub fn start_from(&mut self, learned: &Learned) {
        self.inner.start_from(learned);
    }

    /// Whether no call can ever go across (then no service thread is started).
    pub fn offloads_nothing(&self) -> bool {
        matches!(self.inner, OffloadPolicy::Never)
    }

    /// Whether to offload. The queue delay is taken as 0: each caller waits for its own
    /// call, and a service thread serves callers in turn.
    pub fn decide(&self, call: &Desc) -> bool {
        self.inner.decide(&call.to_policy(), 0) == Decision::Offload
    }

    /// The call cost what `cost` says and finished at `now_ns`; `done` is the number of
    /// intercepted calls the process has completed so far (its progress).
    pub fn observe(&mut self, call: &Desc, cost: CallCost, now_ns: u64, done: u64) {
        self.inner.observe(&call.to_policy(), cost);
        if !self.inner.wants_epochs() {
            return;
        }
        if self.epoch_start_ns == 0 {
            (self.epoch_start_ns, self.epoch_calls) = (now_ns, done);
        }
        let elapsed = now_ns.saturating_sub(self.epoch_start_ns);
        let calls = done.saturating_sub(self.epoch_calls);
        if self.inner.epoch_over(elapsed, calls, EPOCH_NS) {
            self.inner.epoch_end(calls as f64, elapsed);
            self.time_every = time_every(calls as f64, elapsed, TIMED_PATH_NS + self.update_ns);
            (self.epoch_start_ns, self.epoch_calls) = (now_ns, done);
        }
    }

    /// Learns that the update after a timed local call took `ns`: its mean over the last eight
    /// or so, each sample clipped at four times the mean (a vCPU the host preempted in the
    /// middle of one says nothing about the next).
    pub fn timed_call_took(&mut self, ns: u64) {
        let sample = (ns as f64).min(4.0 * self.update_ns);
        self.update_ns += (sample - self.update_ns) / 8.0;
    }

    /// Whether a policy with state keeps every call local now: a timed predictor none of whose
    /// keys runs above its N, or an adaptive policy whose arm now (not a trial) is `never`,
    /// such a predictor, or `measured` while no call key moves and no probe is due.
    fn stays(&self) -> bool {
        self.inner.keeps_all_local()
    }

    /// Whether `observe` is worth the clock reads.
    pub fn learns(&self) -> bool {
        self.inner.learns()
    }

    /// Whether `observe` changes anything: a policy that neither learns nor counts epochs
    /// (`never`, `always`, `size`, a static profile) ignores what it is shown.
    fn observes(&self) -> bool {
        self.inner.learns() || self.inner.wants_epochs()
    }
}

/// The process-wide policy behind a lock, with the stateless ones readable without it.
pub struct Shared {
    locked: AtomicBool,
    /// `Stateless::encode` of the installed policy.
    stateless: AtomicU64,
    /// The policy keeps every call local now (`Policy::stays`): decide without the lock.
    stays: AtomicBool,
    /// `Policy::observes` of the installed policy: otherwise an observation takes no lock.
    observes: AtomicBool,
    /// `Policy::time_every` (read without the lock).
    time_every: AtomicU32,
    policy: UnsafeCell<Option<Policy>>,
}

// SAFETY: `policy` is only touched by the holder of `locked` (acquired with a CAS, released
// with a Release store), or during start-up before any other thread can reach it.
unsafe impl Sync for Shared {}

impl Shared {
    #[allow(clippy::new_without_default)] // used in a static, where Default is not const
    pub const fn new() -> Shared {
        Shared {
            locked: AtomicBool::new(false),
            stateless: AtomicU64::new(0),
            stays: AtomicBool::new(false),
            observes: AtomicBool::new(false),
            time_every: AtomicU32::new(TIME_EVERY_MIN),
            policy: UnsafeCell::new(None),
        }
    }

    /// Whether the policy keeps every call local now (`never`, or an adaptive policy whose arm
    /// moves nothing): read without the lock.
    pub fn keeps_all_local(&self) -> bool {
        match Stateless::decode(self.stateless.load(Ordering::Acquire)) {
            Stateless::Never => true,
            Stateless::No => self.stays.load(Ordering::Relaxed),
            Stateless::Always | Stateless::Size(_) => false,
        }
    }

    /// One local call in this many is timed now (read without the lock).
    pub fn time_every(&self) -> u32 {
        self.time_every.load(Ordering::Relaxed)
    }

    /// Whether to offload `call`: `None` when the policy is stateful and its lock stayed
    /// busy (the caller then runs the call itself), or when no policy is installed.
    pub fn decide(&self, call: &Desc) -> Option<bool> {
        match Stateless::decode(self.stateless.load(Ordering::Acquire)) {
            Stateless::Never => Some(false),
            Stateless::Always => Some(true),
            Stateless::Size(bytes) => {
                let moving = match call.kind {
                    CallKind::Other(_) => false,
                    kind if kind.moves_bytes() => call.size >= bytes,
                    _ => true,
                };
                Some(moving)
            }
            Stateless::No if self.stays.load(Ordering::Relaxed) => Some(false),
            Stateless::No => self.with_spinning(|p| p.decide(call)),
        }
    }

    /// Shows the policy a call that cost `cost` and ended at `now_ns`, `done()` calls into the
    /// process, if its lock is free (a missed observation changes no result). Nothing, not even
    /// `done`, is evaluated for a policy that ignores observations.
    pub fn observe(&self, call: &Desc, cost: CallCost, now_ns: u64, done: impl FnOnce() -> u64) {
        if !self.observes.load(Ordering::Relaxed) {
            return;
        }
        self.try_with(|p| {
            p.observe(call, cost, now_ns, done());
            if !cost.moved {
                // `now_ns` is the end of the call: what follows it is what timing it cost.
                p.timed_call_took(crate::sys::now_ns().saturating_sub(now_ns));
            }
            self.stays.store(p.stays(), Ordering::Relaxed);
            self.time_every.store(p.time_every, Ordering::Relaxed);
        });
    }

    /// Runs `f` on the policy, spinning a bounded time for the lock.
    pub fn with_spinning<R>(&self, f: impl FnOnce(&mut Policy) -> R) -> Option<R> {
        for _ in 0..LOCK_SPINS {
            if !self.locked.load(Ordering::Relaxed) {
                return self.try_with(f);
            }
            core::hint::spin_loop();
        }
        None
    }

    /// Runs `f` on the policy if the lock is free and a policy is installed.
    pub fn try_with<R>(&self, f: impl FnOnce(&mut Policy) -> R) -> Option<R> {
        if self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return None;
        }
        // SAFETY: we hold the lock.
        let result = unsafe { (*self.policy.get()).as_mut().map(f) };
        self.locked.store(false, Ordering::Release);
        result
    }

    /// Keeps every call local, without the lock, until a policy is installed.
    pub fn defer(&self) {
        self.stays.store(true, Ordering::Release);
    }

    /// Installs the policy (at start-up, or later after [`Shared::defer`]).
    pub fn install(&self, policy: Policy) {
        while self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            core::hint::spin_loop();
        }
        self.stateless.store(Stateless::of(&policy.inner).encode(), Ordering::Release);
        self.stays.store(policy.stays(), Ordering::Release);
        self.observes.store(policy.observes(), Ordering::Release);
        // SAFETY: we hold the lock.
        unsafe { *self.policy.get() = Some(policy) };
        self.locked.store(false, Ordering::Release);
    }

    /// Before `fork`: takes the lock so the child does not inherit a half-updated policy.
    /// Gives up after `spins` attempts (the forking thread may itself hold it, from a signal
    /// handler); returns whether it got the lock.
    pub fn lock_for_fork(&self, spins: u32) -> bool {
        for _ in 0..spins {
            if self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return true;
            }
            core::hint::spin_loop();
        }
        false
    }

    /// After `fork`, in parent and child: releases what `lock_for_fork` took. In a child whose
    /// parent could not take the lock, the policy is dropped (every call then runs locally):
    /// its state may be half-updated.
    ///
    /// # Safety
    /// `had_lock` says what [`Shared::lock_for_fork`] returned to the thread that forked, and
    /// that thread (or, in the child, its copy) calls this, once; with `in_child`, the process
    /// has this one thread. Otherwise the lock could be released under its holder, or the
    /// policy taken while another thread uses it.
    pub unsafe fn after_fork(&self, had_lock: bool, in_child: bool) {
        if had_lock {
            self.locked.store(false, Ordering::Release);
        } else if in_child {
            // SAFETY: the child has one thread (this function's contract); no one else can hold
            // or take the lock. The old value is leaked, not dropped, as it may be inconsistent.
            unsafe { core::mem::forget((*self.policy.get()).take()) };
            self.stateless.store(Stateless::Never.encode(), Ordering::Release);
            self.stays.store(false, Ordering::Release);
            self.observes.store(false, Ordering::Release);
            self.locked.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(kind: CallKind, size: u64) -> Desc {
        Desc { kind, fd: 3, size, site: 0 }
    }

    #[test]
    fn timing_gets_rarer_as_calls_come_faster_within_its_bounds() {
        let ms = 1_000_000;
        let timed = 200.0;
        // A call every 100 µs (a sqlite3 commit): the fewest-calls bound holds.
        assert_eq!(time_every(200.0, 20 * ms, timed), TIME_EVERY_MIN);
        // A call every 150 ns (dd of 64-byte blocks): timing costs at most its budget.
        let every = time_every(133_333.0, 20 * ms, timed);
        let timing_ns = 133_333.0 / f64::from(every) * timed;
        assert!(every > TIME_EVERY_MIN && timing_ns <= TIMING_BUDGET * (20 * ms) as f64, "{every}");
        // Timing that costs twice as much is twice as rare.
        assert_eq!(time_every(133_333.0, 20 * ms, 2.0 * timed), 2 * every);
        // Faster than any budget: still a thousand timed calls an epoch.
        assert_eq!(time_every(1e9, 20 * ms, timed), TIME_EVERY_MAX);
        assert_eq!(time_every(5.0, 0, timed), TIME_EVERY_MIN);
    }

    #[test]
    fn timing_gets_rarer_as_the_update_it_measured_gets_slower() {
        let run = |update_ns: Option<u64>| {
            let mut policy = Policy::parse(DEFAULT_SPEC).unwrap();
            for i in 0..2_000u64 {
                policy.observe(&call(CallKind::Read, 64), CallCost::local(100), 1 + i * 20_000, i * 10);
                if let Some(ns) = update_ns {
                    policy.timed_call_took(ns);
                }
            }
            policy.time_every
        };
        let (prior, slow) = (run(None), run(Some(2_000)));
        assert!(slow > 3 * prior, "one in {prior} timed at the prior, one in {slow} at 2 µs");
        // A sample the host held up moves the mean by at most half of it.
        let mut policy = Policy::parse(DEFAULT_SPEC).unwrap();
        policy.timed_call_took(50_000_000);
        assert!(policy.update_ns <= 1.5 * UPDATE_PRIOR_NS, "{}", policy.update_ns);
    }

    #[test]
    fn an_epoch_of_fast_calls_makes_timing_rarer() {
        let mut policy = Policy::parse(DEFAULT_SPEC).unwrap();
        assert_eq!(policy.time_every, TIME_EVERY_MIN);
        let local = CallCost::local(100);
        // 2 000 000 calls over two epochs, one observed every 1 000.
        for i in 0..2_000u64 {
            policy.observe(&call(CallKind::Read, 64), local, 1 + i * 20_000, i * 1_000);
        }
        assert!(policy.time_every > 64, "{}", policy.time_every);
    }

    #[test]
    fn policies_decide_as_documented() {
        let size = Policy::parse("size").unwrap();
        assert!(!size.decide(&call(CallKind::Read, 4095)));
        assert!(size.decide(&call(CallKind::Read, 4096)));
        assert!(size.decide(&call(CallKind::Fsync, 0)));
        assert!(size.decide(&call(CallKind::Open, 0)));
        assert!(Policy::parse("size:10").unwrap().decide(&call(CallKind::Write, 10)));
        assert!(Policy::parse("always").unwrap().decide(&call(CallKind::Read, 0)));
        assert!(!Policy::parse("never").unwrap().decide(&call(CallKind::Fsync, 0)));
        assert!(Policy::parse("never").unwrap().offloads_nothing());
        assert!(!Policy::parse("size").unwrap().learns());
    }

    #[test]
    fn predicted_learns_from_observed_runs() {
        let mut p = Policy::parse("predicted:fa:5000").unwrap();
        assert!(p.learns());
        let fsync = call(CallKind::Fsync, 0);
        assert!(!p.decide(&fsync), "nothing learnt yet");
        p.observe(&fsync, CallCost::local(80_000), 1, 1);
        assert!(p.decide(&fsync), "last run 80 us > N = 5 us");
        let small = call(CallKind::Read, 10);
        p.observe(&small, CallCost::local(100), 2, 2);
        assert!(!p.decide(&small));
    }

    #[test]
    fn stateless_policies_decide_without_the_lock() {
        let shared = Shared::new();
        assert_eq!(shared.decide(&call(CallKind::Read, 0)), None, "no policy yet");
        shared.install(Policy::parse("always").unwrap());
        assert!(shared.lock_for_fork(1), "someone holds the lock");
        assert_eq!(shared.decide(&call(CallKind::Read, 0)), Some(true), "always, lock or not");
        // SAFETY: this thread took the lock just above; `shared` is this test's alone.
        unsafe { shared.after_fork(true, false) };
        shared.install(Policy::parse("size:100").unwrap());
        assert_eq!(shared.decide(&call(CallKind::Read, 99)), Some(false));
        assert_eq!(shared.decide(&call(CallKind::Read, 100)), Some(true));
        assert_eq!(shared.decide(&call(CallKind::Fsync, 0)), Some(true));
        shared.install(Policy::parse("predicted:dm:5000").unwrap());
        assert_eq!(shared.decide(&call(CallKind::Read, 0)), Some(false), "stateful, lock free");
        assert!(shared.lock_for_fork(1));
        assert_eq!(shared.decide(&call(CallKind::Read, 0)), None, "stateful, lock held");
        // SAFETY: this thread took the lock just above; `shared` is this test's alone.
        unsafe { shared.after_fork(true, false) };
    }

    #[test]
    fn adaptive_counts_epochs_from_the_calls_done_and_reports_where_it_stands() {
        let mut p = Policy::parse("adaptive").unwrap();
        assert!(p.learns());
        let read = call(CallKind::Read, 10);
        let mut now = 1;
        for done in 1..=20_000u64 {
            now += 2_000; // a call every 2 us: 10 000 calls per 20 ms epoch
            p.observe(&read, CallCost::local(1_000), now, done);
        }
        let standing = p.standing().unwrap();
        // It starts in `measured`, which moves no call it has not measured cheaper moved.
        assert!(["never", "measured"].contains(&standing.settled), "{}", standing.settled);
        if let OffloadPolicy::Measured(m) = p.inner.settled() {
            assert_eq!(m.moving_keys().0, 0, "a probe may be due, but no key moves");
        }
        assert!(Policy::parse("never").unwrap().standing().is_none());
        assert_eq!(Policy::parse(DEFAULT_SPEC).unwrap().standing(), Some(UNBUILT), "as built");
        assert!(is_default(" Adaptive ") && !is_default("adaptive:always"));
    }

    #[test]
    fn bad_specs_are_errors() {
        for spec in ["", "sometimes", "size:big", "always:1", "predicted:xx:yy"] {
            assert!(Policy::parse(spec).is_err(), "{spec}");
        }
    }

    #[test]
    fn try_lock_refuses_while_held_and_fork_handshake_releases() {
        let shared = Shared::new();
        assert_eq!(shared.try_with(|_| ()), None, "no policy yet");
        shared.install(Policy::parse("always").unwrap());
        assert_eq!(shared.try_with(|p| p.decide(&call(CallKind::Read, 0))), Some(true));
        assert!(shared.lock_for_fork(1));
        assert_eq!(shared.try_with(|_| ()), None, "held across fork");
        assert!(!shared.lock_for_fork(3));
        // SAFETY: this thread took the lock just above; `shared` is this test's alone.
        unsafe { shared.after_fork(true, false) };
        assert!(shared.try_with(|_| ()).is_some());
        // A child whose parent could not take the lock drops the policy.
        // SAFETY: `shared` is this test's alone, as a child's policy is its one thread's.
        unsafe { shared.after_fork(false, true) };
        assert_eq!(shared.try_with(|_| ()), None);
    }
}
