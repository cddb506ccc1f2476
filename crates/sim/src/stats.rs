//! What every model measures the same way: per-CPU busy/idle time, hops, queueing delay and
//! completed operations, plus [`RunQueues`], the one-job-at-a-time CPU most models need.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use serde::Serialize;

use crate::engine::{ps_to_ns, Ps, Sim};

/// One interval during which a CPU was busy (recorded only when tracing is on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// The CPU (dense index into the machine's CPU list).
    pub cpu: usize,
    /// When it became busy, ps of virtual time.
    pub start: Ps,
    /// When it became idle again, ps of virtual time.
    pub end: Ps,
}

#[derive(Debug, Clone, Copy)]
struct CpuAccount {
    busy: bool,
    since: Ps,
    busy_total: Ps,
    idle_total: Ps,
    /// How long this CPU polls when it next goes idle, before it sleeps.
    poll_budget: Ps,
    /// The budget of the current idle gap (fixed when the gap began).
    gap_budget: Ps,
    poll_total: Ps,
}

impl CpuAccount {
    fn end_gap(&mut self, now: Ps) {
        let gap = now - self.since;
        self.idle_total += gap;
        self.poll_total += gap.min(self.gap_budget);
    }
}

/// Per-CPU busy/idle accounting. Every CPU is idle at time 0; models flip CPUs between busy
/// and idle as work starts and stops; [`CoreLedger::close`] ends the open interval, so that
/// afterwards `busy + idle == elapsed` for every CPU.
///
/// Idle time is split further: an idle CPU first polls for its poll budget
/// ([`CoreLedger::set_poll_budget`], 0 by default: it sleeps at once), then sleeps. Polling is
/// idle time that still burns the core (what V4 costs in power).
#[derive(Debug, Clone)]
pub struct CoreLedger {
    cpus: Vec<CpuAccount>,
    trace: Option<Vec<Segment>>,
    closed_at: Option<Ps>,
}

impl CoreLedger {
    fn new(cpus: usize) -> CoreLedger {
        let idle = CpuAccount {
            busy: false,
            since: 0,
            busy_total: 0,
            idle_total: 0,
            poll_budget: 0,
            gap_budget: 0,
            poll_total: 0,
        };
        CoreLedger { cpus: vec![idle; cpus], trace: None, closed_at: None }
    }

    fn account(&mut self, cpu: usize) -> &mut CpuAccount {
        let n = self.cpus.len();
        self.cpus.get_mut(cpu).unwrap_or_else(|| panic!("model used cpu {cpu}, machine has {n}"))
    }

    /// Marks `cpu` busy from `now` (no effect if it already is).
    pub fn set_busy(&mut self, cpu: usize, now: Ps) {
        let a = self.account(cpu);
        if !a.busy {
            a.end_gap(now);
            a.busy = true;
            a.since = now;
        }
    }

    /// Marks `cpu` idle from `now` (no effect if it already is).
    pub fn set_idle(&mut self, cpu: usize, now: Ps) {
        let a = self.account(cpu);
        if a.busy {
            let start = a.since;
            a.busy_total += now - start;
            a.busy = false;
            a.since = now;
            a.gap_budget = a.poll_budget;
            if let Some(trace) = &mut self.trace {
                trace.push(Segment { cpu, start, end: now });
            }
        }
    }

    /// Whether `cpu` is busy now.
    pub fn is_busy(&self, cpu: usize) -> bool {
        self.cpus[cpu].busy
    }

    /// When `cpu` last became idle, if it is idle now.
    pub fn idle_since(&self, cpu: usize) -> Option<Ps> {
        let a = &self.cpus[cpu];
        (!a.busy).then_some(a.since)
    }

