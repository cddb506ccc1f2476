//! The hand-off between a calling thread and a service thread: request slots and their states.
//!
//! A [`Lane`] belongs to one service thread and holds [`SLOTS`] request slots plus a bitmap of
//! submitted slots (`pending`, also the service thread's futex word). Each slot moves through
//!
//! ```text
//!            caller                 service               caller
//!   FREE ──CAS──▶ FILLING ──▶ SUBMITTED ──CAS──▶ CLAIMED ──▶ DONE ──▶ FREE
//!                                 │
//!                                 └──CAS (caller, after the stall timeout)──▶ CANCELLED ──▶ FREE
//! ```
//!
//! Ownership of the slot's request and reply follows the state: the caller writes the request
//! only in FILLING; the service thread reads the request and writes the reply only in CLAIMED;
//! the caller reads the reply only in DONE. A request may point into the caller's memory
//! (buffers, paths): the service thread touches it only while CLAIMED, and a caller never
//! leaves a CLAIMED request — it waits until DONE. A caller that finds its request still
//! SUBMITTED after the stall timeout withdraws it with one CAS; whoever wins that CAS against
//! the service thread's claim decides where the call runs, so it runs exactly once.
//!
//! Wake-ups never depend on the order of two *different* atomics (the store-then-load pattern
//! that needs sequential consistency): each sleeper announces itself with a flag bit in the very
//! word it sleeps on, set by a read-modify-write, and each waker changes that word with a
//! read-modify-write that returns the old value, flag included. A caller parks by CAS
//! `state → state|PARKED`; the service thread publishes with `swap(DONE)` and wakes if the old
//! value had PARKED. The service thread sleeps by CAS `pending: 0 → ASLEEP`; a caller submits
//! with `fetch_or(bit)` and wakes it if the old value had ASLEEP. Both words are futex words, so
//! a change between the flag and the sleep makes the sleep return at once. Neither wake-up can
//! be lost (checked under loom, see `loom_tests`).

use core::sync::atomic::Ordering::SeqCst;

use corehop_policy::spin::{SpinBudget, SpinConfig};
use model::{futex_wait, futex_wake, now_ns, AtomicU32, UnsafeCell};

/// The real primitives, or (under `--cfg loom`) loom's, with the futex modelled by a condition
/// variable so that a lost wake-up shows as a deadlock and time standing still.
#[cfg(not(loom))]
mod model {
    pub use crate::sys::{futex_wait, futex_wake, now_ns};
    pub use core::sync::atomic::AtomicU32;

    /// `core::cell::UnsafeCell` with loom's closure API.
    pub struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub const fn new(value: T) -> UnsafeCell<T> {
            UnsafeCell(core::cell::UnsafeCell::new(value))
        }

        pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

#[cfg(loom)]
mod model {
    pub use loom::cell::UnsafeCell;
    pub use loom::sync::atomic::AtomicU32;
    use loom::sync::{Condvar, Mutex};

    loom::lazy_static! {
        static ref FUTEX: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
    }

    /// A futex wait: check and sleep atomically (under the mutex) until a wake. Timeouts are
    /// not modelled: a timed wait sleeps until woken like an untimed one.
    pub fn futex_wait(word: &AtomicU32, expected: u32, _timeout_ns: Option<u64>) -> bool {
        let (lock, wakes) = &*FUTEX;
        let guard = lock.lock().unwrap();
        if word.load(core::sync::atomic::Ordering::SeqCst) == expected {
            drop(wakes.wait(guard).unwrap());
        }
        true
    }

    pub fn futex_wake(_word: &AtomicU32) {
        let (lock, wakes) = &*FUTEX;
        let _guard = lock.lock().unwrap();
        wakes.notify_all();
    }

