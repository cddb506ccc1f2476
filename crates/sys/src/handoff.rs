//! The hand-off between calling threads and one service thread: request slots, each a request
//! line and a completion line, and a doorbell word. The preload library's service threads and
//! the runtime's service cores both use it, so the two keep one discipline (that of the
//! runtime's mailbox): what travels each way is one cache line; the server prefetches the lines
//! it will touch the moment it sees work; it serves exactly the slots its doorbell named, with
//! no second search.
//!
//! ```text
//!  caller                                    doorbell `pending`        service thread
//!  request line: state FREE→FILLING,         fetch_or(1 << slot) ──▶  swap(0): the slots to serve
//!    request, seq; state SUBMITTED                                    prefetch their lines
//!                                                                     claim: SUBMITTED→CLAIMED (CAS)
//!  spins on its completion line   ◀────────── completion line: reply; done := seq (swap)
//!  reads the reply, state FREE
//! ```
//!
//! **Request line** (the caller writes, the service thread reads): the slot's `state`, the
//! request and its sequence number. `state` moves FREE → FILLING → SUBMITTED (caller), then
//! SUBMITTED → CLAIMED (service thread, CAS) or SUBMITTED → CANCELLED (caller, CAS, after its
//! stall timeout), and back to FREE (caller). Whoever wins the CAS from SUBMITTED decides where
//! the call runs, so it runs exactly once.
//!
//! **Completion line** (the service thread writes, the caller reads): the reply and `done`,
//! which holds the sequence number of the last request answered. The caller waits until `done`
//! holds its own request's number: the reply comes in the same line as the signal.
//!
//! Ownership follows the state: the caller writes the request only in FILLING; the service
//! thread reads it and writes the reply only in CLAIMED; the caller reads the reply only once
//! `done` says so. A request may point into the caller's memory: the service thread touches
//! it only while CLAIMED, and a caller never leaves a CLAIMED request — it waits for `done`.
//!
//! Wake-ups never depend on the order of two *different* atomics: each sleeper announces itself
//! with a flag bit in the very word it sleeps on, set by a read-modify-write, and each waker
//! changes that word with a read-modify-write that returns the old value, flag included. A
//! caller parks by CAS `done: old → old|PARKED`; the service thread answers with
//! `swap(done, seq)` and wakes if the old value had PARKED. The service thread sleeps by CAS
//! `pending: 0 → ASLEEP`; a caller rings with `fetch_or(bit)` and wakes it if the old value had
//! ASLEEP. Both are futex words, so a change between the flag and the sleep makes the sleep
//! return at once. Neither wake-up can be lost: this is the protocol of
//! [`park`](crate::park), whose argument and models cover it (and `loom_tests` below).

use core::mem::MaybeUninit;
use core::sync::atomic::Ordering::{Release, SeqCst};

use crate::model::{now_ns, AtomicU32, UnsafeCell};
use crate::park::{sleep, wake, Door, Slept};

/// Request slots per lane: one bit each in the 32-bit futex word `pending`, whose top bit is
/// the `ASLEEP` flag.
pub const SLOTS: usize = 31;
/// Polls a caller makes back to back, without a pause, before it starts pausing between
/// polls and looking at the clock: about a microsecond, the length of a round trip or two.
const TIGHT_POLLS: u32 = 1024;
/// In `pending`: the service thread is asleep (or about to sleep) on it.
const ASLEEP: u32 = crate::park::SLEEPER;
/// In `done`: the caller is asleep (or about to sleep) on it.
const PARKED: u32 = crate::park::SLEEPER;
/// Sequence numbers live below the PARKED flag.
const SEQ_MASK: u32 = PARKED - 1;

const FREE: u32 = 0;
const FILLING: u32 = 1;
const SUBMITTED: u32 = 2;
const CLAIMED: u32 = 3;
const CANCELLED: u32 = 4;

