//! `kind = "switch"`: the core-switching micro-benchmark (fast-core-switching §5, §7).
//!
//! Tasks start on application CPUs and loop: a compute phase, then a system call drawn from
//! the configured call types (each with a weight and a run-length distribution). A call whose
//! type may hop (`hop = true`, the paper's modified system calls) and whose length reaches
//! `hop_threshold_ns` (the paper's RWThresh) hops to a service ("OS") CPU, runs there and hops
//! back; any other call runs where the task is. With `mechanism = "none"` nothing hops: the
//! no-op baseline. The paper's `gettidbench` is one task, a tiny compute phase and `gettid`
//! hopping on every call.
//!
//! ```toml
//! [workload]
//! kind = "switch"
//! mechanism = "spin"            # none | affinity (V1) | handoff (V2) | fastpath (V3) | spin (V4) | wakeup (V5)
//!                               # | spinpark (poll for corehop_policy::spin's budget, then park)
//! iterations = 10000            # calls per task
//! tasks = 1                     # placed round-robin on app_cpus
//! app_cpus = [0]
//! service_cpus = [1]            # default: every CPU that is not an app CPU
//! compute = 20                  # ns at full speed between calls (a distribution)
//! hop_threshold_ns = 0          # only calls at least this long hop
//! pick = { work_conserving = true, affinity = true, prefer_affinity = false }
//! [[workload.calls]]
//! name = "gettid"
//! length = 100                  # ns at full speed (a distribution)
//! weight = 1.0
//! hop = true
//! memory_bound = 0.0            # share of the length that does not scale with core speed
//! ```
//!
//! A CPU runs one task at a time, without preemption: a task keeps its CPU until it hops away
//! or finishes, and others wait in the CPU's FIFO (that wait is the queueing delay).
//!
//! Per hopped call the events are: `Entry` (end of compute, the call is chosen) → `Left`
//! (source path done) → `Arrive` (at the service CPU) → `CallDone` → `Left` → `Arrive` (home;
//! the call returns).

use serde::Deserialize;

use rand_pcg::Pcg64Mcg;

use corehop_policy::pick::{Candidate, Pick, PickState};
use corehop_policy::spin::{SpinBudget, SpinConfig};
use corehop_topology::CpuId;

use crate::dist::{Distribution, WeightedChoice};
use crate::engine::{ns_to_ps, ps_to_ns, Model, Ps, Sim, PS_PER_NS};
use crate::machine::{HopTiming, Mechanism};
use crate::models::{FromScenario, ModelEntry};
use crate::scenario::{Problem, Scenario, ScenarioError};
use crate::stats::{Metric, ModelReport, RunQueues};

/// Registry entry.
pub const ENTRY: ModelEntry = ModelEntry::of::<Switch>(
    "switch",
    "core-switching micro-benchmark: tasks hop to a service CPU around system calls (V1-V5)",
);

/// Which hop mechanism, or none (the baseline).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HopChoice {
    /// Never hop: every call runs on the task's CPU.
    None,
    /// V1, [`Mechanism::Affinity`]: the kernel's migration thread.
    #[serde(alias = "v1")]
    Affinity,
    /// V2, [`Mechanism::Handoff`]: hand-off through the scheduler, IPI wake.
    #[serde(alias = "v2")]
    Handoff,
    /// V3, [`Mechanism::FastPath`]: scheduler fast paths, IPI wake.
    #[serde(alias = "v3")]
    FastPath,
    /// V4, [`Mechanism::Spin`]: fast paths, idle CPUs poll.
    #[serde(alias = "v4")]
    Spin,
    /// V5, [`Mechanism::Wakeup`]: fast paths, idle CPUs sleep, woken early.
    #[serde(alias = "v5")]
    Wakeup,
    /// The runtime's `Wake::SpinThenPark`: an idle CPU polls for an adaptive budget
    /// (`corehop_policy::spin`), then parks; a hop to a polling CPU costs what V4 does, a hop
    /// to a parked one what V3 does (a futex wake is an IPI and a scheduler pass).
    #[serde(rename = "spinpark", alias = "spin-then-park")]
    SpinThenPark,
}