    pub fn now_ns() -> u64 {
        0
    }
}

/// The most service threads (and lanes) a process gets.
pub const MAX_LANES: usize = 8;

/// Request slots per lane: one bit each in the 32-bit futex word `pending`, whose top bit is
/// `ASLEEP` flag.
pub const SLOTS: usize = 31;
/// In `pending`: the service thread is asleep (or about to sleep) on it.
const ASLEEP: u32 = 1 << 31;
/// In a slot's state: the caller is asleep (or about to sleep) on it.
const PARKED: u32 = 0x100;

const FREE: u32 = 0;
const FILLING: u32 = 1;
const SUBMITTED: u32 = 2;
const CLAIMED: u32 = 3;
const DONE: u32 = 4;
const CANCELLED: u32 = 5;

/// What the service thread must check before running a call: whether it could block in a way
/// that only a signal to the *calling* thread would end (then it refuses, and the caller runs
/// the call itself, so EINTR and blocking behave exactly as without offload).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// The call cannot block (stat family, poll/select with a zero timeout).
    Nothing,
    /// The call blocks if this descriptor can (pipes, sockets, terminals without O_NONBLOCK).
    Fd(i32),
    /// Either descriptor (sendfile).
    Fds(i32, i32),
    /// A socket call: cannot block with MSG_DONTWAIT in `flags`, else as `Fd`.
    Socket(i32, i32),
    /// A path-based call that cannot block: runs anywhere unless the path names the calling
    /// thread (`/proc/thread-self`).
    Path { path: u64 },
    /// `openat(dirfd, path, flags)`: opening a FIFO or a device may wait for the other side.
    Open { dirfd: i32, path: u64, flags: i32 },
}

impl Check {
    /// The descriptors whose kind decides whether the call could block.
    pub fn fds(self) -> [Option<i32>; 2] {
        match self {
            Check::Socket(_, flags) if flags & libc::MSG_DONTWAIT != 0 => [None, None],
            Check::Fd(fd) | Check::Socket(fd, _) => [Some(fd), None],
            Check::Fds(a, b) => [Some(a), Some(b)],
            Check::Nothing | Check::Path { .. } | Check::Open { .. } => [None, None],
        }
    }
}

/// One system call to run: its number, its raw arguments, and what to check first.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub nr: i64,
    pub args: [u64; 6],
    pub check: Check,
    /// The call may fail with EPIPE/EFBIG and raise SIGPIPE/SIGXFSZ at the thread that made it.
    pub may_signal: bool,
}

/// What came back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reply {
    /// The kernel's raw result (`-errno` on failure). Meaningless if `refused`.
    pub ret: i64,
    /// The service thread did not run the call (it could block); the caller must.
    pub refused: bool,
    /// A signal the call raised at the service thread, to raise again at the caller (0: none).
    pub signal: i32,
    /// How long the call ran on the service thread, in ns.
    pub run_ns: u64,
}

/// Sleeps until the slot leaves `state` (or `timeout_ns` passes).
fn park(slot: &Slot, seen: u32, timeout_ns: Option<u64>) {
    let parked = seen | PARKED;
    if seen == parked || slot.state.compare_exchange(seen, parked, SeqCst, SeqCst).is_ok() {
        futex_wait(&slot.state, parked, timeout_ns);
    }
}

/// SUBMITTED → CLAIMED, keeping a PARKED flag the caller may set meanwhile (it then sleeps
/// until DONE). False if the request is not (or no longer) submitted.
fn claim(slot: &Slot) -> bool {
    let mut state = slot.state.load(SeqCst);
    loop {
        if state & !PARKED != SUBMITTED {
            return false;
        }
        match slot.state.compare_exchange(state, CLAIMED | (state & PARKED), SeqCst, SeqCst) {
            Ok(_) => return true,
            Err(now) => state = now,
        }
    }
}

/// How a submitted call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The service thread handled it (ran it, or refused it).
    Done(Reply),
    /// The service thread did not claim it in time; it was withdrawn and never ran.
    Withdrawn,
    /// Every slot of the lane was in use.
    Full,
}

/// How long a caller spins, and how long it waits for a claim before withdrawing.
#[derive(Clone, Copy, Debug)]
pub struct Waiting {
    pub spin_ns: u64,
    pub stall_timeout_ns: u64,
}

