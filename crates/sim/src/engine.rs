//! The discrete-event core: virtual time, the event queue, the seeded RNG and the run loop.
//!
//! Time is an integer number of picoseconds ([`Ps`]), so every sum is exact and two runs of the
//! same scenario and seed produce byte-identical output. Events due at the same instant are
//! delivered in the order they were scheduled (a per-simulation sequence number breaks ties),
//! never in heap order.
//!
//! ```text
//!   Model::start ──schedule──▶ [ (time, seq, event) min-heap ] ──pop──▶ Model::on_event
//!                                       ▲                                   │
//!                                       └────────────schedule───────────────┘
//! ```

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::machine::SimMachine;
use crate::stats::Stats;

/// Virtual time and durations, in picoseconds.
pub type Ps = u64;

/// Picoseconds per nanosecond.
pub const PS_PER_NS: Ps = 1_000;

/// Converts nanoseconds (from a scenario or a cost model) to whole picoseconds, rounding to
/// nearest; negative or NaN inputs (rejected by validation before they get here) become 0.
pub fn ns_to_ps(ns: f64) -> Ps {
    if ns.is_nan() || ns <= 0.0 {
        0
    } else {
        (ns * PS_PER_NS as f64).round() as Ps
    }
}

/// Converts picoseconds to nanoseconds for reporting.
pub fn ps_to_ns(ps: Ps) -> f64 {
    ps as f64 / PS_PER_NS as f64
}

/// One scheduled event. Ordered by time, then by the order it was scheduled.
struct Pending<E> {
    at: Ps,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Pending<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<E> Eq for Pending<E> {}
impl<E> PartialOrd for Pending<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Pending<E> {
    // Reversed so that `BinaryHeap` (a max-heap) pops the earliest (time, seq) first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.at.cmp(&self.at).then(other.seq.cmp(&self.seq))
    }
}

/// The simulation state a model drives: clock, event queue, RNG, machine and statistics.
///
/// `E` is the model's own event type; the engine never looks inside it.
pub struct Sim<E> {
    now: Ps,
    queue: BinaryHeap<Pending<E>>,
    next_seq: u64,
    delivered: u64,
    rng: Pcg64Mcg,
    /// The modelled machine: CPUs, caches, speeds and hop costs.
    pub machine: SimMachine,
    /// Per-CPU busy/idle ledger, hop counts, queueing delays and completed operations.
    pub stats: Stats,
}

impl<E> Sim<E> {
    /// A simulation at time 0 on `machine`, with its RNG seeded from `seed`.
    pub fn new(machine: SimMachine, seed: u64) -> Sim<E> {
        let stats = Stats::new(machine.cpu_count());
        Sim {
            now: 0,
            queue: BinaryHeap::new(),
            next_seq: 0,
            delivered: 0,
            rng: Pcg64Mcg::seed_from_u64(seed),
            machine,
            stats,
        }
    }

    /// The current virtual time.
    pub fn now(&self) -> Ps {
        self.now
    }

    /// Events delivered so far.
    pub fn events_delivered(&self) -> u64 {
        self.delivered
    }

    /// Events scheduled but not yet delivered.
    pub fn pending(&self) -> usize {
        self.queue.len()
    }

    /// The simulation's random number generator (seeded from the scenario).
    pub fn rng(&mut self) -> &mut Pcg64Mcg {
        &mut self.rng
    }

    /// A new random stream for one entity of a model (a task, a client), seeded from the
    /// simulation's. Drawing an entity's randomness from its own stream keeps its workload the
    /// same when timing changes the order entities act in (common random numbers), so that
    /// runs comparing mechanisms or policies compare them on the same work.
    pub fn split_rng(&mut self) -> Pcg64Mcg {
        Pcg64Mcg::seed_from_u64(self.rng.gen())
    }