impl HopChoice {
    fn mechanism(self) -> Option<Mechanism> {
        match self {
            HopChoice::None => None,
            HopChoice::Affinity => Some(Mechanism::Affinity),
            HopChoice::Handoff => Some(Mechanism::Handoff),
            HopChoice::FastPath => Some(Mechanism::FastPath),
            HopChoice::Spin => Some(Mechanism::Spin),
            HopChoice::Wakeup => Some(Mechanism::Wakeup),
            // Decided per hop from the target's state: see `Switch::begin_hop`.
            HopChoice::SpinThenPark => Some(Mechanism::Spin),
        }
    }
}

use super::MAX_TASKS;

/// Which service CPU a hop goes to (the paper's WC / AF / PA settings, §9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PickConfig {
    /// Prefer an idle service CPU over a busy one.
    pub work_conserving: bool,
    /// Prefer the service CPU this task used last (else go round-robin).
    pub affinity: bool,
    /// When both apply, take the task's last CPU even if it is busy.
    pub prefer_affinity: bool,
}

impl Default for PickConfig {
    fn default() -> PickConfig {
        PickConfig { work_conserving: true, affinity: true, prefer_affinity: false }
    }
}

impl From<PickConfig> for Pick {
    fn from(p: PickConfig) -> Pick {
        Pick { work_conserving: p.work_conserving, affinity: p.affinity, prefer_affinity: p.prefer_affinity }
    }
}

/// One system call type.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallConfig {
    /// A label for the type (reports and errors).
    pub name: String,
    /// Relative frequency among the call types.
    #[serde(default = "one")]
    pub weight: f64,
    /// Run length in ns at full speed.
    pub length: Distribution,
    /// Whether this call may hop (the paper modified only some calls).
    #[serde(default = "yes")]
    pub hop: bool,
    /// Share of the length spent waiting for memory (0..=1): that part takes as long on a
    /// slow core as on a fast one. OS code is largely memory-bound, which is why the paper
    /// runs it on simple cores.
    #[serde(default)]
    pub memory_bound: f64,
}

fn one() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}

/// The `[workload]` table of `kind = "switch"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchConfig {
    /// How calls hop, or `none`.
    pub mechanism: HopChoice,
    /// System calls per task (default 10 000).
    #[serde(default = "default_iterations")]
    pub iterations: u64,
    /// Tasks, placed round-robin on `app_cpus` (default 1, at most [`MAX_TASKS`]).
    #[serde(default = "one_task")]
    pub tasks: usize,
    /// CPUs the tasks start on (dense CPU indexes; default `[0]`).
    #[serde(default = "default_app_cpus")]
    pub app_cpus: Vec<usize>,
    /// Service CPUs, the cores that run the OS work calls hop to (dense CPU indexes, as in the
    /// offload model); unset: every CPU not in `app_cpus`. Scenarios may still call it
    /// `os_cpus`.
    #[serde(alias = "os_cpus")]
    pub service_cpus: Option<Vec<usize>>,
    /// Compute phase between calls, ns at full speed (default fixed 20).
    #[serde(default = "default_compute")]
    pub compute: Distribution,
    /// Only calls at least this long hop, ns at full speed (default 0: every hoppable call).
    #[serde(default)]
    pub hop_threshold_ns: f64,
    /// Which service CPU a hop goes to when there are several (default WC + AF).
    #[serde(default)]
    pub pick: PickConfig,
    /// The system call types (default: `gettid`, 100 ns, hopping).
    #[serde(default = "default_calls")]
    pub calls: Vec<CallConfig>,
}

fn default_iterations() -> u64 {
    10_000
}
fn one_task() -> usize {
    1
}
fn default_app_cpus() -> Vec<usize> {
    vec![0]
}
fn default_compute() -> Distribution {
    Distribution::Fixed(20.0)
}
fn default_calls() -> Vec<CallConfig> {
    vec![CallConfig {
        name: "gettid".into(),
        weight: 1.0,
        length: Distribution::Fixed(100.0),
        hop: true,
        memory_bound: 0.0,
    }]
}