#[repr(align(128))]
struct Slot {
    state: AtomicU32,
    /// The request, and when it was submitted (monotonic ns): the service thread learns from
    /// it how long the caller waited for it to wake up.
    request: UnsafeCell<(Request, u64)>,
    reply: UnsafeCell<Reply>,
}

/// How long an idle service thread sleeps before it looks whether the program still runs.
pub const IDLE_CHECK_NS: u64 = 100_000_000;

/// How an idle service thread waits: it polls for an adaptive budget (`corehop_policy::spin`,
/// fitted to the recent gaps between batches and to the wake-ups it measured), then sleeps. A
/// program that calls often finds it awake; a quiet one does not keep a CPU busy.
pub struct Idle {
    budget: SpinBudget,
    /// The last sleep ended by its timeout, not by a request: a moment to look around (is
    /// the program still there?).
    pub timed_out: bool,
    /// When the thread went idle before its last sleep, until the next batch is claimed.
    slept_at: Option<u64>,
    /// Time spent polling, in ns: the CPU the polling cost.
    pub polled_ns: u64,
}

impl Idle {
    /// A budget that starts from `wake_cost_ns` as its guess of a wake-up's cost (0: never
    /// poll, sleep at once).
    pub fn new(wake_cost_ns: u64) -> Idle {
        let config = if wake_cost_ns == 0 {
            SpinConfig { initial_wake_cost_ns: 0, min_fraction: 0.0, max_factor: 1, ..SpinConfig::default() }
        } else {
            SpinConfig { initial_wake_cost_ns: wake_cost_ns, ..SpinConfig::default() }
        };
        Idle { budget: SpinBudget::new(config), timed_out: false, slept_at: None, polled_ns: 0 }
    }
}

/// The request slots of one service thread.
#[repr(align(128))]
pub struct Lane {
    pending: AtomicU32,
    slots: [Slot; SLOTS],
}

// SAFETY: the UnsafeCells of each slot are accessed only by the party that owns the slot in
// its current state (module docs), and states change only through atomics.
unsafe impl Sync for Lane {}

const EMPTY_REQUEST: Request = Request { nr: 0, args: [0; 6], check: Check::Nothing, may_signal: false };
const EMPTY_REPLY: Reply = Reply { ret: 0, refused: false, signal: 0, run_ns: 0 };

impl Lane {
    #[cfg(not(loom))]
    #[allow(clippy::new_without_default)] // used in statics, where Default is not const
    pub const fn new() -> Lane {
        #[allow(clippy::declare_interior_mutable_const)] // copied into each slot, never shared
        const SLOT: Slot = Slot {
            state: AtomicU32::new(FREE),
            request: UnsafeCell::new((EMPTY_REQUEST, 0)),
            reply: UnsafeCell::new(EMPTY_REPLY),
        };
        Lane { pending: AtomicU32::new(0), slots: [SLOT; SLOTS] }
    }

    #[cfg(loom)]
    #[allow(clippy::new_without_default)]
    pub fn new() -> Lane {
        let slot = || Slot {
            state: AtomicU32::new(FREE),
            request: UnsafeCell::new((EMPTY_REQUEST, 0)),
            reply: UnsafeCell::new(EMPTY_REPLY),
        };
        Lane { pending: AtomicU32::new(0), slots: core::array::from_fn(|_| slot()) }
    }

    /// Wakes the service thread without a request (its next batch finds nothing to claim).
    pub fn kick(&self) {
        if self.pending.fetch_or(1 << (SLOTS - 1), SeqCst) & ASLEEP != 0 {
            futex_wake(&self.pending);
        }
    }

    /// Forgets every request: in a child after `fork`, where no service thread and no other
    /// caller thread exists, whatever state the parent's threads left behind is void.
    pub fn reset(&self) {
        for slot in &self.slots {
            slot.state.store(FREE, SeqCst);
        }
        self.pending.store(0, SeqCst);
    }

