//! The checks every lane built on [`handoff`](crate::handoff) must pass, written once: the
//! hand-off's own tests run them on a bare [`Lane`], and a crate that wraps a lane (the
//! preload library's, with its idle budget and its request format) runs them on its wrapper
//! through [`LaneUnderTest`]. Behind the `testing` feature (a dev-dependency feature).
//!
//! Without `--cfg loom`: [`each_request_runs_once_or_never`], a stress test with real threads.
//! Under `--cfg loom`: [`loom_withdraw_races_claim`], [`loom_two_patient_callers`] and
//! [`loom_a_reused_slot`], model checks over every interleaving, where a lost wake-up is a
//! deadlock loom reports.

#[cfg(loom)]
use loom::{
    sync::atomic::{AtomicBool, AtomicU32},
    sync::Arc,
    thread,
};
#[cfg(not(loom))]
use std::{
    sync::atomic::{AtomicBool, AtomicU32},
    sync::Arc,
    thread,
};

use core::sync::atomic::Ordering::SeqCst;

use crate::handoff::{Lane, Outcome, Waiting};

/// A lane whose requests are numbers (ids) and whose service thread answers each with what
/// the check's `run` returns for it.
pub trait LaneUnderTest: Send + Sync + Sized + 'static {
    /// What the service thread keeps from one batch to the next.
    type Server: Send;

    /// An empty lane.
    fn empty() -> Self;

    /// The service thread's state at its start.
    fn server(&self) -> Self::Server;

    /// Submits request `id` from a caller with slot hint `hint` and waits for its outcome.
    fn call(&self, id: u64, hint: usize, waiting: Waiting) -> Outcome<u64>;

    /// Wakes the service thread without a request.
    fn kick(&self);

    /// One turn of the service thread: waits for work (it may sleep until a caller or
    /// [`LaneUnderTest::kick`] wakes it), then runs `before_claim` and answers each request it
    /// claims with `run(id)`.
    fn serve(&self, server: &mut Self::Server, before_claim: &dyn Fn(), run: &dyn Fn(u64) -> u64);
}

impl LaneUnderTest for Lane<u64, u64> {
    type Server = ();

    fn empty() -> Self {
        Lane::new()
    }

    fn server(&self) {}

    fn call(&self, id: u64, hint: usize, waiting: Waiting) -> Outcome<u64> {
        Lane::call(self, id, hint, waiting)
    }

    fn kick(&self) {
        Lane::kick(self)
    }

    fn serve(&self, _: &mut (), before_claim: &dyn Fn(), run: &dyn Fn(u64) -> u64) {
        if !self.has_work() {
            self.sleep(Some(1_000_000));
        }
        Lane::serve(self, |_| before_claim(), |_, &id| run(id));
    }
}

/// A service thread for `lane` that serves until `stop`, counting each request's runs in
/// `runs` (indexed by id) and answering `id` with `answer(id)`; `before_claim` runs before each
/// batch.
fn service<L: LaneUnderTest>(
    lane: Arc<L>,
    runs: Arc<Vec<AtomicU32>>,
    stop: Arc<AtomicBool>,
    before_claim: impl Fn() + Send + 'static,
    answer: fn(u64) -> u64,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut server = lane.server();
        while !stop.load(SeqCst) {
            lane.serve(&mut server, &before_claim, &|id| {
                runs[id as usize].fetch_add(1, SeqCst);
                answer(id)
            });
        }
    })
}

/// Stops the service thread: the kick makes its current or next wait return, and then it sees
/// `stop`.
fn stop_service<L: LaneUnderTest>(lane: &L, stop: &AtomicBool, service: thread::JoinHandle<()>) {
    stop.store(true, SeqCst);
    lane.kick();
    service.join().unwrap();
}