/// The events of the switch model; `task` indexes its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The compute phase ended: the task enters a system call.
    Entry {
        /// The task.
        task: u32,
    },
    /// The source half of a hop finished: the task leaves its CPU.
    Left {
        /// The task.
        task: u32,
    },
    /// The task reaches the CPU it hopped to.
    Arrive {
        /// The task.
        task: u32,
    },
    /// The system call finished on the service CPU.
    CallDone {
        /// The task.
        task: u32,
    },
    /// The task finished its last iteration.
    Exit {
        /// The task.
        task: u32,
    },
}

#[derive(Debug, Clone)]
struct Task {
    home: usize,
    cpu: usize,
    done: u64,
    call_started: Ps,
    /// The current call: its type and length (ps at full speed).
    call: (usize, Ps),
    /// The hop in flight: where to, and its timing.
    hop: Option<(usize, HopTiming)>,
    last_os: Option<usize>,
    finished_at: Option<Ps>,
    /// The task's own random stream: its sequence of calls does not depend on timing, so
    /// runs that differ only in mechanism or policy see the same workload.
    rng: Pcg64Mcg,
}

/// The micro-benchmark model.
#[derive(Debug)]
pub struct Switch {
    cfg: SwitchConfig,
    mechanism: Option<Mechanism>,
    service_cpus: Vec<usize>,
    call_mix: WeightedChoice,
    tasks: Vec<Task>,
    cpus: RunQueues<u32>,
    /// Hops on their way to each CPU (they count as load when picking).
    inbound: Vec<usize>,
    pick: Pick,
    cursor: usize,
    /// Per CPU: how long it polls when idle (used with `mechanism = "spinpark"`).
    spin: Vec<SpinBudget>,
    hopped_calls: u64,
    calls_by_type: Vec<u64>,
}

impl FromScenario for Switch {
    fn from_scenario(s: &Scenario) -> Result<Switch, ScenarioError> {
        let cfg: SwitchConfig = s.workload()?;
        let service_cpus = match &cfg.service_cpus {
            Some(list) => list.clone(),
            None => (0..s.machine.cpu_count()).filter(|c| !cfg.app_cpus.contains(c)).collect(),
        };
        s.check_app_and_service_cpus(&cfg.app_cpus, &service_cpus)?;
        if service_cpus.is_empty() && cfg.mechanism != HopChoice::None {
            return Err(s.error(
                "workload.service_cpus",
                Problem::Invalid("no service CPU to hop to (use mechanism = \"none\" for a baseline)".into()),
            ));
        }
        if cfg.iterations == 0 {
            return Err(s.error("workload.iterations", Problem::Invalid("must be at least 1".into())));
        }
        if cfg.tasks == 0 || cfg.tasks > MAX_TASKS {
            return Err(s.error(
                "workload.tasks",
                Problem::Invalid(format!("{} tasks: needs 1 to {MAX_TASKS}", cfg.tasks)),
            ));
        }
        if !(cfg.hop_threshold_ns.is_finite() && cfg.hop_threshold_ns >= 0.0) {
            return Err(
                s.error("workload.hop_threshold_ns", Problem::Negative(cfg.hop_threshold_ns.to_string()))
            );
        }
        s.check_distribution("workload.compute", &cfg.compute)?;
        let call_mix = s.call_mix(cfg.calls.iter().map(|c| (&c.length, c.weight)))?;
        for (i, call) in cfg.calls.iter().enumerate() {
            if !(0.0..=1.0).contains(&call.memory_bound) {
                return Err(s.error(
                    &format!("workload.calls[{i}].memory_bound"),
                    Problem::Invalid(format!("must be in [0, 1], got {:?}", call.memory_bound)),
                ));
            }
        }
        let tasks = (0..cfg.tasks)
            .map(|i| {
                let home = cfg.app_cpus[i % cfg.app_cpus.len()];
                Task {
                    home,
                    cpu: home,
                    done: 0,
                    call_started: 0,
                    call: (0, 0),
                    hop: None,
                    last_os: None,
                    finished_at: None,
                    rng: Pcg64Mcg::new(0),
                }
            })
            .collect();
        Ok(Switch {
            mechanism: cfg.mechanism.mechanism(),
            service_cpus,
            call_mix,
            tasks,
            cpus: RunQueues::new(s.machine.cpu_count()),
            inbound: vec![0; s.machine.cpu_count()],
            pick: cfg.pick.into(),
            cursor: 0,
            spin: vec![SpinBudget::new(SpinConfig::default()); s.machine.cpu_count()],
            hopped_calls: 0,
            calls_by_type: vec![0; cfg.calls.len()],
            cfg,
        })
    }
}