    /// How long `cpu` polls in its next idle gap before it sleeps (`Ps::MAX`: never sleeps).
    /// The budget of a gap is fixed when the gap begins. At time 0 every CPU is idle with a
    /// budget of 0; setting a budget on an idle CPU applies to its current gap too.
    pub fn set_poll_budget(&mut self, cpu: usize, budget: Ps) {
        let a = self.account(cpu);
        a.poll_budget = budget;
        if !a.busy && a.since == 0 {
            a.gap_budget = budget;
        }
    }

    /// Whether `cpu` is idle and still polling at time `at` (not yet asleep): its gap so far
    /// is within the gap's budget, the rule `corehop_policy::spin` assumes.
    pub fn is_polling(&self, cpu: usize, at: Ps) -> bool {
        let a = &self.cpus[cpu];
        !a.busy && at.saturating_sub(a.since) <= a.gap_budget
    }

    /// Total time `cpu` spent polling while idle (part of [`CoreLedger::idle`]).
    pub fn polled(&self, cpu: usize) -> Ps {
        self.cpus[cpu].poll_total
    }

    /// Total busy time of `cpu` (complete after [`CoreLedger::close`]).
    pub fn busy(&self, cpu: usize) -> Ps {
        self.cpus[cpu].busy_total
    }

    /// Total idle time of `cpu` (complete after [`CoreLedger::close`]).
    pub fn idle(&self, cpu: usize) -> Ps {
        self.cpus[cpu].idle_total
    }

    /// Number of CPUs accounted for.
    pub fn cpu_count(&self) -> usize {
        self.cpus.len()
    }

    /// Starts recording every busy interval (for tests and timelines).
    pub fn enable_trace(&mut self) {
        self.trace.get_or_insert_with(Vec::new);
    }

    /// The busy intervals recorded since [`CoreLedger::enable_trace`].
    pub fn trace(&self) -> &[Segment] {
        self.trace.as_deref().unwrap_or(&[])
    }

    /// Ends the run at `end`: closes every open interval.
    pub fn close(&mut self, end: Ps) {
        for cpu in 0..self.cpus.len() {
            if self.cpus[cpu].busy {
                self.set_idle(cpu, end);
                self.cpus[cpu].busy = true; // still running at the end, for anyone who asks
            } else {
                let a = &mut self.cpus[cpu];
                a.end_gap(end);
                a.since = end;
            }
        }
        self.closed_at = Some(end);
    }
}

/// Hop counts: how many times work moved from one CPU to another, and what it cost.
#[derive(Debug, Clone, Default)]
pub struct HopStats {
    /// Hops by (from, to) CPU.
    pub by_route: BTreeMap<(usize, usize), u64>,
    /// Sum of the time each hop took from leaving the source to running on the target.
    pub total_cost: Ps,
}

impl HopStats {
    /// All hops.
    pub fn count(&self) -> u64 {
        self.by_route.values().sum()
    }
}

/// Durations kept for a [`Summary`], in bounded memory: count, sum and maximum exactly, and for
/// the percentiles every sample up to [`Samples::KEPT`], then a uniform sample of that many
/// (reservoir sampling with a fixed seed, so a run stays reproducible). A run of a billion
/// operations would otherwise keep 16 GB of them.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    kept: Vec<Ps>,
    count: u64,
    sum: u128,
    max: Ps,
    /// The reservoir's random state (xorshift64*), seeded at the first sample past the bound.
    rng: u64,
}

impl Samples {
    /// Samples kept for the percentiles: 32 MiB each. Past it a percentile's rank is off by
    /// about 1/sqrt(KEPT) of the count (0.05 %).
    pub const KEPT: usize = 1 << 22;