    /// Submits `request` and waits for its outcome. `hint` spreads callers over the slots.
    ///
    /// The request's pointers must stay valid until this returns; they do, because the caller
    /// is blocked here meanwhile.
    pub fn call(&self, request: Request, hint: usize, waiting: Waiting) -> Outcome {
        let Some(index) = (0..SLOTS)
            .map(|i| (hint + i) % SLOTS)
            .find(|&i| self.slots[i].state.compare_exchange(FREE, FILLING, SeqCst, SeqCst).is_ok())
        else {
            return Outcome::Full;
        };
        let slot = &self.slots[index];
        let start = now_ns();
        // SAFETY: FILLING — this caller owns the request cell.
        slot.request.with_mut(|cell| unsafe { *cell = (request, start) });
        slot.state.store(SUBMITTED, SeqCst);
        if self.pending.fetch_or(1 << index, SeqCst) & ASLEEP != 0 {
            futex_wake(&self.pending);
        }
        self.wait(slot, waiting, start)
    }

    fn wait(&self, slot: &Slot, waiting: Waiting, start: u64) -> Outcome {
        // Spin first: a short call comes back sooner than a futex sleep and wake-up would.
        let spin_ns = waiting.spin_ns.min(waiting.stall_timeout_ns);
        let mut polls = 0u32;
        while spin_ns > 0 && slot.state.load(SeqCst) & !PARKED != DONE {
            polls = polls.wrapping_add(1);
            // The clock costs more than a poll: read it only now and then.
            if polls.is_multiple_of(64) && now_ns().saturating_sub(start) >= spin_ns {
                break;
            }
            core::hint::spin_loop();
        }
        loop {
            let state = slot.state.load(SeqCst);
            match state & !PARKED {
                DONE => {
                    // SAFETY: DONE — the service thread is finished with the slot; the reply
                    // cell is ours to read.
                    let reply = slot.reply.with(|cell| unsafe { *cell });
                    slot.state.store(FREE, SeqCst);
                    return Outcome::Done(reply);
                }
                SUBMITTED => {
                    let waited = now_ns().saturating_sub(start);
                    if waited >= waiting.stall_timeout_ns {
                        if slot.state.compare_exchange(state, CANCELLED, SeqCst, SeqCst).is_ok() {
                            slot.state.store(FREE, SeqCst);
                            return Outcome::Withdrawn;
                        }
                        continue; // claimed meanwhile: from now on it must be waited for
                    }
                    park(slot, state, Some(waiting.stall_timeout_ns - waited));
                }
                _ => park(slot, state, None),
            }
        }
    }