impl Switch {
    /// Per task: (CPU it finished on, iterations done, finish time). For tests.
    pub fn task_outcomes(&self) -> Vec<(usize, u64, Option<Ps>)> {
        self.tasks.iter().map(|t| (t.cpu, t.done, t.finished_at)).collect()
    }

    /// Starts the compute phase of `task` on its (home) CPU, `delay` from now.
    fn compute_then_call(&mut self, task: u32, delay: Ps, sim: &mut Sim<Event>) {
        let t = &mut self.tasks[task as usize];
        let work = ns_to_ps(self.cfg.compute.sample(&mut t.rng));
        let d = sim.exec(t.cpu, work);
        sim.schedule_in(delay + d, Event::Entry { task });
    }

    /// The call returned to user code at `now + delay`: count it, then continue or exit.
    fn call_returned(&mut self, task: u32, delay: Ps, sim: &mut Sim<Event>) {
        let t = &mut self.tasks[task as usize];
        let returned = sim.now() + delay;
        sim.stats.record_op_at(returned, returned - t.call_started);
        t.done += 1;
        if t.done >= self.cfg.iterations {
            sim.schedule_at(returned, Event::Exit { task });
        } else {
            self.compute_then_call(task, delay, sim);
        }
    }

    /// How long the current call of `task` runs on `cpu`: its compute share at the CPU's
    /// speed, its memory-bound share as is.
    fn call_time(&self, task: u32, cpu: usize, sim: &Sim<Event>) -> Ps {
        let (kind, length) = self.tasks[task as usize].call;
        let stalled = (length as f64 * self.cfg.calls[kind].memory_bound).round() as Ps;
        sim.exec(cpu, length - stalled) + stalled
    }

    fn draw_call(&mut self, task: u32) -> (usize, Ps) {
        let rng = &mut self.tasks[task as usize].rng;
        // A single call type draws nothing: the task's stream goes to the call lengths alone.
        let kind = if self.call_mix.len() == 1 { 0 } else { self.call_mix.draw(rng) };
        let length = ns_to_ps(self.cfg.calls[kind].length.sample(rng));
        (kind, length)
    }

    /// Which service CPU a hop of `task` goes to: `corehop_policy::pick`, the same decision
    /// the runtime makes, fed with what this model knows about each service CPU.
    fn choose_service_cpu(&mut self, task: u32) -> usize {
        let candidates: Vec<Candidate> = self
            .service_cpus
            .iter()
            .map(|&c| {
                let load = usize::from(self.cpus.is_running(c)) + self.cpus.waiting(c) + self.inbound[c];
                if load == 0 {
                    Candidate::idle(CpuId(c))
                } else {
                    Candidate::busy(CpuId(c), load)
                }
            })
            .collect();
        let mut state =
            PickState { previous: self.tasks[task as usize].last_os.map(CpuId), cursor: self.cursor };
        let choice = self.pick.pick(&candidates, &mut state).expect("service CPUs were checked non-empty");
        self.cursor = state.cursor;
        choice.0
    }

    /// Begins the hop of `task` from its CPU to `to`; the source path runs now.
    fn begin_hop(&mut self, task: u32, to: usize, sim: &mut Sim<Event>) {
        let from = self.tasks[task as usize].cpu;
        // A CPU another hop is already on its way to is awake by the time this one lands.
        let target_idle = !self.cpus.is_running(to) && self.inbound[to] == 0;
        let timing = if self.cfg.mechanism == HopChoice::SpinThenPark {
            self.spin_then_park(from, to, target_idle, sim)
        } else {
            let mechanism = self.mechanism.expect("only hopping configurations hop");
            sim.machine.hop(mechanism, from, to, target_idle)
        };
        self.tasks[task as usize].hop = Some((to, timing));
        self.inbound[to] += 1;
        sim.schedule_in(timing.src, Event::Left { task });
    }