    /// Adds one duration.
    pub fn push(&mut self, sample: Ps) {
        self.count += 1;
        self.sum += u128::from(sample);
        self.max = self.max.max(sample);
        if self.kept.len() < Self::KEPT {
            self.kept.push(sample);
            return;
        }
        // Algorithm R: the n-th sample replaces a kept one with chance KEPT / n.
        if self.rng == 0 {
            self.rng = 0x9e37_79b9_7f4a_7c15;
        }
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let draw = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) % self.count;
        if let Some(slot) = usize::try_from(draw).ok().and_then(|i| self.kept.get_mut(i)) {
            *slot = sample;
        }
    }

    /// How many durations were added.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The durations kept for the percentiles (all of them, up to [`Samples::KEPT`]).
    pub fn kept(&self) -> &[Ps] {
        &self.kept
    }

    /// Their summary; `None` when empty.
    pub fn summary(&self) -> Option<Summary> {
        let mut kept = Summary::of(&self.kept)?;
        kept.count = self.count;
        kept.mean_ns = self.sum as f64 / self.count as f64 / 1e3;
        kept.max_ns = ps_to_ns(self.max);
        Some(kept)
    }
}

/// Operation latencies: [`Samples`] of the operations complete so far, and those recorded
/// ahead of their completion, which count once the clock reaches it.
#[derive(Debug, Clone, Default)]
pub struct Ops {
    done: Samples,
    /// (completion time, latency), the soonest first.
    ahead: BinaryHeap<Reverse<(Ps, Ps)>>,
}

impl Ops {
    /// Counts every operation recorded ahead that completes by `now`.
    fn complete_until(&mut self, now: Ps) {
        while let Some(&Reverse((at, latency))) = self.ahead.peek() {
            if at > now {
                break;
            }
            self.ahead.pop();
            self.done.push(latency);
        }
    }

    /// Operations complete by `now` (recorded ahead or not).
    pub fn count_until(&self, now: Ps) -> u64 {
        self.done.count() + self.ahead.iter().filter(|Reverse((at, _))| *at <= now).count() as u64
    }

    /// The latencies of the operations complete by `now`.
    pub fn until(&self, now: Ps) -> Samples {
        let mut ops = self.clone();
        ops.complete_until(now);
        ops.done
    }
}

/// Everything the engine measures for every model.
#[derive(Debug, Clone)]
pub struct Stats {
    /// Busy/idle time of every CPU.
    pub cores: CoreLedger,
    /// Every hop recorded with [`Stats::record_hop`].
    pub hops: HopStats,
    /// Time each job waited in a run queue before it started (0 when it started at once).
    pub queue_delays: Samples,
    /// The latency of each operation (what an operation is, the model says). A model may
    /// record an operation ahead of time, when it already knows when it will complete; the
    /// report counts only those complete by the end of the run.
    pub ops: Ops,
    /// The engine's clock, kept here so that recording needs no time argument.
    pub(crate) now: Ps,
}

impl Stats {
    pub(crate) fn new(cpus: usize) -> Stats {
        Stats {
            cores: CoreLedger::new(cpus),
            hops: HopStats::default(),
            queue_delays: Samples::default(),
            ops: Ops::default(),
            now: 0,
        }
    }

    /// Records a hop from `from` to `to` that took `cost` from departure to running.
    pub fn record_hop(&mut self, from: usize, to: usize, cost: Ps) {
        *self.hops.by_route.entry((from, to)).or_insert(0) += 1;
        self.hops.total_cost += cost;
    }

    /// Records one operation that completed now (at the time of the event being handled)
    /// after taking `latency`.
    pub fn record_op(&mut self, latency: Ps) {
        self.ops.complete_until(self.now);
        self.ops.done.push(latency);
    }

    /// Records one operation that will complete at `completed_at` (now or later) after taking
    /// `latency`; it counts only if the run gets that far.
    pub fn record_op_at(&mut self, completed_at: Ps, latency: Ps) {
        self.ops.complete_until(self.now);
        if completed_at <= self.now {
            self.ops.done.push(latency);
        } else {
            self.ops.ahead.push(Reverse((completed_at, latency)));
        }
    }

    pub(crate) fn close(&mut self, end: Ps) {
        self.cores.close(end);
    }
}