    /// Schedules `event` at absolute time `at`. A time in the past is delivered now: time never
    /// runs backwards.
    pub fn schedule_at(&mut self, at: Ps, event: E) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.queue.push(Pending { at: at.max(self.now), seq, event });
    }

    /// Schedules `event` `delay` picoseconds from now.
    pub fn schedule_in(&mut self, delay: Ps, event: E) {
        self.schedule_at(self.now.saturating_add(delay), event);
    }

    /// Time `cpu` takes for `work` (picoseconds at full speed) if it starts now: its speed,
    /// slowed by the SMT interference factor while a sibling hardware thread is busy.
    pub fn exec(&self, cpu: usize, work: Ps) -> Ps {
        let sibling_busy = self.machine.cpu(cpu).siblings.iter().any(|&s| self.stats.cores.is_busy(s));
        self.machine.exec(cpu, work, sibling_busy)
    }

    /// Removes the next event and advances the clock to it.
    fn pop(&mut self) -> Option<E> {
        let next = self.queue.pop()?;
        self.now = next.at;
        self.stats.now = self.now;
        self.delivered += 1;
        Some(next.event)
    }

    fn next_time(&self) -> Option<Ps> {
        self.queue.peek().map(|p| p.at)
    }
}

/// A workload model: it reacts to its own events and reports what it measured.
///
/// See the crate documentation ("How to add a model") for the full recipe.
///
/// # Examples
/// A model that completes one operation every 10 ns, three times:
/// ```
/// use corehop_sim::{ns_to_ps, run, CostModel, Limits, Model, ModelReport, Sim, SimMachine, Stop};
///
/// struct Ticks {
///     left: u32,
/// }
///
/// impl Model for Ticks {
///     type Event = ();
///     fn start(&mut self, sim: &mut Sim<()>) {
///         sim.schedule_in(ns_to_ps(10.0), ());
///     }
///     fn on_event(&mut self, _: (), sim: &mut Sim<()>) {
///         sim.stats.record_op(ns_to_ps(10.0));
///         self.left -= 1;
///         if self.left > 0 {
///             sim.schedule_in(ns_to_ps(10.0), ());
///         }
///     }
///     fn report(&self, _: &Sim<()>) -> ModelReport {
///         ModelReport { op_name: "tick".into(), metrics: Vec::new() }
///     }
/// }
///
/// let machine = corehop_topology::presets::by_name("switch-cs").unwrap();
/// let mut sim = Sim::new(SimMachine::new(machine, CostModel::for_preset("switch-cs")), 1);
/// let stop = run(&mut Ticks { left: 3 }, &mut sim, Limits::default(), &mut |_| {});
/// assert_eq!((stop, sim.now(), sim.stats.ops.count_until(sim.now())), (Stop::Drained, ns_to_ps(30.0), 3));
/// ```
pub trait Model {
    /// The model's event type (usually a small `Copy` enum).
    type Event;

    /// Schedules the first events (called once, at time 0).
    fn start(&mut self, sim: &mut Sim<Self::Event>);

    /// Handles one event at `sim.now()`; may schedule more.
    fn on_event(&mut self, event: Self::Event, sim: &mut Sim<Self::Event>);

    /// Model-specific results, read after the run (the engine adds the common ones).
    fn report(&self, sim: &Sim<Self::Event>) -> crate::stats::ModelReport;
}

/// When a run stops (whichever comes first); the default is "when no event is left".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Stop before delivering an event later than this time.
    pub horizon: Option<Ps>,
    /// Stop after delivering this many events.
    pub max_events: Option<u64>,
}

/// Why a run stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// No event left: the workload finished.
    Drained,
    /// The next event lay beyond the horizon.
    Horizon,
    /// The event budget ran out.
    EventBudget,
}