/// How a submitted call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome<Rep> {
    /// The service thread handled it and answered this.
    Done(Rep),
    /// The service thread did not claim it in time; it was withdrawn and never ran.
    Withdrawn,
    /// Every slot of the lane was in use.
    Full,
}

/// How long a caller spins before it sleeps, and how long it waits for a claim before it
/// withdraws its request (`u64::MAX`: never).
///
/// The spin adapts to how soon answers came in this slot (a caller keeps its slot, so this is
/// its own history; see [`spin_limit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiting {
    /// Spin at most this long for the answer before sleeping on the completion line.
    pub spin_ns: u64,
    /// Withdraw a request still unclaimed after this long.
    pub stall_timeout_ns: u64,
}

/// What the caller writes: one line with the state word.
#[repr(C, align(64))]
struct RequestLine<Req> {
    state: AtomicU32,
    /// The request's number, copied into `done` with the answer.
    seq: UnsafeCell<u32>,
    /// Callers only: whether the last answer in this slot needed a sleep (a hint for the
    /// next caller of the slot).
    slept_last: UnsafeCell<bool>,
    /// Written in FILLING before any read.
    request: UnsafeCell<MaybeUninit<Req>>,
}

/// What the service thread writes: one line with the word the caller waits on.
#[repr(C, align(64))]
struct CompletionLine<Rep> {
    /// The number of the last request answered in this slot, with the PARKED flag.
    done: AtomicU32,
    /// Written before `done` names the request it answers.
    reply: UnsafeCell<MaybeUninit<Rep>>,
}

/// A slot: its two lines side by side (a pair the adjacent-line prefetcher brings together).
#[repr(C, align(128))]
struct Slot<Req, Rep> {
    request: RequestLine<Req>,
    completion: CompletionLine<Rep>,
}

impl<Req, Rep> Slot<Req, Rep> {
    #[cfg(not(loom))]
    #[allow(clippy::declare_interior_mutable_const)] // copied into each slot, never shared
    const EMPTY: Self = Slot {
        request: RequestLine {
            state: AtomicU32::new(FREE),
            seq: UnsafeCell::new(0),
            slept_last: UnsafeCell::new(false),
            request: UnsafeCell::new(MaybeUninit::uninit()),
        },
        completion: CompletionLine { done: AtomicU32::new(0), reply: UnsafeCell::new(MaybeUninit::uninit()) },
    };

    #[cfg(loom)]
    fn empty() -> Self {
        Slot {
            request: RequestLine {
                state: AtomicU32::new(FREE),
                seq: UnsafeCell::new(0),
                slept_last: UnsafeCell::new(false),
                request: UnsafeCell::new(MaybeUninit::uninit()),
            },
            completion: CompletionLine {
                done: AtomicU32::new(0),
                reply: UnsafeCell::new(MaybeUninit::uninit()),
            },
        }
    }
}

/// The request slots of one service thread, and its doorbell.
#[repr(C, align(128))]
pub struct Lane<Req, Rep> {
    /// Submitted slots not yet taken, one bit each, and the ASLEEP flag: the service thread's
    /// futex word. On a line pair of its own: callers ring it, the idle service thread polls it.
    pending: AtomicU32,
    slots: [Slot<Req, Rep>; SLOTS],
}

// SAFETY: the UnsafeCells of each slot are accessed only by the party that owns the slot in
// its current state (module docs), and states change only through atomics. Requests and
// replies cross threads, so they must be Send.
unsafe impl<Req: Send, Rep: Send> Sync for Lane<Req, Rep> {}

/// Whether the lines a request and its completion travel in are one cache line each.
pub const fn fits_one_line<Req, Rep>() -> bool {
    core::mem::size_of::<RequestLine<Req>>() == 64 && core::mem::size_of::<CompletionLine<Rep>>() == 64
}

