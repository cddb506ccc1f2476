//! The hand-off between a calling thread and a service thread: what a request and its reply
//! carry, and the service thread's idle wait.
//!
//! The slots themselves are `corehop_sys::handoff` (shared with the runtime's service cores):
//! a request line the caller writes and a completion line the service thread writes, a
//! doorbell word naming the submitted slots, and a state per slot that moves
//!
//! ```text
//!            caller                 service               caller
//!   FREE ──CAS──▶ FILLING ──▶ SUBMITTED ──CAS──▶ CLAIMED ──▶ (done = seq) ──▶ FREE
//!                                 │
//!                                 └──CAS (caller, after the stall timeout)──▶ CANCELLED ──▶ FREE
//! ```
//!
//! A request may point into the caller's memory (buffers, paths): the service thread touches
//! it only while CLAIMED, and a caller never leaves a CLAIMED request — it waits for the
//! answer, with the signals that have handlers held back (`sys::hold_signals`), so that no
//! handler can take it away. A caller that finds its request still SUBMITTED after the stall
//! timeout withdraws it with one CAS; whoever wins that CAS against the service thread's claim
//! decides where the call runs, so it runs exactly once. No wake-up is lost either way (loom-checked there and,
//! through this module, in `loom_tests` below).
//!
//! Here a request (number, six arguments, what to check, and when it was sent) takes two
//! lines of its slot's line pair, which the adjacent-line prefetcher brings together; the reply
//! fits the completion line.

use corehop_policy::spin::{SpinBudget, SpinConfig};
use corehop_sys::handoff;
pub use corehop_sys::handoff::{Waiting, SLOTS};

#[cfg(not(loom))]
use crate::sys::now_ns;
#[cfg(loom)]
fn now_ns() -> u64 {
    0
}

/// The most service threads (and lanes) a process gets.
pub const MAX_LANES: usize = 8;

/// What the service thread must check before running a call: whether it could block in a way
/// that only a signal to the *calling* thread would end (then it refuses, and the caller runs
/// the call itself, so EINTR and blocking behave exactly as without offload).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// The call cannot block (stat family, fsync). A stat that
    /// reached /proc is refused after it ran (`service`).
    Nothing,
    /// The call blocks if this descriptor can (pipes, sockets, terminals without O_NONBLOCK).
    Fd(i32),
    /// A positioned call (`pread`, `pwrite`) on this descriptor: as `Fd`, but what is found
    /// safe is remembered until the descriptor is closed (`memo`), since on a pipe, socket
    /// or terminal such a call fails at once (ESPIPE) whatever the descriptor became.
    Positioned(i32),
    /// Either descriptor (sendfile).
    Fds(i32, i32),
    /// A socket call: cannot block with MSG_DONTWAIT in `flags`, else as `Fd`.
    Socket(i32, i32),
    /// `openat(dirfd, path, flags)`: opening a FIFO or a device may wait for the other side.
    Open { dirfd: i32, path: u64, flags: i32 },
    /// A `poll` or `select` that cannot wait, on the descriptors its arguments name: one whose
    /// readiness depends on the thread asking (a signalfd, or an epoll set that may hold one)
    /// stays.
    Watched,
}

impl Check {
    /// The descriptors whose kind decides whether the call could block.
    pub fn fds(self) -> [Option<i32>; 2] {
        match self {
            Check::Socket(_, flags) if flags & libc::MSG_DONTWAIT != 0 => [None, None],
            Check::Fd(fd) | Check::Positioned(fd) | Check::Socket(fd, _) => [Some(fd), None],
            Check::Fds(a, b) => [Some(a), Some(b)],
            Check::Nothing | Check::Open { .. } | Check::Watched => [None, None],
        }
    }
}

/// One system call to run: its number, its raw arguments, and what to check first. Made only
/// by [`Request::new`], whose contract makes running it sound.
#[derive(Clone, Copy, Debug)]
// `#[non_exhaustive]` binds only other crates; the private field keeps this crate's other
// modules from making one without `new`.
#[allow(clippy::manual_non_exhaustive)]
pub struct Request {
    pub nr: i64,
    pub args: [u64; 6],
    pub check: Check,
    /// The call may fail with EPIPE/EFBIG and raise SIGPIPE/SIGXFSZ at the thread that made it.
    pub may_signal: bool,
    /// The calling thread's memory protection-key rights ([`crate::sys::pkru`]): the kernel
    /// checks the program's buffers against those of the thread that makes the call.
    pub pkru: u32,
    _valid: (),
}

impl Request {
    /// System call `nr` with `args`.
    ///
    /// # Safety
    /// `args` are arguments of `nr` as the program passed them to libc: every pointer among
    /// them valid for what the call reads and writes (a bad one gives EFAULT where the kernel
    /// checks it, as without this library), for as long as the request or a copy of it may
    /// run. A lane keeps its caller waiting until then.
    pub unsafe fn new(nr: i64, args: [u64; 6], check: Check, may_signal: bool) -> Request {
        Request { nr, args, check, may_signal, pkru: crate::sys::pkru(), _valid: () }
    }
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

/// How a submitted call ended.
pub type Outcome = handoff::Outcome<Reply>;

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
    /// The last sleep lasted its whole timeout and nothing has come since: the program is
    /// quiet, so the thread sleeps again at once instead of polling.
    quiet: bool,
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
        Idle { budget: SpinBudget::new(config), timed_out: false, slept_at: None, quiet: false, polled_ns: 0 }
    }
}

/// The request slots of one service thread: a request and when it was sent, and its reply.
pub struct Lane(handoff::Lane<(Request, u64), Reply>);

const _: () = assert!(core::mem::size_of::<Reply>() <= 56, "a reply fits its completion line");