/// Mean, median, 99th percentile and maximum of a set of durations, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    /// How many durations were summarised.
    pub count: u64,
    /// Their mean, ns.
    pub mean_ns: f64,
    /// Their median (nearest rank), ns.
    pub p50_ns: f64,
    /// Their 99th percentile (nearest rank), ns.
    pub p99_ns: f64,
    /// The longest, ns.
    pub max_ns: f64,
}

impl Summary {
    /// Summarises `samples` (picoseconds); `None` when empty.
    pub fn of(samples: &[Ps]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort_unstable();
        let n = v.len();
        let rank = |p: f64| v[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
        let sum: u128 = v.iter().map(|&x| x as u128).sum();
        Some(Summary {
            count: n as u64,
            mean_ns: sum as f64 / n as f64 / 1e3,
            p50_ns: ps_to_ns(rank(0.5)),
            p99_ns: ps_to_ns(rank(0.99)),
            max_ns: ps_to_ns(v[n - 1]),
        })
    }
}

/// A named model-specific result ("ns per call", "calls hopped", ...).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metric {
    /// What is measured, as printed ("ns per call", "throughput").
    pub name: String,
    /// The figure, in `unit`.
    pub value: f64,
    /// Its unit as printed ("ns", "Gbit/s", "fraction", "tasks").
    pub unit: String,
}

impl Metric {
    /// A metric called `name` worth `value` in `unit`.
    pub fn new(name: impl Into<String>, value: f64, unit: impl Into<String>) -> Metric {
        Metric { name: name.into(), value, unit: unit.into() }
    }
}

/// What a model reports besides the common statistics. The first metric is the headline: the
/// one number a sweep's pivot table and plot show.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ModelReport {
    /// What one completed operation is ("gettid call", "request", ...).
    pub op_name: String,
    /// The model's figures, headline first.
    pub metrics: Vec<Metric>,
}

/// A CPU's line in the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuReport {
    /// The CPU (dense index into the machine's CPU list).
    pub cpu: usize,
    /// Its core class in lower case (`"big"`, `"little"`, `"uniform"`).
    pub class: String,
    /// Its effective speed (hardware × emulated), relative to full speed 1.0.
    pub speed: f64,
    /// Time it ran something, ns of virtual time.
    pub busy_ns: f64,
    /// Time it had nothing to run, ns of virtual time (polling included).
    pub idle_ns: f64,
    /// The part of the idle time spent polling (the core stays powered).
    pub poll_ns: f64,
    /// busy / elapsed (0 when nothing elapsed).
    pub busy_fraction: f64,
}

/// The result of one simulation run. Its JSON form is the stable output of `corehop sim --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The scenario's name (its `name` key, else the file stem).
    pub scenario: String,
    /// The model that ran (`[workload] kind`).
    pub kind: String,
    /// The machine's name.
    pub machine: String,
    /// The seed of the run's RNG.
    pub seed: u64,
    /// Why the run stopped.
    pub stop: crate::engine::Stop,
    /// Virtual time from start to stop, ns.
    pub elapsed_ns: f64,
    /// Events the engine delivered.
    pub events: u64,
    /// Operations completed by the end of the run (what an operation is: `model.op_name`).
    pub ops: u64,
    /// Completed operations per second of simulated time.
    pub throughput_per_s: f64,
    /// Latency of the completed operations; `None` when there were none.
    pub op_latency: Option<Summary>,
    /// Time jobs waited in a run queue before starting; `None` when no job went through one.
    pub queue_delay: Option<Summary>,
    /// Hops recorded, all routes together.
    pub hops: u64,
    /// Mean time per hop from leaving the source CPU to running on the target.
    pub hop_cost_ns: Option<f64>,
    /// One line per CPU, in CPU order.
    pub cpus: Vec<CpuReport>,
    /// The model's own figures.
    pub model: ModelReport,
}