/// How long a caller spins before it sleeps, given its limit and whether the last answer in its
/// slot needed a sleep: the whole limit (which the caller sets near a wake-up's cost, the
/// 2-competitive rule of spin-or-block), or a quarter of it after an answer that came only
/// after the limit. A caller whose answers take long (an fsync) then spends little on spinning,
/// one whose answers come quickly loses no wake-up to a short spin, and a slot that mixes both
/// spins fully again after its first quick answer.
pub fn spin_limit(spin_ns: u64, slept_last: bool) -> u64 {
    if slept_last {
        spin_ns / 4
    } else {
        spin_ns
    }
}

/// Starts fetching the line at `addr` for writing (x86 `PREFETCHW` where the build allows it,
/// else `PREFETCHT0`). A hint: it never faults and changes no result.
#[inline(always)]
fn prefetch_for_write(addr: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    // SAFETY: SSE prefetches are part of x86-64; a prefetch never faults.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_ET0 }>(addr.cast())
    };
    #[cfg(any(not(target_arch = "x86_64"), loom))]
    let _ = addr;
}

impl<Req: Copy, Rep: Copy> Lane<Req, Rep> {
    /// An empty lane (const: the preload library keeps its lanes in statics).
    #[cfg(not(loom))]
    #[allow(clippy::new_without_default)] // used in statics, where Default is not const
    pub const fn new() -> Self {
        Lane { pending: AtomicU32::new(0), slots: [Slot::EMPTY; SLOTS] }
    }