    /// The timing of a hop under spin-then-park: the target is caught polling if its idle gap
    /// at the moment the source signals is within its budget; otherwise it has parked and
    /// must be woken. The target's `SpinBudget` (the runtime's own policy) learns from the gap
    /// and from the wake-up cost, and sets how long it polls next time.
    fn spin_then_park(
        &mut self,
        from: usize,
        to: usize,
        target_idle: bool,
        sim: &mut Sim<Event>,
    ) -> HopTiming {
        let polling = sim.machine.hop(Mechanism::Spin, from, to, target_idle);
        if !target_idle {
            return polling;
        }
        let signal_at = sim.now() + polling.src;
        let idle_since = sim.stats.cores.idle_since(to).expect("target is idle");
        let caught = sim.stats.cores.is_polling(to, signal_at);
        let parked = sim.machine.hop(Mechanism::FastPath, from, to, true);
        let budget = &mut self.spin[to];
        // Whole nanoseconds, rounded up: a budget fitted to a gap must cover it.
        let ns_up = |ps: Ps| ps.div_ceil(PS_PER_NS);
        budget.observe_idle_gap(ns_up(signal_at - idle_since));
        if !caught {
            budget.observe_wake_cost(ns_up(parked.total().saturating_sub(polling.total())));
        }
        sim.stats.cores.set_poll_budget(to, budget.budget_ns().saturating_mul(PS_PER_NS));
        if caught {
            polling
        } else {
            parked
        }
    }

    /// `task` now holds its CPU (it just arrived, or waited its turn, or starts).
    fn on_cpu(&mut self, task: u32, sim: &mut Sim<Event>) {
        let t = &mut self.tasks[task as usize];
        let Some((to, timing)) = t.hop.take() else {
            // First start at home.
            self.compute_then_call(task, 0, sim);
            return;
        };
        debug_assert_eq!(to, t.cpu);
        let (from, home) = (t.hop_from(), t.home);
        sim.stats.record_hop(from, to, timing.total());
        if to == home {
            self.call_returned(task, timing.dst, sim);
        } else {
            let run = self.call_time(task, to, sim);
            sim.schedule_in(timing.dst + run, Event::CallDone { task });
        }
    }
}

impl Task {
    /// Where the hop in flight came from: the other end of home ↔ service CPU.
    fn hop_from(&self) -> usize {
        if self.cpu == self.home {
            self.last_os.expect("a hop home follows a hop out")
        } else {
            self.home
        }
    }
}

impl Model for Switch {
    type Event = Event;

    fn start(&mut self, sim: &mut Sim<Event>) {
        // Idle CPUs poll forever under V4, for an adaptive budget under spin-then-park, and
        // sleep at once otherwise.
        let budget = |cpu: usize| match self.cfg.mechanism {
            HopChoice::Spin => Ps::MAX,
            HopChoice::SpinThenPark => self.spin[cpu].budget_ns().saturating_mul(PS_PER_NS),
            _ => 0,
        };
        for cpu in 0..sim.machine.cpu_count() {
            sim.stats.cores.set_poll_budget(cpu, budget(cpu));
        }
        for t in &mut self.tasks {
            t.rng = sim.split_rng();
        }
        for task in 0..self.tasks.len() as u32 {
            let home = self.tasks[task as usize].home;
            if let Some(task) = self.cpus.submit(home, task, sim) {
                self.on_cpu(task, sim);
            }
        }
    }