impl Report {
    /// Collects the common statistics of a finished run plus the model's own.
    pub fn collect<E>(
        scenario: &str,
        kind: &str,
        seed: u64,
        stop: crate::engine::Stop,
        sim: &Sim<E>,
        model: ModelReport,
    ) -> Report {
        let elapsed = sim.now();
        let cores = &sim.stats.cores;
        let cpus = (0..cores.cpu_count())
            .map(|cpu| {
                let info = sim.machine.cpu(cpu);
                CpuReport {
                    cpu,
                    class: format!("{:?}", info.class).to_lowercase(),
                    speed: info.speed,
                    busy_ns: ps_to_ns(cores.busy(cpu)),
                    idle_ns: ps_to_ns(cores.idle(cpu)),
                    poll_ns: ps_to_ns(cores.polled(cpu)),
                    busy_fraction: if elapsed == 0 { 0.0 } else { cores.busy(cpu) as f64 / elapsed as f64 },
                }
            })
            .collect();
        let latencies = sim.stats.ops.until(elapsed);
        let ops = latencies.count();
        let hops = sim.stats.hops.count();
        Report {
            scenario: scenario.to_string(),
            kind: kind.to_string(),
            machine: sim.machine.name().to_string(),
            seed,
            stop,
            elapsed_ns: ps_to_ns(elapsed),
            events: sim.events_delivered(),
            ops,
            throughput_per_s: if elapsed == 0 { 0.0 } else { ops as f64 / (elapsed as f64 * 1e-12) },
            op_latency: latencies.summary(),
            queue_delay: sim.stats.queue_delays.summary(),
            hops,
            hop_cost_ns: (hops > 0).then(|| ps_to_ns(sim.stats.hops.total_cost) / hops as f64),
            cpus,
            model,
        }
    }

    /// The model's headline metric, if it has one.
    pub fn headline(&self) -> Option<&Metric> {
        self.model.metrics.first()
    }
}

#[derive(Debug)]
struct CpuQueue<J> {
    running: bool,
    waiting: VecDeque<(Ps, J)>,
}

/// CPUs that run one job at a time, each with a FIFO of waiting jobs.
///
/// A job holds its CPU from [`RunQueues::submit`] (or being handed the CPU by
/// [`RunQueues::finish`]) until the model calls `finish` for that CPU. The ledger's busy/idle
/// state and the queueing-delay samples are kept up to date here, so models cannot forget them.
#[derive(Debug)]
pub struct RunQueues<J> {
    cpus: Vec<CpuQueue<J>>,
}

impl<J> RunQueues<J> {
    /// One idle CPU with an empty queue per CPU of the machine.
    pub fn new(cpus: usize) -> RunQueues<J> {
        RunQueues { cpus: (0..cpus).map(|_| CpuQueue { running: false, waiting: VecDeque::new() }).collect() }
    }

    /// Offers `job` to `cpu`. Returns the job back if the CPU was free (it is now busy and the
    /// caller starts the job at once); otherwise the job waits in the CPU's queue.
    pub fn submit<E>(&mut self, cpu: usize, job: J, sim: &mut Sim<E>) -> Option<J> {
        let q = &mut self.cpus[cpu];
        if q.running {
            q.waiting.push_back((sim.now(), job));
            None
        } else {
            q.running = true;
            sim.stats.cores.set_busy(cpu, sim.now());
            sim.stats.queue_delays.push(0);
            Some(job)
        }
    }

    /// The job running on `cpu` is done with it. Returns the next waiting job, which now holds
    /// the CPU, or `None` (the CPU goes idle).
    pub fn finish<E>(&mut self, cpu: usize, sim: &mut Sim<E>) -> Option<J> {
        let q = &mut self.cpus[cpu];
        debug_assert!(q.running, "finish on a cpu that runs nothing");
        match q.waiting.pop_front() {
            Some((since, job)) => {
                sim.stats.queue_delays.push(sim.now() - since);
                Some(job)
            }
            None => {
                q.running = false;
                sim.stats.cores.set_idle(cpu, sim.now());
                None
            }
        }
    }