    /// The service thread's loop body: waits for submitted slots, then claims and handles each
    /// with `handle`. Returns after one batch. An idle thread polls for `idle`'s budget before
    /// it sleeps, and tells `idle` what the wait cost.
    pub fn serve_batch(&self, idle: &mut Idle, before_claim: impl Fn(), handle: impl Fn(&Request) -> Reply) {
        let mut bits = self.pending.swap(0, SeqCst) & !ASLEEP;
        if bits == 0 {
            let start = now_ns();
            let budget = idle.budget.budget_ns();
            let mut polls = 0u32;
            let mut polled = 0;
            while budget > 0 && self.pending.load(SeqCst) == 0 {
                polls = polls.wrapping_add(1);
                // The clock costs more than a poll: read it only now and then.
                if polls.is_multiple_of(64) {
                    polled = now_ns().saturating_sub(start);
                    if polled >= budget {
                        break;
                    }
                }
                core::hint::spin_loop();
            }
            idle.polled_ns = idle.polled_ns.saturating_add(polled);
            if self.pending.load(SeqCst) != 0 {
                idle.budget.record_idle_gap(polled);
                return;
            }
            // Out of budget, nothing came: refit it now (no caller waits on it) and sleep.
            idle.budget.refit_if_stale();
            if self.pending.compare_exchange(0, ASLEEP, SeqCst, SeqCst).is_ok() {
                idle.timed_out = !futex_wait(&self.pending, ASLEEP, Some(IDLE_CHECK_NS));
                idle.slept_at = Some(start);
            }
            self.pending.fetch_and(!ASLEEP, SeqCst);
            return;
        }
        before_claim();
        while bits != 0 {
            let index = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let slot = &self.slots[index];
            if !claim(slot) {
                continue; // withdrawn, or already handled through an earlier bit
            }
            // SAFETY: CLAIMED — the service thread owns the request and reply cells, and the
            // caller is blocked in `wait`, keeping the memory the request points to alive.
            let (request, submitted) = slot.request.with(|cell| unsafe { *cell });
            if let Some(slept) = idle.slept_at.take() {
                // The first request after a sleep: it waited for the wake-up.
                idle.budget.record_idle_gap(submitted.saturating_sub(slept));
                idle.budget.record_wake_cost(now_ns().saturating_sub(submitted));
            }
            let reply = handle(&request);
            // SAFETY: as above, the reply cell is the service thread's while CLAIMED.
            slot.reply.with_mut(|cell| unsafe { *cell = reply });
            if slot.state.swap(DONE, SeqCst) & PARKED != 0 {
                futex_wake(&slot.state);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
    use std::sync::Arc;

    const CALLERS: usize = 6;
    const CALLS: usize = 400;
    /// The id of the requests that only wake the service thread at the end.
    const WAKE: usize = CALLERS * CALLS;

    fn request(id: usize) -> Request {
        Request { nr: 0, args: [id as u64, 0, 0, 0, 0, 0], check: Check::Nothing, may_signal: false }
    }

    /// Callers race a service thread that stalls now and then, with a stall timeout short
    /// enough that many requests are withdrawn: every request must run exactly once if its
    /// caller got `Done`, and never if it was withdrawn or found no slot.
    #[test]
    fn each_request_runs_once_or_never_and_replies_reach_their_caller() {
        let lane: &'static Lane = Box::leak(Box::new(Lane::new()));
        let runs: Arc<Vec<AtomicU32>> = Arc::new((0..=WAKE).map(|_| AtomicU32::new(0)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let service = {
            let (runs, stop) = (runs.clone(), stop.clone());
            std::thread::spawn(move || {
                let batches = AtomicU32::new(0);
                let mut idle = Idle::new(2_000);
                while !stop.load(Relaxed) {
                    lane.serve_batch(
                        &mut idle,
                        || {
                            if batches.fetch_add(1, Relaxed).is_multiple_of(5) {
                                std::thread::sleep(std::time::Duration::from_micros(300));
                            }
                        },
                        |req| {
                            runs[req.args[0] as usize].fetch_add(1, Relaxed);
                            Reply { ret: req.args[0] as i64 * 3, refused: false, signal: 0, run_ns: 1 }
                        },
                    );
                }
            })
        };
        let callers: Vec<_> = (0..CALLERS)
            .map(|c| {
                std::thread::spawn(move || {
                    let waiting = Waiting { spin_ns: 1_000, stall_timeout_ns: 100_000 };
                    (0..CALLS)
                        .map(|i| {
                            let id = c * CALLS + i;
                            let outcome = lane.call(request(id), c, waiting);
                            if let Outcome::Done(reply) = outcome {
                                assert_eq!(reply.ret, id as i64 * 3, "a reply reached the wrong caller");
                            }
                            (id, outcome)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let outcomes: Vec<(usize, Outcome)> = callers.into_iter().flat_map(|h| h.join().unwrap()).collect();
        stop.store(true, Relaxed);
        // Wake the service thread so it sees `stop`.
        while !service.is_finished() {
            let _ = lane.call(request(WAKE), 0, Waiting { spin_ns: 0, stall_timeout_ns: 1_000_000 });
        }
        let (mut done, mut withdrawn) = (0, 0);
        for (id, outcome) in outcomes {
            let ran = runs[id].load(Relaxed);
            match outcome {
                Outcome::Done(_) => {
                    done += 1;
                    assert_eq!(ran, 1, "request {id} done, but ran {ran} times");
                }
                Outcome::Withdrawn | Outcome::Full => {
                    withdrawn += 1;
                    assert_eq!(ran, 0, "request {id} was withdrawn yet ran");
                }
            }
        }
        assert!(done > 0, "no request completed");
        eprintln!("{done} done, {withdrawn} withdrawn or refused for lack of a slot");
    }

    #[test]
    fn reset_frees_every_slot() {
        let lane = Lane::new();
        lane.slots[3].state.store(CLAIMED | PARKED, SeqCst);
        lane.pending.store(1 << 3, SeqCst);
        lane.reset();
        assert!(lane.slots.iter().all(|s| s.state.load(SeqCst) == FREE));
        assert_eq!(lane.pending.load(SeqCst), 0);
    }
}

/// Model checks of the hand-off (`RUSTFLAGS="--cfg loom" cargo test -p corehop-preload --lib
/// --release -- loom`): every interleaving of callers and the service thread, with the futex
/// modelled so that a lost wake-up is a deadlock loom reports.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicBool;
    use loom::sync::Arc;
    use loom::thread;

    fn request(id: u64) -> Request {
        Request { nr: 0, args: [id, 0, 0, 0, 0, 0], check: Check::Nothing, may_signal: false }
    }

    /// Serves until `done`, counting runs.
    fn service(lane: Arc<Lane>, runs: Arc<AtomicU32>, done: Arc<AtomicBool>) -> thread::JoinHandle<()> {
        thread::spawn(move || {
            let mut idle = Idle::new(0);
            while !done.load(SeqCst) {
                lane.serve_batch(
                    &mut idle,
                    || {},
                    |req| {
                        runs.fetch_add(1, SeqCst);
                        Reply { ret: req.args[0] as i64 + 100, ..Reply::default() }
                    },
                );
            }
        })
    }

    /// A caller that gives up at once races the service thread's claim: the call runs exactly
    /// once if the caller got `Done`, never if it withdrew, and the parked caller is always woken.
    #[test]
    fn loom_withdraw_races_claim_and_the_call_runs_once_or_never() {
        loom::model(|| {
            let lane = Arc::new(Lane::new());
            let runs = Arc::new(AtomicU32::new(0));
            let done = Arc::new(AtomicBool::new(false));
            let server = service(lane.clone(), runs.clone(), done.clone());
            let outcome = lane.call(request(1), 0, Waiting { spin_ns: 0, stall_timeout_ns: 0 });
            done.store(true, SeqCst);
            lane.kick();
            server.join().unwrap();
            match outcome {
                Outcome::Done(reply) => {
                    assert_eq!(reply.ret, 101);
                    assert_eq!(runs.load(SeqCst), 1);
                }
                Outcome::Withdrawn => assert_eq!(runs.load(SeqCst), 0),
                Outcome::Full => panic!("an empty lane has free slots"),
            }
        });
    }

    /// Two callers that wait as long as it takes each get their own reply; no wake-up is lost.
    #[test]
    fn loom_two_patient_callers_both_get_their_reply() {
        loom::model(|| {
            let lane = Arc::new(Lane::new());
            let runs = Arc::new(AtomicU32::new(0));
            let done = Arc::new(AtomicBool::new(false));
            let server = service(lane.clone(), runs.clone(), done.clone());
            let patient = Waiting { spin_ns: 0, stall_timeout_ns: u64::MAX };
            let other = {
                let lane = lane.clone();
                thread::spawn(move || lane.call(request(2), 1, patient))
            };
            let mine = lane.call(request(1), 0, patient);
            let theirs = other.join().unwrap();
            done.store(true, SeqCst);
            lane.kick();
            server.join().unwrap();
            assert_eq!(mine, Outcome::Done(Reply { ret: 101, ..Reply::default() }));
            assert_eq!(theirs, Outcome::Done(Reply { ret: 102, ..Reply::default() }));
            assert_eq!(runs.load(SeqCst), 2);
        });
    }
}