    fn on_event(&mut self, event: Event, sim: &mut Sim<Event>) {
        match event {
            Event::Entry { task } => {
                let call = self.draw_call(task);
                self.calls_by_type[call.0] += 1;
                let t = &mut self.tasks[task as usize];
                t.call_started = sim.now();
                t.call = call;
                let cpu = t.cpu;
                let spec = &self.cfg.calls[call.0];
                let hops =
                    self.mechanism.is_some() && spec.hop && call.1 >= ns_to_ps(self.cfg.hop_threshold_ns);
                if hops {
                    self.hopped_calls += 1;
                    let to = self.choose_service_cpu(task);
                    self.begin_hop(task, to, sim);
                } else {
                    let run = self.call_time(task, cpu, sim);
                    self.call_returned(task, run, sim);
                }
            }
            Event::CallDone { task } => {
                let home = self.tasks[task as usize].home;
                self.begin_hop(task, home, sim);
            }
            Event::Left { task } => {
                let t = &mut self.tasks[task as usize];
                let from = t.cpu;
                let (to, timing) = t.hop.expect("a hop is in flight");
                if to != t.home {
                    t.last_os = Some(to);
                }
                if let Some(next) = self.cpus.finish(from, sim) {
                    self.on_cpu(next, sim);
                }
                self.tasks[task as usize].cpu = to;
                sim.schedule_in(timing.transit, Event::Arrive { task });
            }
            Event::Arrive { task } => {
                let cpu = self.tasks[task as usize].cpu;
                self.inbound[cpu] -= 1;
                if let Some(task) = self.cpus.submit(cpu, task, sim) {
                    self.on_cpu(task, sim);
                }
            }
            Event::Exit { task } => {
                let t = &mut self.tasks[task as usize];
                t.finished_at = Some(sim.now());
                if let Some(next) = self.cpus.finish(t.cpu, sim) {
                    self.on_cpu(next, sim);
                }
            }
        }
    }