    /// An empty lane.
    #[cfg(loom)]
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Lane { pending: AtomicU32::new(0), slots: core::array::from_fn(|_| Slot::empty()) }
    }

    /// Wakes the service thread without a request (its next batch finds nothing to claim).
    pub fn kick(&self) {
        self.ring_with(|| ());
    }

    /// Forgets every request: in a child after `fork`, where no service thread and no other
    /// caller thread exists, whatever state the parent's threads left behind is void.
    ///
    /// # Safety
    /// No other thread uses the lane while this runs or afterwards on the strength of a slot
    /// it claimed before: no caller is inside [`Lane::call`] and no server inside
    /// [`Lane::serve`]. Otherwise a slot freed under a caller could be filled by a second one
    /// while the first still writes it.
    pub unsafe fn reset(&self) {
        for slot in &self.slots {
            slot.request.state.store(FREE, SeqCst);
        }
        self.pending.store(0, SeqCst);
    }

    /// Submits `request` and waits for its outcome. `hint` spreads callers over the slots (a
    /// thread that keeps its hint keeps its slot, whose lines then stay where they were).
    ///
    /// The request's pointers must stay valid until this returns; they do, because the caller
    /// is blocked here meanwhile.
    pub fn call(&self, request: Req, hint: usize, waiting: Waiting) -> Outcome<Rep> {
        self.call_spun(request, hint, waiting).0
    }

    /// [`Lane::call`], also saying how the caller waited: `None` if it spun all the while,
    /// else how long it spun (ns) before it slept. What the caller's CPU spent polling is the
    /// whole wait in the first case, that time in the second.
    pub fn call_spun(&self, request: Req, hint: usize, waiting: Waiting) -> (Outcome<Rep>, Option<u64>) {
        let Some(slot) = (0..SLOTS).map(|i| (hint + i) % SLOTS).find(|&i| {
            let state = &self.slots[i].request.state;
            state.load(SeqCst) == FREE && state.compare_exchange(FREE, FILLING, SeqCst, SeqCst).is_ok()
        }) else {
            return (Outcome::Full, None);
        };
        let lines = &self.slots[slot];
        // `done` still names the slot's last answer (no request of the slot is outstanding
        // while it is FILLING). A withdrawn request takes a number but gets no answer, so
        // after 2^31 of them in a row the next number would come round to it and read as
        // answered at once: skip it.
        let last_answered = lines.completion.done.load(SeqCst) & SEQ_MASK;
        // SAFETY: FILLING: this caller owns the request cells.
        let seq = lines.request.seq.with_mut(|seq| unsafe {
            let mut next = (*seq + 1) & SEQ_MASK;
            if next == last_answered {
                next = (next + 1) & SEQ_MASK;
            }
            *seq = next;
            next
        });
        // SAFETY: as above.
        lines.request.request.with_mut(|cell| unsafe { *cell = MaybeUninit::new(request) });
        lines.request.state.store(SUBMITTED, SeqCst);
        wake(&self.pending, self.pending.fetch_or(1 << slot, SeqCst));
        self.wait(lines, seq, waiting)
    }

    fn wait(&self, lines: &Slot<Req, Rep>, seq: u32, waiting: Waiting) -> (Outcome<Rep>, Option<u64>) {
        let done = &lines.completion.done;
        let answered = |word: u32| word & SEQ_MASK == seq;
        // SAFETY: the slot is this caller's until it stores FREE (module docs); no one else
        // touches `slept_last` meanwhile.
        let slept_last = lines.request.slept_last.with(|t| unsafe { *t });
        // Spin first: a short call comes back sooner than a futex sleep and wake-up would. The
        // clock costs more than a poll: it is read only now and then, first after 64 polls
        // (the answer usually comes before).
        let spin_ns = spin_limit(waiting.spin_ns, slept_last).min(waiting.stall_timeout_ns);
        let mut start = None;
        let mut polls = 0u32;
        while spin_ns > 0 && !answered(done.load(SeqCst)) {
            polls = polls.wrapping_add(1);
            // The first polls back to back: an answer due within a round trip is seen as soon
            // as its line arrives, not after a pause (up to ~140 cycles on recent x86).
            if polls < TIGHT_POLLS {
                continue;
            }
            if polls.is_multiple_of(64) {
                let now = now_ns();
                if now.saturating_sub(*start.get_or_insert(now)) >= spin_ns {
                    break;
                }
            }
            core::hint::spin_loop();
        }
        let mut slept_after = None;
        loop {
            let word = done.load(SeqCst);
            if answered(word) {
                // SAFETY: as above, and `done` holds our number: the service thread is finished
                // with the slot, and the reply cell (written before `done`) is ours to read.
                let reply = unsafe {
                    lines.request.slept_last.with_mut(|t| *t = slept_after.is_some());
                    lines.completion.reply.with(|cell| (*cell).assume_init())
                };
                // Release, not SeqCst: the line is the service thread's now (its claim), and a
                // plain store waits for it in the store buffer, not on the caller's way out.
                lines.request.state.store(FREE, Release);
                return (Outcome::Done(reply), slept_after);
            }
            // The clock only now: an answer that came during the spin needs none.
            let start = *start.get_or_insert_with(now_ns);
            if slept_after.is_none() {
                slept_after = Some(now_ns().saturating_sub(start));
            }
            let state = lines.request.state.load(SeqCst);
            if state == SUBMITTED {
                let waited = now_ns().saturating_sub(start);
                if waited >= waiting.stall_timeout_ns {
                    if lines.request.state.compare_exchange(SUBMITTED, CANCELLED, SeqCst, SeqCst).is_ok() {
                        lines.request.state.store(FREE, SeqCst);
                        return (Outcome::Withdrawn, slept_after);
                    }
                    continue; // claimed meanwhile: from now on it must be waited for
                }
                sleep(done, word, Some(waiting.stall_timeout_ns - waited));
            } else {
                sleep(done, word, None);
            }
        }
    }

    /// Whether a request waits (a plain load: what an idle service thread polls).
    #[inline(always)]
    pub fn has_work(&self) -> bool {
        self.pending.load(SeqCst) & !ASLEEP != 0
    }

    /// Sleeps until a caller rings (or `timeout_ns` passes); returns false if the timeout
    /// ended it. Returns at once if a request already waits.
    pub fn sleep(&self, timeout_ns: Option<u64>) -> bool {
        self.sleep_until_rung(timeout_ns) != Slept::TimedOut
    }

    /// The service thread's sleep on the doorbell, its flag cleared after.
    fn sleep_until_rung(&self, timeout_ns: Option<u64>) -> Slept {
        let slept = sleep(&self.pending, 0, timeout_ns);
        self.pending.fetch_and(!ASLEEP, SeqCst);
        slept
    }

    /// Serves what the doorbell names now: prefetches every named slot's request line, then
    /// claims and handles each with `handle`, in slot order. `before_claim` gets the named
    /// slots (a bit each) once, if there are any, to prefetch what the requests will touch.
    /// Returns how many requests it handled.
    ///
    /// The completion line is not prefetched: its caller polls it, and would take it back
    /// before the answer is written.
    pub fn serve(&self, before_claim: impl FnOnce(u32), mut handle: impl FnMut(usize, &Req) -> Rep) -> usize {
        let mut bits = self.pending.swap(0, SeqCst) & !ASLEEP;
        if bits == 0 {
            return 0;
        }
        let mut left = bits;
        while left != 0 {
            let slot = &self.slots[left.trailing_zeros() as usize];
            left &= left - 1;
            // All at once: the claims write them (each line of a request that spans more).
            let first = (&slot.request as *const RequestLine<Req>).cast::<u8>();
            for line in (0..core::mem::size_of::<RequestLine<Req>>()).step_by(64) {
                prefetch_for_write(first.wrapping_add(line));
            }
        }
        before_claim(bits);
        let mut handled = 0;
        while bits != 0 {
            let index = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            // Not claimed: withdrawn, or already handled through an earlier bit.
            handled += usize::from(self.claim_and_handle(index, &mut handle));
        }
        handled
    }

    /// SUBMITTED → CLAIMED for slot `index`, then runs `handle` and answers. False if the
    /// request is not (or no longer) submitted.
    fn claim_and_handle(&self, index: usize, handle: impl FnOnce(usize, &Req) -> Rep) -> bool {
        let slot = &self.slots[index];
        if slot.request.state.compare_exchange(SUBMITTED, CLAIMED, SeqCst, SeqCst).is_err() {
            return false;
        }
        // SAFETY: CLAIMED: the service thread owns the request and reply cells, and the caller
        // waits for `done`, keeping the memory the request points to alive. The caller wrote
        // the request in FILLING, before SUBMITTED.
        let (request, seq) = unsafe {
            (slot.request.request.with(|cell| (*cell).assume_init()), slot.request.seq.with(|seq| *seq))
        };
        let reply = handle(index, &request);
        // SAFETY: as above; the caller reads the reply only once `done` holds `seq`.
        slot.completion.reply.with_mut(|cell| unsafe { *cell = MaybeUninit::new(reply) });
        wake(&slot.completion.done, slot.completion.done.swap(seq, SeqCst));
        true
    }
}