impl Lane {
    #[allow(clippy::new_without_default)] // used in statics, where Default is not const
    #[cfg(not(loom))]
    pub const fn new() -> Lane {
        Lane(handoff::Lane::new())
    }

    #[allow(clippy::new_without_default)]
    #[cfg(loom)]
    pub fn new() -> Lane {
        Lane(handoff::Lane::new())
    }

    /// Wakes the service thread without a request (its next batch finds nothing to claim).
    pub fn kick(&self) {
        self.0.kick();
    }

    /// Forgets every request: in a child after `fork`, where no service thread and no other
    /// caller thread exists, whatever state the parent's threads left behind is void.
    ///
    /// # Safety
    /// As for `corehop_sys::handoff::Lane::reset`: no other thread uses the lane meanwhile.
    pub unsafe fn reset(&self) {
        // SAFETY: this function's own contract.
        unsafe { self.0.reset() };
    }

    /// Submits `request` and waits for its outcome. `hint` spreads callers over the slots.
    ///
    /// The request's pointers must stay valid until this returns; they do, because the caller
    /// is blocked here meanwhile.
    pub fn call(&self, request: Request, hint: usize, waiting: Waiting) -> Outcome {
        self.call_spun(request, now_ns(), hint, waiting).0
    }

    /// [`Lane::call`] of a request sent at `sent_ns` (`now_ns`: the caller's own start, so
    /// the hand-off reads the clock once), also saying how the caller waited: `None` if it
    /// spun all the while, else how long it spun (ns) before it slept.
    pub fn call_spun(
        &self,
        request: Request,
        sent_ns: u64,
        hint: usize,
        waiting: Waiting,
    ) -> (Outcome, Option<u64>) {
        self.0.call_spun((request, sent_ns), hint, waiting)
    }

    /// The service thread's loop body: waits for submitted slots, then claims and handles each
    /// with `handle`. Returns after one batch. An idle thread polls for `idle`'s budget before
    /// it sleeps, and tells `idle` what the wait cost.
    pub fn serve_batch(&self, idle: &mut Idle, before_claim: impl Fn(), handle: impl Fn(&Request) -> Reply) {
        let lane = &self.0;
        if !lane.has_work() {
            let start = now_ns();
            let budget = if idle.quiet { 0 } else { idle.budget.budget_ns() };
            let mut polls = 0u32;
            let mut polled = 0;
            while budget > 0 && !lane.has_work() {
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
            if lane.has_work() {
                idle.budget.record_idle_gap(polled);
                return;
            }
            // Out of budget, nothing came: refit it now (no caller waits on it) and sleep.
            idle.budget.refit_if_stale();
            idle.timed_out = !lane.sleep(Some(IDLE_CHECK_NS));
            idle.quiet = idle.timed_out;
            idle.slept_at = Some(start);
            return;
        }
        lane.serve(
            |_| before_claim(),
            |_, (request, submitted)| {
                idle.quiet = false;
                if let Some(slept) = idle.slept_at.take() {
                    // The first request after a sleep: it waited for the wake-up.
                    idle.budget.record_idle_gap(submitted.saturating_sub(slept));
                    idle.budget.record_wake_cost(now_ns().saturating_sub(*submitted));
                }
                handle(request)
            },
        );
    }
}

/// The hand-off's checks (`corehop_sys::testing`), run through this lane's request format and
/// its service loop with the idle budget: what the lane adds must keep every request running
/// once or never, and lose no wake-up (loom: `RUSTFLAGS="--cfg loom" cargo test -p
/// corehop-preload --lib --release -- loom`).
#[cfg(test)]
mod tests {
    use super::*;
    use corehop_sys::testing::{self, LaneUnderTest};

    impl LaneUnderTest for Lane {
        type Server = Idle;

        fn empty() -> Lane {
            Lane::new()
        }

        fn server(&self) -> Idle {
            // Under loom time stands still, so a budget would be polled for ever.
            Idle::new(if cfg!(loom) { 0 } else { 2_000 })
        }

        fn call(&self, id: u64, hint: usize, waiting: Waiting) -> handoff::Outcome<u64> {
            // SAFETY: call 0 (`read`) is never run here: these lanes' server echoes the id.
            let request = unsafe { Request::new(0, [id, 0, 0, 0, 0, 0], Check::Nothing, false) };
            match Lane::call(self, request, hint, waiting) {
                Outcome::Done(reply) => handoff::Outcome::Done(reply.ret as u64),
                Outcome::Withdrawn => handoff::Outcome::Withdrawn,
                Outcome::Full => handoff::Outcome::Full,
            }
        }

        fn kick(&self) {
            Lane::kick(self)
        }

        fn serve(&self, idle: &mut Idle, before_claim: &dyn Fn(), run: &dyn Fn(u64) -> u64) {
            self.serve_batch(idle, before_claim, |req| Reply {
                ret: run(req.args[0]) as i64,
                ..Reply::default()
            });
        }
    }

    #[cfg(not(loom))]
    #[test]
    fn each_request_runs_once_or_never_and_replies_reach_their_caller() {
        testing::each_request_runs_once_or_never::<Lane>();
    }

    #[cfg(loom)]
    #[test]
    fn loom_withdraw_races_claim_and_the_call_runs_once_or_never() {
        testing::loom_withdraw_races_claim::<Lane>();
    }

    #[cfg(loom)]
    #[test]
    fn loom_two_patient_callers_both_get_their_reply() {
        testing::loom_two_patient_callers::<Lane>();
    }

    #[cfg(loom)]
    #[test]
    fn loom_a_reused_slot_answers_each_request_once() {
        testing::loom_a_reused_slot::<Lane>();
    }
}