    fn report(&self, sim: &Sim<Event>) -> ModelReport {
        let finished: Vec<Ps> = self.tasks.iter().filter_map(|t| t.finished_at).collect();
        let per_call = if finished.is_empty() || self.cfg.iterations == 0 {
            f64::NAN
        } else {
            finished.iter().map(|&f| ps_to_ns(f)).sum::<f64>()
                / finished.len() as f64
                / self.cfg.iterations as f64
        };
        let calls: u64 = self.calls_by_type.iter().sum();
        let mut metrics = vec![
            Metric::new("ns per call", per_call, "ns"),
            Metric::new(
                "calls hopped",
                if calls == 0 { 0.0 } else { self.hopped_calls as f64 / calls as f64 },
                "fraction",
            ),
            Metric::new("tasks finished", finished.len() as f64, "tasks"),
        ];
        let hops = sim.stats.hops.count();
        if hops > 0 {
            metrics.push(Metric::new("ns per hop", ps_to_ns(sim.stats.hops.total_cost) / hops as f64, "ns"));
        }
        ModelReport { op_name: "system call".into(), metrics }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::simulate;
    use crate::scenario::ScenarioDoc;
    use crate::stats::Report;

    fn scenario(workload: &str) -> Scenario {
        let text = format!("[machine]\npreset = \"switch-cc\"\n[workload]\nkind = \"switch\"\n{workload}");
        ScenarioDoc::parse("t.toml", &text).unwrap().validate().unwrap()
    }

    fn run(workload: &str) -> (Report, Switch, Sim<Event>) {
        let s = scenario(workload);
        let mut m = Switch::from_scenario(&s).unwrap();
        let (r, sim) = simulate(&s, &mut m, true, &mut |_| {});
        (r, m, sim)
    }

    #[test]
    fn baseline_by_hand() {
        // 3 calls of 100 ns after 20 ns of compute each, on a full-speed CPU: 360 ns.
        let (r, m, sim) = run("mechanism = \"none\"\niterations = 3");
        assert_eq!(sim.now(), 360_000);
        assert_eq!((r.ops, r.hops), (3, 0));
        assert_eq!(r.headline().unwrap().value, 120.0);
        assert_eq!(m.task_outcomes(), vec![(0, 3, Some(360_000))]);
        assert_eq!((sim.stats.cores.busy(0), sim.stats.cores.busy(1)), (360_000, 0));
    }

    #[test]
    fn one_spin_round_trip_by_hand() {
        // switch-cc: fast path 212 + 212 ns, 16 lines × 30 ns of task state, poll notice 30 ns,
        // no capacity misses (128 KiB of L1). Out: 212 | 30 | 212 + 480; call 100; back the same.
        let (r, _, sim) = run("mechanism = \"spin\"\niterations = 1\ncompute = 0");
        let hop = 212 + 30 + 212 + 480;
        assert_eq!(sim.now(), (2 * hop + 100) * 1000);
        assert_eq!(r.hops, 2);
        assert_eq!(r.hop_cost_ns, Some(hop as f64));
        // cpu0: source path out, then target path back; cpu1: target path + call + source path.
        assert_eq!(sim.stats.cores.busy(0), (212 + 212 + 480) * 1000);
        assert_eq!(sim.stats.cores.busy(1), (212 + 480 + 100 + 212) * 1000);
    }

    #[test]
    fn long_calls_hop_and_short_ones_stay() {
        let w = "mechanism = \"fastpath\"\niterations = 200\nhop_threshold_ns = 1000\n\
                 calls = [{ name = \"read\", length = 5000 }, { name = \"gettid\", length = 50 }, \
                          { name = \"fsync\", length = 9000, hop = false }]";
        let (r, m, _) = run(w);
        let hopped = r.model.metrics.iter().find(|x| x.name == "calls hopped").unwrap().value;
        assert_eq!(r.hops, (2.0 * hopped * 200.0).round() as u64);
        assert!(hopped > 0.2 && hopped < 0.5, "{hopped}");
        assert_eq!(m.calls_by_type.iter().sum::<u64>(), 200);
    }

    #[test]
    fn tasks_share_a_cpu_and_queue() {
        let (r, m, sim) = run("mechanism = \"spin\"\niterations = 50\ntasks = 3");
        assert_eq!(r.ops, 150);
        assert!(m.task_outcomes().iter().all(|&(cpu, done, f)| cpu == 0 && done == 50 && f.is_some()));
        assert!(r.queue_delay.unwrap().max_ns > 0.0);
        assert_eq!(sim.stats.cores.busy(0) + sim.stats.cores.idle(0), sim.now());
    }

    #[test]
    fn pick_spreads_over_idle_service_cpus() {
        let text =
            "[machine]\npreset = \"switch-cccc\"\n[workload]\nkind = \"switch\"\nmechanism = \"spin\"\n\
                    iterations = 20\ntasks = 2\napp_cpus = [0, 1]\nos_cpus = [2, 3]";
        let s = ScenarioDoc::parse("t.toml", text).unwrap().validate().unwrap();
        let mut m = Switch::from_scenario(&s).unwrap();
        let (_, sim) = simulate(&s, &mut m, false, &mut |_| {});
        let routes = &sim.stats.hops.by_route;
        assert_eq!(routes.get(&(0, 2)), Some(&20));
        assert_eq!(routes.get(&(1, 3)), Some(&20));
    }

    #[test]
    fn spin_then_park_polls_for_short_gaps_and_parks_for_long_ones() {
        let headline = |r: &Report| r.headline().unwrap().value;
        // Gaps of ~1 µs: after the first (shorter) gap has taught it a too-short budget once,
        // the service CPU is always caught polling: V4's cost, V4's polling.
        let (spin, _, _) = run("mechanism = \"spin\"\niterations = 100");
        let (spinpark, _, _) = run("mechanism = \"spinpark\"\niterations = 100");
        assert!(headline(&spinpark) - headline(&spin) < 0.01 * headline(&spin));
        assert!(spinpark.cpus[1].poll_ns > 0.95 * spin.cpus[1].poll_ns);

        // 1 ms between calls: the service CPU learns to park at once (its gaps are long) while
        // the application CPU keeps polling (its task is back within ~1 µs). So a hop out costs
        // what V3's does and a hop home what V4's does; V4 polls through every gap.
        let long = "iterations = 100\ncompute = 1000000";
        let (spin, _, _) = run(&format!("mechanism = \"spin\"\n{long}"));
        let (spinpark, _, _) = run(&format!("mechanism = \"spinpark\"\n{long}"));
        let (fastpath, _, _) = run(&format!("mechanism = \"fastpath\"\n{long}"));
        let cost = |r: &Report| r.hop_cost_ns.unwrap();
        let halfway = (cost(&spin) + cost(&fastpath)) / 2.0;
        assert!((cost(&spinpark) - halfway).abs() < 0.02 * halfway, "{} vs {halfway}", cost(&spinpark));
        assert!(spinpark.cpus[0].poll_ns > 0.95 * spinpark.cpus[0].idle_ns, "{:?}", spinpark.cpus[0]);
        assert!(spin.cpus[1].poll_ns > 0.99 * spin.cpus[1].idle_ns);
        assert!(spinpark.cpus[1].poll_ns < 0.01 * spinpark.cpus[1].idle_ns, "{:?}", spinpark.cpus[1]);
        assert_eq!(fastpath.cpus[1].poll_ns, 0.0);
    }

    #[test]
    fn policies_are_compared_on_the_same_random_workload() {
        let text = |pick: &str| {
            format!(
                "[machine]\npreset = \"switch-ccss\"\n[workload]\nkind = \"switch\"\nmechanism = \"spin\"\n\
                 iterations = 300\ntasks = 4\napp_cpus = [0, 1]\ncompute = {{ exponential = 500 }}\n\
                 hop_threshold_ns = 1000\npick = {pick}\n\
                 calls = [{{ name = \"a\", length = {{ exponential = 1500 }} }}, {{ name = \"b\", length = 200 }}]"
            )
        };
        let run_with = |pick: &str| {
            let s = ScenarioDoc::parse("t.toml", &text(pick)).unwrap().validate().unwrap();
            let mut m = Switch::from_scenario(&s).unwrap();
            let (r, _) = simulate(&s, &mut m, false, &mut |_| {});
            (r, m.calls_by_type.clone())
        };
        let (wc, wc_calls) = run_with("{ work_conserving = true, affinity = false }");
        let (rr, rr_calls) = run_with("{ work_conserving = false, affinity = false }");
        // Same calls, same lengths, so the same calls hop; only where they go and when differ.
        assert_eq!((wc_calls, wc.hops), (rr_calls, rr.hops));
        assert_ne!(wc.elapsed_ns, rr.elapsed_ns);
    }

    #[test]
    fn bad_workloads_are_named() {
        let s = scenario("mechanism = \"spin\"\nos_cpus = [5]");
        let e = Switch::from_scenario(&s).unwrap_err();
        assert_eq!(e.key, "workload.service_cpus[0]");
        assert!(matches!(e.problem, Problem::CpuOutOfRange { cpu: 5, count: 2, .. }));
        let e = Switch::from_scenario(&scenario("mechanism = \"warp\"")).unwrap_err();
        assert_eq!(e.key, "workload.mechanism");
        let e = Switch::from_scenario(&scenario("mechanism = \"v4\"\ncompute = -4")).unwrap_err();
        assert_eq!((e.key.as_str(), matches!(e.problem, Problem::Negative(_))), ("workload.compute", true));
        let e = Switch::from_scenario(&scenario(
            "mechanism = \"v4\"\ncalls = [{ name = \"x\", length = 1, wieght = 2 }]",
        ))
        .unwrap_err();
        assert_eq!(
            (e.key.as_str(), matches!(e.problem, Problem::UnknownKey(_))),
            ("workload.calls[0].wieght", true)
        );
        let e = Switch::from_scenario(&scenario("mechanism = \"v4\"\napp_cpus = [0, 1]")).unwrap_err();
        assert_eq!(e.key, "workload.service_cpus");
    }

    #[test]
    fn service_cpus_may_still_be_called_os_cpus() {
        let old = Switch::from_scenario(&scenario("mechanism = \"spin\"\nos_cpus = [1]")).unwrap();
        assert_eq!(old.service_cpus, [1]);
        let e = Switch::from_scenario(&scenario("mechanism = \"spin\"\nos_cpus = [1]\nservice_cpus = [1]"));
        assert!(e.is_err(), "both names at once are one key given twice");
    }
}