/// Runs `model` until its events drain or a limit is reached, then closes the per-CPU ledger
/// at the final time. `progress` is called every 65 536 events with the current time.
pub fn run<M: Model>(
    model: &mut M,
    sim: &mut Sim<M::Event>,
    limits: Limits,
    progress: &mut dyn FnMut(Ps),
) -> Stop {
    model.start(sim);
    let stop = loop {
        let Some(at) = sim.next_time() else { break Stop::Drained };
        if limits.horizon.is_some_and(|h| at > h) {
            break Stop::Horizon;
        }
        if limits.max_events.is_some_and(|m| sim.delivered >= m) {
            break Stop::EventBudget;
        }
        let event = sim.pop().expect("peeked an event");
        model.on_event(event, sim);
        if sim.delivered & 0xffff == 0 {
            progress(sim.now);
        }
    };
    let end = match (stop, limits.horizon) {
        (Stop::Horizon, Some(h)) => h,
        _ => sim.now,
    };
    sim.now = end;
    sim.stats.now = end;
    sim.stats.close(end);
    stop
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::tests::uniform_machine;

    /// Records the order events arrive in.
    struct Recorder {
        plan: Vec<(Ps, u32)>,
        seen: Vec<(Ps, u32)>,
    }

    impl Model for Recorder {
        type Event = u32;
        fn start(&mut self, sim: &mut Sim<u32>) {
            for &(at, id) in &self.plan {
                sim.schedule_at(at, id);
            }
        }
        fn on_event(&mut self, id: u32, sim: &mut Sim<u32>) {
            self.seen.push((sim.now(), id));
        }
        fn report(&self, _: &Sim<u32>) -> crate::stats::ModelReport {
            crate::stats::ModelReport::default()
        }
    }

    fn replay(plan: Vec<(Ps, u32)>, limits: Limits) -> (Vec<(Ps, u32)>, Stop, Ps) {
        let mut model = Recorder { plan, seen: Vec::new() };
        let mut sim = Sim::new(uniform_machine(1), 7);
        let stop = run(&mut model, &mut sim, limits, &mut |_| {});
        (model.seen, stop, sim.now())
    }

    #[test]
    fn ties_are_broken_by_scheduling_order() {
        let (seen, stop, _) = replay(vec![(5, 1), (3, 2), (5, 3), (3, 4), (5, 5)], Limits::default());
        assert_eq!(seen, vec![(3, 2), (3, 4), (5, 1), (5, 3), (5, 5)]);
        assert_eq!(stop, Stop::Drained);
    }

    #[test]
    fn horizon_and_event_budget_stop_the_run() {
        let plan = vec![(1, 1), (2, 2), (10, 3)];
        let (seen, stop, end) = replay(plan.clone(), Limits { horizon: Some(5), max_events: None });
        assert_eq!((seen.len(), stop, end), (2, Stop::Horizon, 5));
        let (seen, stop, _) = replay(plan, Limits { horizon: None, max_events: Some(1) });
        assert_eq!((seen.len(), stop), (1, Stop::EventBudget));
    }

    #[test]
    fn time_never_runs_backwards() {
        struct Late;
        impl Model for Late {
            type Event = bool;
            fn start(&mut self, sim: &mut Sim<bool>) {
                sim.schedule_at(100, true);
            }
            fn on_event(&mut self, first: bool, sim: &mut Sim<bool>) {
                if first {
                    sim.schedule_at(10, false); // in the past: delivered at 100
                } else {
                    assert_eq!(sim.now(), 100);
                }
            }
            fn report(&self, _: &Sim<bool>) -> crate::stats::ModelReport {
                crate::stats::ModelReport::default()
            }
        }
        let mut sim = Sim::new(uniform_machine(1), 1);
        run(&mut Late, &mut sim, Limits::default(), &mut |_| {});
        assert_eq!((sim.now(), sim.events_delivered()), (100, 2));
    }

    #[test]
    fn ns_conversions_round_and_clamp() {
        assert_eq!(ns_to_ps(1.2345), 1235);
        assert_eq!(ns_to_ps(-3.0), 0);
        assert_eq!(ns_to_ps(f64::NAN), 0);
        assert_eq!(ps_to_ns(2500), 2.5);
    }

    proptest::proptest! {
        #[test]
        fn delivery_is_sorted_by_time_then_seq(times in proptest::collection::vec(0u64..50, 0..200)) {
            let plan: Vec<(Ps, u32)> = times.iter().enumerate().map(|(i, &t)| (t, i as u32)).collect();
            let (seen, _, _) = replay(plan.clone(), Limits::default());
            let mut expected = plan;
            expected.sort_by_key(|&(t, id)| (t, id));
            proptest::prop_assert_eq!(seen, expected);
        }
    }
}