/// Callers race a service thread that stalls now and then, with a stall timeout short enough
/// that many requests are withdrawn: every request must run exactly once if its caller got
/// `Done` (and get its own reply), and never if it was withdrawn or found no slot.
#[cfg(not(loom))]
pub fn each_request_runs_once_or_never<L: LaneUnderTest>() {
    const CALLERS: usize = 6;
    const CALLS: usize = 400;
    let lane = Arc::new(L::empty());
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..CALLERS * CALLS).map(|_| AtomicU32::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let batches = AtomicU32::new(0);
    let stall = move || {
        if batches.fetch_add(1, SeqCst).is_multiple_of(5) {
            std::thread::sleep(std::time::Duration::from_micros(300));
        }
    };
    let server = service(lane.clone(), runs.clone(), stop.clone(), stall, |id| id * 3);
    let callers: Vec<_> = (0..CALLERS)
        .map(|c| {
            let lane = lane.clone();
            thread::spawn(move || {
                let waiting = Waiting { spin_ns: 1_000, stall_timeout_ns: 100_000 };
                (0..CALLS)
                    .map(|i| {
                        let id = (c * CALLS + i) as u64;
                        let outcome = lane.call(id, c, waiting);
                        if let Outcome::Done(reply) = outcome {
                            assert_eq!(reply, id * 3, "a reply reached the wrong caller");
                        }
                        (id as usize, outcome)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let outcomes: Vec<(usize, Outcome<u64>)> = callers.into_iter().flat_map(|h| h.join().unwrap()).collect();
    stop_service(&*lane, &stop, server);
    let (mut done, mut withdrawn) = (0, 0);
    for (id, outcome) in outcomes {
        let ran = runs[id].load(SeqCst);
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

/// Runs `caller` against a service thread that answers `id` with `id + 100`, then stops the
/// service; returns the runs of requests 1 and 2.
#[cfg(loom)]
fn with_service<L: LaneUnderTest>(caller: impl FnOnce(&Arc<L>)) -> [u32; 2] {
    let lane = Arc::new(L::empty());
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..3).map(|_| AtomicU32::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let server = service(lane.clone(), runs.clone(), stop.clone(), || {}, |id| id + 100);
    caller(&lane);
    stop_service(&*lane, &stop, server);
    [runs[1].load(SeqCst), runs[2].load(SeqCst)]
}

/// `loom::model(body)`, with `body` on a thread of a 1 MiB stack: the model's own thread has 32
/// KiB, and a lane under loom (whose atomics and cells carry loom's bookkeeping) passes over
/// the stack on its way into its `Arc` (`Arc::new` alone took 8 KiB for the preload library's
/// wrapper, which then ran off the end of those 32 KiB).
#[cfg(loom)]
fn model(body: fn()) {
    loom::model(move || {
        // In words of the stack (the `generator` crate's unit): 128 Ki of 8 bytes.
        let stack = thread::Builder::new().stack_size(1 << 17);
        stack.spawn(body).expect("a model thread").join().expect("the model's body");
    });
}

/// A caller that gives up at once races the service thread's claim: the call runs exactly once
/// if the caller got `Done`, never if it withdrew, and the parked caller is always woken.
#[cfg(loom)]
pub fn loom_withdraw_races_claim<L: LaneUnderTest>() {
    model(|| {
        let mut outcome = None;
        let [runs, _] = with_service::<L>(|lane| {
            outcome = Some(lane.call(1, 0, Waiting { spin_ns: 0, stall_timeout_ns: 0 }));
        });
        match outcome.unwrap() {
            Outcome::Done(reply) => {
                assert_eq!(reply, 101);
                assert_eq!(runs, 1);
            }
            Outcome::Withdrawn => assert_eq!(runs, 0),
            Outcome::Full => panic!("an empty lane has free slots"),
        }
    });
}

/// Two callers that wait as long as it takes each get their own reply; no wake-up is lost.
#[cfg(loom)]
pub fn loom_two_patient_callers<L: LaneUnderTest>() {
    model(|| {
        let patient = Waiting { spin_ns: 0, stall_timeout_ns: u64::MAX };
        let runs = with_service::<L>(|lane| {
            let other = {
                let lane = lane.clone();
                thread::spawn(move || lane.call(2, 1, patient))
            };
            assert_eq!(lane.call(1, 0, patient), Outcome::Done(101));
            assert_eq!(other.join().unwrap(), Outcome::Done(102));
        });
        assert_eq!(runs, [1, 1]);
    });
}

/// One caller reuses its slot: the second request's answer is not mistaken for the first's
/// (the sequence number tells them apart), and each runs once.
#[cfg(loom)]
pub fn loom_a_reused_slot<L: LaneUnderTest>() {
    model(|| {
        let patient = Waiting { spin_ns: 0, stall_timeout_ns: u64::MAX };
        let runs = with_service::<L>(|lane| {
            assert_eq!(lane.call(1, 0, patient), Outcome::Done(101));
            assert_eq!(lane.call(2, 0, patient), Outcome::Done(102));
        });
        assert_eq!(runs, [1, 1]);
    });
}