    /// Whether `cpu` is running a job.
    pub fn is_running(&self, cpu: usize) -> bool {
        self.cpus[cpu].running
    }

    /// Jobs waiting (not running) on `cpu`.
    pub fn waiting(&self, cpu: usize) -> usize {
        self.cpus[cpu].waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::tests::uniform_machine;

    #[test]
    fn ledger_busy_plus_idle_is_elapsed() {
        let mut l = CoreLedger::new(2);
        l.enable_trace();
        l.set_busy(0, 10);
        l.set_busy(0, 12); // already busy: no effect
        l.set_idle(0, 30);
        l.set_busy(1, 50);
        l.close(100);
        assert_eq!((l.busy(0), l.idle(0)), (20, 80));
        assert_eq!((l.busy(1), l.idle(1)), (50, 50));
        assert_eq!(
            l.trace(),
            &[Segment { cpu: 0, start: 10, end: 30 }, Segment { cpu: 1, start: 50, end: 100 }]
        );
    }

    #[test]
    fn summary_of_known_samples() {
        let s = Summary::of(&[1000, 2000, 3000, 4000]).unwrap();
        assert_eq!((s.count, s.mean_ns, s.p50_ns, s.p99_ns, s.max_ns), (4, 2.5, 2.0, 4.0, 4.0));
        assert!(Summary::of(&[]).is_none());
    }

    #[test]
    fn run_queue_is_fifo_and_records_waits() {
        let mut sim: Sim<()> = Sim::new(uniform_machine(1), 1);
        let mut q = RunQueues::new(1);
        assert_eq!(q.submit(0, 'a', &mut sim), Some('a'));
        assert_eq!(q.submit(0, 'b', &mut sim), None);
        assert_eq!(q.submit(0, 'c', &mut sim), None);
        assert_eq!(q.waiting(0), 2);
        assert_eq!(q.finish(0, &mut sim), Some('b'));
        assert_eq!(q.finish(0, &mut sim), Some('c'));
        assert_eq!(q.finish(0, &mut sim), None);
        assert!(!q.is_running(0));
        assert_eq!(sim.stats.queue_delays.kept(), [0, 0, 0]);
    }

    #[test]
    fn samples_keep_count_mean_and_max_exact_past_their_bound() {
        let mut samples = Samples::default();
        let n = 2 * Samples::KEPT as u64;
        for i in 1..=n {
            samples.push(i * 1000);
        }
        assert_eq!(samples.kept().len(), Samples::KEPT);
        let s = samples.summary().unwrap();
        assert_eq!((s.count, s.max_ns), (n, n as f64));
        assert!((s.mean_ns - (n + 1) as f64 / 2.0).abs() < 1e-6, "{}", s.mean_ns);
        // The kept ones are a uniform sample of all: about half from the second half, and the
        // median near the middle.
        let late = samples.kept().iter().filter(|&&x| x > n / 2 * 1000).count() as f64;
        assert!((late / Samples::KEPT as f64 - 0.5).abs() < 0.01, "{late}");
        assert!((s.p50_ns / (n as f64 / 2.0) - 1.0).abs() < 0.01, "{}", s.p50_ns);
    }

    #[test]
    fn an_operation_recorded_ahead_counts_once_its_time_comes() {
        let mut stats = Stats::new(1);
        stats.now = 10;
        stats.record_op_at(30, 25);
        stats.record_op(5);
        stats.record_op_at(8, 3);
        assert_eq!((stats.ops.count_until(10), stats.ops.count_until(30)), (2, 3));
        stats.now = 40;
        stats.record_op(7);
        let all = stats.ops.until(40);
        assert_eq!((all.count(), all.summary().unwrap().max_ns), (4, 0.025));
    }
}