/// The call slots as the door of a worker's mailbox: a ring without a request sets a bit no
/// call is waiting on (its batch then claims nothing), so the worker's look at its other ways in
/// and its calls share one futex word. [`Lane::serve`] consumes the bits, a ring's included; a
/// worker that parks without serving first returns at once.
impl<Req: Copy, Rep: Copy> Door for Lane<Req, Rep> {
    #[inline(always)]
    fn ring_with(&self, before_wake: impl FnOnce()) -> bool {
        let old = self.pending.fetch_or(1 << (SLOTS - 1), SeqCst);
        if old & ASLEEP != 0 {
            before_wake();
        }
        wake(&self.pending, old)
    }

    fn park(&self) -> bool {
        self.sleep_until_rung(None) != Slept::Changed
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Arc;

    type TestLane = Lane<u64, i64>;

    #[test]
    fn a_request_and_its_completion_are_one_line_each() {
        assert!(fits_one_line::<[u64; 6], [u64; 7]>());
        assert!(!fits_one_line::<[u64; 8], u64>());
        assert_eq!(core::mem::size_of::<Slot<u64, u64>>(), 128);
    }

    #[test]
    fn each_request_runs_once_or_never_and_replies_reach_their_caller() {
        crate::testing::each_request_runs_once_or_never::<Lane<u64, u64>>();
    }

    /// Withdrawn requests take numbers without answers; the number that comes round to the
    /// last answer's is skipped, or the call would read an answer nobody wrote.
    #[test]
    fn a_request_number_never_repeats_the_last_answer() {
        let lane = TestLane::new();
        // As after 2^31 - 1 withdrawals since the answer numbered 0: the next number is 0.
        // SAFETY: this thread is the lane's only user.
        lane.slots[0].request.seq.with_mut(|seq| unsafe { *seq = SEQ_MASK });
        let no_server = Waiting { spin_ns: 0, stall_timeout_ns: 1_000 };
        assert!(matches!(lane.call(7, 0, no_server), Outcome::Withdrawn));
        // SAFETY: as above.
        assert_eq!(lane.slots[0].request.seq.with(|seq| unsafe { *seq }), 1);
    }

    #[test]
    fn a_slot_whose_last_answer_needed_a_sleep_spins_a_quarter() {
        assert_eq!(spin_limit(20_000, false), 20_000);
        assert_eq!(spin_limit(20_000, true), 5_000);
    }

    /// An answer later than the spin limit is slept for, and the slot remembers it: the next
    /// call spins a quarter of the limit, and a quick answer restores the whole limit.
    #[test]
    fn a_slot_remembers_whether_its_last_answer_needed_a_sleep() {
        let lane: &'static TestLane = Box::leak(Box::new(Lane::new()));
        let slow = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let service = {
            let (slow, stop) = (slow.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Relaxed) {
                    if !lane.has_work() {
                        core::hint::spin_loop();
                        continue;
                    }
                    lane.serve(
                        |_| {
                            if slow.load(Relaxed) {
                                std::thread::sleep(std::time::Duration::from_millis(5));
                            }
                        },
                        |_, &x| x as i64,
                    );
                }
            })
        };
        let slept_last = |slot: usize| lane.slots[slot].request.slept_last.with(|t| unsafe { *t });
        let waiting = Waiting { spin_ns: 10_000, stall_timeout_ns: u64::MAX };
        let (outcome, slept_after) = lane.call_spun(1, 0, waiting);
        assert_eq!(outcome, Outcome::Done(1));
        assert!(slept_after.is_some(), "a 5 ms answer is slept for after a 10 µs spin");
        assert!(slept_last(0));
        slow.store(false, Relaxed);
        let patient = Waiting { spin_ns: 10_000_000_000, stall_timeout_ns: u64::MAX };
        assert_eq!(lane.call_spun(2, 0, patient), (Outcome::Done(2), None));
        assert!(!slept_last(0));
        stop.store(true, Relaxed);
        service.join().unwrap();
    }

    #[test]
    fn reset_frees_every_slot() {
        let lane = TestLane::new();
        lane.slots[3].request.state.store(CLAIMED, SeqCst);
        lane.pending.store(1 << 3, SeqCst);
        // SAFETY: this thread is the lane's only user.
        unsafe { lane.reset() };
        assert!(lane.slots.iter().all(|s| s.request.state.load(SeqCst) == FREE));
        assert!(!lane.has_work());
    }
}

/// Model checks of the hand-off (`RUSTFLAGS="--cfg loom" cargo test --release -p corehop-sys
/// --lib --target-dir target/loom -- loom`): every interleaving of callers and the service
/// thread, with the futex modelled so that a lost wake-up is a deadlock loom reports.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::Lane;
    use crate::testing;

    #[test]
    fn loom_withdraw_races_claim_and_the_call_runs_once_or_never() {
        testing::loom_withdraw_races_claim::<Lane<u64, u64>>();
    }

    #[test]
    fn loom_two_patient_callers_both_get_their_reply() {
        testing::loom_two_patient_callers::<Lane<u64, u64>>();
    }

    #[test]
    fn loom_a_reused_slot_answers_each_request_once() {
        testing::loom_a_reused_slot::<Lane<u64, u64>>();
    }
}
