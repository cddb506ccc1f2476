//! `kind = "smt"`: SMT modes (smt-asymmetric-multiprocessing §4–5): applications on one SMT
//! core in UP, SMP, AMP or hybrid mode, with interrupts arriving at a configurable rate.
//!
//! The model simulates the machine's first SMT core (the paper's machine has one). Its two
//! contexts share the core's throughput: a thread keeps a fraction of its speed that depends on
//! its class and on what the sibling runs (`[workload.interference]`: another class's thread,
//! service work, or nothing). The modes:
//!
//! - `up`: the second context is disabled; everything runs on the first (the baseline);
//! - `smp`: both contexts run threads, and each interrupt's work runs where it lands;
//! - `amp`: threads only on the application context, bottom halves only on the reserved one
//!   (placement by `corehop_policy::smt::SmtLayout`, the runtime's rules);
//! - `hybrid`: `corehop_policy::smt::Hybrid` alternates AMP and SMP in time slices, each
//!   application running in the mode its class prefers; a switch costs `switch_us`.
//!
//! An interrupt (Poisson arrivals, `interrupt_rate_per_s`) lands on a random active context;
//! its top half (`costs.interrupt_ns`) runs there at once. Its bottom half (`bottom_half_ns`)
//! runs there too (UP, SMP) — and the interrupted thread then pays `pollution_ns` to refill its
//! caches and branch predictors — or on the reserved context (AMP), which slows the
//! application context only to `beside_service` of its speed.
//!
//! ```toml
//! [workload]
//! kind = "smt"
//! mode = "amp"                   # up | smp | amp | hybrid
//! interrupt_rate_per_s = 10000   # 0: no interrupts
//! bottom_half_ns = 8000          # a distribution, ns at full speed
//! pollution_ns = 3000            # refill cost of a thread interrupted by a bottom half
//! beside_service = 0.9           # speed a thread keeps while its sibling runs service work
//! service_shared = 0.6           # speed service work keeps beside a thread
//! quantum_us = 10000             # round robin among threads waiting for a context
//! slice_us = 5000                # hybrid: time slice per application in its mode
//! switch_us = 20                 # hybrid: cost of a mode switch (both contexts stop)
//! sequential = false             # true: each application starts when the previous one ends
//! only = "art"                   # optional: run only this application (for sweeps)
//! [workload.interference]        # speed a thread of the row's class keeps beside the column's
//! uni = { uni = 0.49, smt = 0.45, any = 0.47 }
//! smt = { uni = 0.60, smt = 0.65, any = 0.62 }
//! any = { uni = 0.50, smt = 0.55, any = 0.55 }
//! [[workload.apps]]
//! name = "art"
//! class = "uni"                  # uni | smt | any (what the hybrid schedules by)
//! threads = 4
//! iterations = 100               # per thread
//! iteration_ns = 100000          # a distribution, ns of work at full speed
//! ```
//!
//! An iteration's time is the time its thread held a context (running, or stalled there by
//! interrupt work), not time spent waiting for a context: what a per-thread CPU clock shows, as
//! in the paper's Table 6.

use std::collections::VecDeque;

use serde::Deserialize;

use rand::Rng;

use corehop_policy::smt::{Class, Hybrid, HybridConfig, Mode, SmtLayout, Work};
use corehop_topology::CpuId;

use crate::dist::Distribution;
use crate::engine::{ns_to_ps, ps_to_ns, Model, Ps, Sim};
use crate::models::{FromScenario, ModelEntry};
use crate::scenario::{Problem, Scenario, ScenarioError};
use crate::stats::{Metric, ModelReport};

/// Registry entry.
pub const ENTRY: ModelEntry = ModelEntry::of::<SmtModel>(
    "smt",
    "SMT modes: applications on one SMT core in UP / SMP / AMP / hybrid mode under interrupts",
);

/// How the core runs (`mode` in the scenario).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SimMode {
    /// One context only (the second disabled): the uniprocessor baseline.
    Up,
    /// Both contexts run threads; interrupt work runs where it lands.
    Smp,
    /// Threads on the application context only, bottom halves on the reserved one.
    Amp,
    /// AMP and SMP alternating, each application in the mode its class prefers.
    Hybrid,
}

impl SimMode {
    /// The mode as reports print it ("UP", "SMP", "AMP", "hybrid").
    pub fn name(self) -> &'static str {
        match self {
            SimMode::Up => "UP",
            SimMode::Smp => "SMP",
            SimMode::Amp => "AMP",
            SimMode::Hybrid => "hybrid",
        }
    }
}

/// Speeds a thread of one class keeps beside a thread of each class.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row {
    /// Fraction of its speed kept beside a pro-UNI (`uni`) thread.
    pub uni: f64,
    /// Fraction of its speed kept beside a pro-SMP (`smt`) thread.
    pub smt: f64,
    /// Fraction of its speed kept beside an indifferent (`any`) thread.
    pub any: f64,
}

impl Row {
    fn beside(&self, class: Class) -> f64 {
        match class {
            Class::Uni => self.uni,
            Class::Smt => self.smt,
            Class::Any => self.any,
        }
    }
}

/// The class-pair interference table: `row(a).beside(b)` is the speed a class-`a` thread keeps
/// while its sibling runs a class-`b` thread. A row left out keeps its default.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Interference {
    /// What a pro-UNI (`uni`) thread keeps.
    pub uni: Row,
    /// What a pro-SMP (`smt`) thread keeps.
    pub smt: Row,
    /// What an indifferent (`any`) thread keeps.
    pub any: Row,
}

impl Default for Interference {
    /// Shaped on the paper's ART (pro-UNI: two threads make 0.98 of one core) and MESA
    /// (pro-SMP: 1.3), with mixed pairs in between.
    fn default() -> Self {
        Interference {
            uni: Row { uni: 0.49, smt: 0.45, any: 0.47 },
            smt: Row { uni: 0.60, smt: 0.65, any: 0.62 },
            any: Row { uni: 0.50, smt: 0.55, any: 0.55 },
        }
    }
}

impl Interference {
    fn row(&self, class: Class) -> &Row {
        match class {
            Class::Uni => &self.uni,
            Class::Smt => &self.smt,
            Class::Any => &self.any,
        }
    }
}

/// One application: `threads` identical threads of `iterations` iterations each.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppConfig {
    /// A label for reports and for `only`.
    pub name: String,
    /// Which mode it prefers (what the hybrid schedules by).
    pub class: Class,
    /// Identical threads (default 1).
    #[serde(default = "one")]
    pub threads: u32,
    /// Iterations per thread.
    pub iterations: u32,
    /// Work per iteration, ns at full speed.
    pub iteration_ns: Distribution,
}

fn one() -> u32 {
    1
}

/// The `[workload]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmtConfig {
    /// How the core runs.
    pub mode: SimMode,
    /// Mean interrupt arrivals per second of virtual time, Poisson (default 0: none).
    #[serde(default)]
    pub interrupt_rate_per_s: f64,
    /// Bottom-half work of one interrupt, ns at full speed (default fixed 8000).
    #[serde(default = "default_bottom_half")]
    pub bottom_half_ns: Distribution,
    /// Top-half cost; default: the machine's `costs.interrupt_ns`.
    #[serde(default)]
    pub top_half_ns: Option<f64>,
    /// Refill cost of a thread whose context ran a bottom half, ns at full speed (default 3000).
    #[serde(default = "default_pollution")]
    pub pollution_ns: f64,
    /// Fraction of its speed a thread keeps while its sibling runs service work (default 0.9).
    #[serde(default = "default_beside_service")]
    pub beside_service: f64,
    /// Fraction of its speed service work keeps beside a thread (default 0.6).
    #[serde(default = "default_service_shared")]
    pub service_shared: f64,
    /// Round-robin quantum among threads waiting for a context, µs (default 10 000).
    #[serde(default = "default_quantum")]
    pub quantum_us: f64,
    /// Hybrid: time slice of each application in its mode, µs (default 5000).
    #[serde(default = "default_slice")]
    pub slice_us: f64,
    /// Hybrid: pause of both contexts for a mode switch, µs (default 20).
    #[serde(default = "default_switch")]
    pub switch_us: f64,
    /// Whether each application starts only when the previous one has finished (default:
    /// all start together).
    #[serde(default)]
    pub sequential: bool,
    /// Speed a thread keeps beside its sibling's thread, by class pair.
    #[serde(default)]
    pub interference: Interference,
    /// The applications, started in this order.
    pub apps: Vec<AppConfig>,
    /// Run only the application of this name (so a sweep can compare applications).
    #[serde(default)]
    pub only: Option<String>,
}

fn default_bottom_half() -> Distribution {
    Distribution::Fixed(8_000.0)
}
fn default_pollution() -> f64 {
    3_000.0
}
fn default_beside_service() -> f64 {
    0.9
}
fn default_service_shared() -> f64 {
    0.6
}
fn default_quantum() -> f64 {
    10_000.0
}
fn default_slice() -> f64 {
    5_000.0
}
fn default_switch() -> f64 {
    20.0
}

/// The model's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ev {
    /// The current item of context `ctx` completes (stale if `gen` moved on).
    Done {
        /// The context: 0 or 1.
        ctx: u8,
        /// The context's item generation when this was scheduled.
        gen: u32,
    },
    /// Round-robin check on context `ctx`.
    Quantum {
        /// The context: 0 or 1.
        ctx: u8,
        /// The context's quantum generation when this was scheduled.
        gen: u32,
    },
    /// An interrupt arrives.
    Interrupt,
    /// The hybrid's time slice may be over (stale if `gen` moved on).
    Tick {
        /// The slice generation when this was scheduled.
        gen: u32,
    },
    /// A mode switch's pause is over.
    SwitchEnd,
    /// Application `app` starts.
    Start {
        /// Index into `apps`.
        app: u32,
    },
}

/// Interrupt work queued on a context; it preempts the context's thread.
#[derive(Debug, Clone, Copy)]
struct Kernel {
    /// Work left, ps at full speed.
    left: f64,
    arrived: Ps,
    bottom: bool,
}

#[derive(Debug, Clone)]
struct Thread {
    app: u32,
    /// Work left in the current iteration, ps at full speed.
    left: f64,
    iterations_left: u32,
    /// Time held on a context during this iteration so far.
    held: Ps,
    /// Since when it holds its context, if it does.
    since: Option<Ps>,
    /// Interrupted by a bottom half on its context: pays `pollution` when it resumes.
    polluted: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Activity {
    Idle,
    Kernel,
    App(Class),
}

#[derive(Debug, Clone)]
struct Context {
    cpu: usize,
    thread: Option<u32>,
    kernel: VecDeque<Kernel>,
    gen: u32,
    quantum_gen: u32,
    quantum_armed: bool,
    /// Progress rate of the current activity: ps of full-speed work per ps.
    rate: f64,
    last: Ps,
    busy: bool,
}

#[derive(Debug, Clone, Default)]
struct AppRun {
    started: Option<Ps>,
    finished: Option<Ps>,
    threads_left: u32,
}

/// The model state.
pub struct SmtModel {
    cfg: SmtConfig,
    layout: SmtLayout,
    contexts: Vec<Context>,
    cpu_speed: [f64; 2],
    threads: Vec<Thread>,
    ready: VecDeque<u32>,
    apps: Vec<AppRun>,
    hybrid: Option<Hybrid>,
    paused_until: Ps,
    tick_gen: u32,
    top_ps: f64,
    pollution_ps: f64,
    iteration_times: Vec<Ps>,
    bottom_latencies: Vec<Ps>,
    bottoms_on_app_contexts: u64,
    interrupts: u64,
}

impl FromScenario for SmtModel {
    fn from_scenario(scenario: &Scenario) -> Result<SmtModel, ScenarioError> {
        let mut cfg: SmtConfig = scenario.workload()?;
        let invalid = |key: &str, what: String| scenario.error(key, Problem::Invalid(what));
        let fraction = |key: &str, v: f64| {
            if v > 0.0 && v <= 1.0 {
                Ok(())
            } else {
                Err(invalid(key, format!("must be in (0, 1], got {v:?}")))
            }
        };
        let positive = |key: &str, v: f64| {
            if v > 0.0 && v.is_finite() {
                Ok(())
            } else {
                Err(invalid(key, format!("must be > 0, got {v:?}")))
            }
        };
        let non_negative = |key: &str, v: f64| {
            if v >= 0.0 && v.is_finite() {
                Ok(())
            } else {
                Err(scenario.error(key, Problem::Negative(v.to_string())))
            }
        };
        non_negative("workload.interrupt_rate_per_s", cfg.interrupt_rate_per_s)?;
        non_negative("workload.pollution_ns", cfg.pollution_ns)?;
        non_negative("workload.switch_us", cfg.switch_us)?;
        if let Some(top) = cfg.top_half_ns {
            non_negative("workload.top_half_ns", top)?;
        }
        scenario.check_distribution("workload.bottom_half_ns", &cfg.bottom_half_ns)?;
        let top_ns = cfg.top_half_ns.unwrap_or(scenario.machine.costs().interrupt_ns);
        let load = cfg.interrupt_rate_per_s * (top_ns + cfg.bottom_half_ns.mean()) / 1e9;
        if load >= 1.0 {
            return Err(invalid(
                "workload.interrupt_rate_per_s",
                format!(
                    "{} interrupts/s of {:.0} ns each need {:.0} % of a context: more than one, so the \
                     applications would never finish (livelock)",
                    cfg.interrupt_rate_per_s,
                    top_ns + cfg.bottom_half_ns.mean(),
                    load * 100.0
                ),
            ));
        }
        fraction("workload.beside_service", cfg.beside_service)?;
        fraction("workload.service_shared", cfg.service_shared)?;
        positive("workload.quantum_us", cfg.quantum_us)?;
        positive("workload.slice_us", cfg.slice_us)?;
        for (row_name, row) in
            [("uni", &cfg.interference.uni), ("smt", &cfg.interference.smt), ("any", &cfg.interference.any)]
        {
            for (col, v) in [("uni", row.uni), ("smt", row.smt), ("any", row.any)] {
                fraction(&format!("workload.interference.{row_name}.{col}"), v)?;
            }
        }
        if cfg.apps.is_empty() {
            return Err(invalid("workload.apps", "needs at least one application".into()));
        }
        if let Some(only) = &cfg.only {
            let names: Vec<&str> = cfg.apps.iter().map(|a| a.name.as_str()).collect();
            let Some(i) = names.iter().position(|n| n == only) else {
                return Err(invalid(
                    "workload.only",
                    format!("no application named {only:?}; apps: {}", names.join(", ")),
                ));
            };
            cfg.apps = vec![cfg.apps[i].clone()];
        }
        for (i, app) in cfg.apps.iter().enumerate() {
            if app.threads == 0 {
                return Err(invalid(&format!("workload.apps[{i}].threads"), "must be at least 1".into()));
            }
            if app.iterations == 0 {
                return Err(invalid(&format!("workload.apps[{i}].iterations"), "must be at least 1".into()));
            }
            scenario.check_distribution(&format!("workload.apps[{i}].iteration_ns"), &app.iteration_ns)?;
        }
        let threads: u64 = cfg.apps.iter().map(|a| u64::from(a.threads)).sum();
        if threads > super::MAX_TASKS as u64 {
            return Err(invalid(
                "workload.apps",
                format!("{threads} threads in all is too many: at most {}", super::MAX_TASKS),
            ));
        }

        let layout = SmtLayout::from_machine(scenario.machine.topology());
        let group = match cfg.mode {
            SimMode::Up => layout.groups().first().map(|g| g.cpus[..1].to_vec()),
            _ => layout.groups().iter().find(|g| g.is_smt()).map(|g| g.cpus[..2].to_vec()),
        };
        let Some(cpus) = group else {
            return Err(scenario.error(
                "machine",
                Problem::Machine(format!(
                    "mode {} needs an SMT core; machine {} has none (try preset = \"smt-2way\")",
                    cfg.mode.name(),
                    scenario.machine.name()
                )),
            ));
        };
        // Only the simulated core's CPUs matter: the layout's rules are per core.
        let layout = SmtLayout::from_machine(&core_only(scenario.machine.topology(), &cpus));
        let contexts: Vec<Context> = cpus
            .iter()
            .map(|c| Context {
                cpu: c.0,
                thread: None,
                kernel: VecDeque::new(),
                gen: 0,
                quantum_gen: 0,
                quantum_armed: false,
                rate: 0.0,
                last: 0,
                busy: false,
            })
            .collect();
        let mut cpu_speed = [1.0; 2];
        for (i, c) in cpus.iter().enumerate() {
            cpu_speed[i] = scenario.machine.cpu(c.0).speed;
        }
        let hybrid = (cfg.mode == SimMode::Hybrid)
            .then(|| {
                let (slice_ns, switch_ns) = ((cfg.slice_us * 1000.0) as u64, (cfg.switch_us * 1000.0) as u64);
                Hybrid::new(HybridConfig { slice_ns, switch_ns, start: Mode::Amp })
            })
            .transpose()
            .map_err(|e| invalid("workload.slice_us", e.to_string()))?;
        let top_ps = ns_to_ps(cfg.top_half_ns.unwrap_or(scenario.machine.costs().interrupt_ns)) as f64;
        let pollution_ps = ns_to_ps(cfg.pollution_ns) as f64;
        Ok(SmtModel {
            apps: cfg.apps.iter().map(|a| AppRun { threads_left: a.threads, ..AppRun::default() }).collect(),
            cfg,
            layout,
            contexts,
            cpu_speed,
            threads: Vec::new(),
            ready: VecDeque::new(),
            hybrid,
            paused_until: 0,
            tick_gen: 0,
            top_ps,
            pollution_ps,
            iteration_times: Vec::new(),
            bottom_latencies: Vec::new(),
            bottoms_on_app_contexts: 0,
            interrupts: 0,
        })
    }
}

impl SmtModel {
    fn all_done(&self) -> bool {
        self.apps.iter().all(|a| a.finished.is_some())
    }

    /// The policy mode in force (UP is AMP-shaped for placement: one application context).
    fn policy_mode(&self) -> Mode {
        match self.cfg.mode {
            SimMode::Up | SimMode::Amp => Mode::Amp,
            SimMode::Smp => Mode::Smp,
            SimMode::Hybrid => self.hybrid.as_ref().map_or(Mode::Amp, Hybrid::mode),
        }
    }

    /// Whether context `i` may run application threads now.
    fn runs_apps(&self, i: usize, now: Ps) -> bool {
        if now < self.paused_until {
            return false;
        }
        match self.cfg.mode {
            SimMode::Up => i == 0,
            _ => self.layout.allowed(CpuId(self.contexts[i].cpu), Work::App, self.policy_mode()),
        }
    }

    /// Whether application `app` may run now (started, and in the hybrid's current mode).
    fn eligible(&self, app: u32) -> bool {
        let run = &self.apps[app as usize];
        run.started.is_some()
            && run.finished.is_none()
            && self.hybrid.as_ref().is_none_or(|h| h.mode_of(u64::from(app)) == Some(h.mode()))
    }

    fn activity(&self, i: usize) -> Activity {
        let c = &self.contexts[i];
        if !c.kernel.is_empty() {
            Activity::Kernel
        } else if let Some(t) = c.thread {
            Activity::App(self.cfg.apps[self.threads[t as usize].app as usize].class)
        } else {
            Activity::Idle
        }
    }

    /// Brings every context's work up to `now` at its current rate.
    fn advance(&mut self, now: Ps) {
        for i in 0..self.contexts.len() {
            let elapsed = (now - self.contexts[i].last) as f64;
            let done = elapsed * self.contexts[i].rate;
            let c = &mut self.contexts[i];
            c.last = now;
            if let Some(k) = c.kernel.front_mut() {
                k.left = (k.left - done).max(0.0);
            } else if let Some(t) = c.thread {
                let t = &mut self.threads[t as usize];
                t.left = (t.left - done).max(0.0);
            }
        }
    }

    /// Releases the thread of context `i` (back to the front of the ready queue if `requeue`).
    fn release(&mut self, i: usize, now: Ps, requeue_front: bool) {
        if let Some(t) = self.contexts[i].thread.take() {
            let th = &mut self.threads[t as usize];
            if let Some(since) = th.since.take() {
                th.held += now - since;
            }
            if requeue_front {
                self.ready.push_front(t);
            } else {
                self.ready.push_back(t);
            }
        }
    }

    /// Gives idle application contexts the first eligible ready threads.
    fn dispatch(&mut self, sim: &mut Sim<Ev>) {
        let now = sim.now();
        for i in 0..self.contexts.len() {
            if self.contexts[i].thread.is_some() || !self.runs_apps(i, now) {
                continue;
            }
            let Some(pos) = self.ready.iter().position(|&t| self.eligible(self.threads[t as usize].app))
            else {
                break;
            };
            let t = self.ready.remove(pos).expect("position found");
            self.threads[t as usize].since = Some(now);
            let c = &mut self.contexts[i];
            c.thread = Some(t);
            c.quantum_gen += 1;
            c.quantum_armed = false;
        }
        self.arm_quanta(sim);
    }

    /// Starts a round-robin quantum on every context whose thread has eligible threads
    /// waiting behind it (none otherwise, so a finished run leaves no timer behind).
    fn arm_quanta(&mut self, sim: &mut Sim<Ev>) {
        if !self.ready.iter().any(|&t| self.eligible(self.threads[t as usize].app)) {
            return;
        }
        for (i, c) in self.contexts.iter_mut().enumerate() {
            if c.thread.is_some() && !c.quantum_armed {
                c.quantum_armed = true;
                let q = Ev::Quantum { ctx: i as u8, gen: c.quantum_gen };
                sim.schedule_in(ns_to_ps(self.cfg.quantum_us * 1000.0), q);
            }
        }
    }

    /// Recomputes every context's rate from what it and its sibling run, updates the busy/idle
    /// ledger, and schedules each context's next completion.
    fn replan(&mut self, sim: &mut Sim<Ev>) {
        let now = sim.now();
        let acts: Vec<Activity> = (0..self.contexts.len()).map(|i| self.activity(i)).collect();
        for i in 0..self.contexts.len() {
            let sibling = if acts.len() == 2 { acts[1 - i] } else { Activity::Idle };
            let factor = match (acts[i], sibling) {
                (Activity::Idle, _) => 0.0,
                (Activity::Kernel, Activity::Idle) | (Activity::App(_), Activity::Idle) => 1.0,
                (Activity::Kernel, _) => self.cfg.service_shared,
                (Activity::App(_), Activity::Kernel) => self.cfg.beside_service,
                (Activity::App(a), Activity::App(b)) => self.cfg.interference.row(a).beside(b),
            };
            let rate = factor * self.cpu_speed[i];
            let cpu = self.contexts[i].cpu;
            let busy = acts[i] != Activity::Idle;
            if busy != self.contexts[i].busy {
                if busy {
                    sim.stats.cores.set_busy(cpu, now);
                } else {
                    sim.stats.cores.set_idle(cpu, now);
                }
            }
            let left = match acts[i] {
                Activity::Idle => None,
                Activity::Kernel => self.contexts[i].kernel.front().map(|k| k.left),
                Activity::App(_) => self.contexts[i].thread.map(|t| self.threads[t as usize].left),
            };
            let c = &mut self.contexts[i];
            c.busy = busy;
            c.rate = rate;
            c.gen += 1;
            if let Some(left) = left {
                let ev = Ev::Done { ctx: i as u8, gen: c.gen };
                sim.schedule_in((left / rate).ceil() as Ps, ev);
            }
        }
    }

    fn start_app(&mut self, app: u32, sim: &mut Sim<Ev>) {
        let now = sim.now();
        self.apps[app as usize].started = Some(now);
        let cfg = self.cfg.apps[app as usize].clone();
        for _ in 0..cfg.threads {
            let left = ns_to_ps(cfg.iteration_ns.sample(sim.rng())) as f64;
            self.ready.push_back(self.threads.len() as u32);
            self.threads.push(Thread {
                app,
                left,
                iterations_left: cfg.iterations,
                held: 0,
                since: None,
                polluted: false,
            });
        }
        if let Some(h) = &mut self.hybrid {
            h.admit(u64::from(app), cfg.class).expect("each application is admitted once");
            self.tick(sim);
        }
    }

    /// Lets the hybrid switch modes if its slice is over (or its queue empty).
    fn tick(&mut self, sim: &mut Sim<Ev>) {
        let now = sim.now();
        let Some(h) = &mut self.hybrid else { return };
        if h.tick((ps_to_ns(now)) as u64).is_some() {
            for i in 0..self.contexts.len() {
                self.release(i, now, true);
            }
            self.paused_until = now + ns_to_ps(self.cfg.switch_us * 1000.0);
            sim.schedule_at(self.paused_until, Ev::SwitchEnd);
        }
        // The next switch is possible at the slice's end, if the other queue has work; if it
        // gets work later, admitting it calls this again.
        let h = self.hybrid.as_ref().expect("hybrid");
        self.tick_gen += 1;
        if !h.queue(h.mode().other()).is_empty() {
            let end = ns_to_ps(h.slice_end() as f64);
            sim.schedule_at(end.max(now + 1), Ev::Tick { gen: self.tick_gen });
        }
    }

    /// Context `i` finished its current item.
    fn complete(&mut self, i: usize, sim: &mut Sim<Ev>) {
        let now = sim.now();
        if let Some(k) = self.contexts[i].kernel.pop_front() {
            if k.bottom {
                self.bottom_latencies.push(now - k.arrived);
            }
            if self.contexts[i].kernel.is_empty() {
                if let Some(t) = self.contexts[i].thread {
                    let th = &mut self.threads[t as usize];
                    if th.polluted {
                        th.left += self.pollution_ps;
                        th.polluted = false;
                    }
                }
            }
            return;
        }
        let Some(t) = self.contexts[i].thread else { return };
        let th = &mut self.threads[t as usize];
        let held = th.held + th.since.map_or(0, |s| now - s);
        self.iteration_times.push(held);
        sim.stats.record_op(held);
        th.held = 0;
        th.since = Some(now);
        th.iterations_left -= 1;
        if th.iterations_left > 0 {
            let app = th.app as usize;
            th.left = ns_to_ps(self.cfg.apps[app].iteration_ns.sample(sim.rng())) as f64;
            return;
        }
        th.since = None;
        let app = th.app;
        self.contexts[i].thread = None;
        let run = &mut self.apps[app as usize];
        run.threads_left -= 1;
        if run.threads_left == 0 {
            run.finished = Some(now);
            if let Some(h) = &mut self.hybrid {
                h.retire(u64::from(app)).expect("admitted when started");
            }
            if self.cfg.sequential && (app as usize + 1) < self.apps.len() {
                sim.schedule_at(now, Ev::Start { app: app + 1 });
            }
            self.tick(sim);
        }
    }

    fn interrupt(&mut self, sim: &mut Sim<Ev>) {
        let now = sim.now();
        self.interrupts += 1;
        let active = if self.cfg.mode == SimMode::Up { 1 } else { self.contexts.len() };
        let landed = if active == 1 { 0 } else { sim.rng().gen_range(0..active) };
        let bottom_left = ns_to_ps(self.cfg.bottom_half_ns.sample(sim.rng())) as f64;
        // The top half preempts whatever runs where the interrupt lands.
        self.contexts[landed].kernel.push_front(Kernel { left: self.top_ps, arrived: now, bottom: false });
        let target = match self.policy_mode() {
            Mode::Amp if self.cfg.mode != SimMode::Up => {
                let cpu = self.layout.place_service(CpuId(self.contexts[landed].cpu), Mode::Amp);
                cpu.and_then(|c| self.contexts.iter().position(|x| x.cpu == c.0)).unwrap_or(landed)
            }
            _ => landed,
        };
        if let Some(t) = self.contexts[target].thread {
            self.threads[t as usize].polluted = true;
            self.bottoms_on_app_contexts += 1;
        }
        self.contexts[target].kernel.push_back(Kernel { left: bottom_left, arrived: now, bottom: true });
        self.schedule_interrupt(sim);
    }

    fn schedule_interrupt(&mut self, sim: &mut Sim<Ev>) {
        if self.cfg.interrupt_rate_per_s <= 0.0 || self.all_done() {
            return;
        }
        let mean_ns = 1e9 / self.cfg.interrupt_rate_per_s;
        let gap = Distribution::Exponential(mean_ns).sample(sim.rng());
        sim.schedule_in(ns_to_ps(gap).max(1), Ev::Interrupt);
    }
}

/// `machine` reduced to the CPUs `cpus` (renumbered densely), for the layout of one core.
fn core_only(machine: &corehop_topology::Machine, cpus: &[CpuId]) -> corehop_topology::Machine {
    let mut m = machine.clone();
    m.cpus = cpus
        .iter()
        .enumerate()
        .filter_map(|(i, c)| machine.cpu(*c).map(|cpu| corehop_topology::Cpu { id: CpuId(i), ..cpu.clone() }))
        .collect();
    m.caches.clear();
    m
}

impl Model for SmtModel {
    type Event = Ev;

    fn start(&mut self, sim: &mut Sim<Ev>) {
        let starts = if self.cfg.sequential { 1 } else { self.apps.len() };
        for app in 0..starts {
            sim.schedule_at(0, Ev::Start { app: app as u32 });
        }
        self.schedule_interrupt(sim);
    }

    fn on_event(&mut self, event: Ev, sim: &mut Sim<Ev>) {
        let now = sim.now();
        match event {
            Ev::Done { ctx, gen } if gen != self.contexts[ctx as usize].gen => return,
            Ev::Quantum { ctx, gen } if gen != self.contexts[ctx as usize].quantum_gen => return,
            Ev::Tick { gen } if gen != self.tick_gen => return,
            _ => {}
        }
        self.advance(now);
        match event {
            Ev::Done { ctx, .. } => self.complete(ctx as usize, sim),
            Ev::Quantum { ctx, .. } => {
                let i = ctx as usize;
                self.contexts[i].quantum_armed = false;
                if self.ready.iter().any(|&t| self.eligible(self.threads[t as usize].app)) {
                    self.release(i, now, false);
                }
            }
            Ev::Interrupt => self.interrupt(sim),
            Ev::Tick { .. } => self.tick(sim),
            Ev::SwitchEnd => {}
            Ev::Start { app } => self.start_app(app, sim),
        }
        self.dispatch(sim);
        self.replan(sim);
    }

    fn report(&self, sim: &Sim<Ev>) -> ModelReport {
        let ms = |ps: Ps| ps_to_ns(ps) / 1e6;
        let makespan = self.apps.iter().filter_map(|a| a.finished).max().unwrap_or(sim.now());
        let mut metrics = vec![Metric::new("makespan", ms(makespan), "ms")];
        for (app, run) in self.cfg.apps.iter().zip(&self.apps) {
            if let (Some(s), Some(f)) = (run.started, run.finished) {
                metrics.push(Metric::new(format!("{}_time", app.name), ms(f - s), "ms"));
            }
        }
        let (mean, sd) = mean_sd(&self.iteration_times);
        metrics.push(Metric::new("iteration_mean", mean / 1e3, "us"));
        metrics.push(Metric::new("iteration_sd", sd / 1e3, "us"));
        metrics.push(Metric::new("iteration_cv", if mean > 0.0 { 100.0 * sd / mean } else { 0.0 }, "%"));
        metrics.push(Metric::new("interrupts", self.interrupts as f64, "count"));
        let (bh, _) = mean_sd(&self.bottom_latencies);
        metrics.push(Metric::new("bottom_half_latency", bh / 1e3, "us"));
        metrics.push(Metric::new(
            "bottom_halves_on_app_context",
            self.bottoms_on_app_contexts as f64,
            "count",
        ));
        let switches = self.hybrid.as_ref().map_or(0, Hybrid::switches);
        metrics.push(Metric::new("mode_switches", switches as f64, "count"));
        ModelReport { op_name: "iteration".into(), metrics }
    }
}

/// Mean and standard deviation (ns) of `samples` (ps).
fn mean_sd(samples: &[Ps]) -> (f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0);
    }
    let n = samples.len() as f64;
    let mean = samples.iter().map(|&s| ps_to_ns(s)).sum::<f64>() / n;
    let var = samples.iter().map(|&s| (ps_to_ns(s) - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::simulate;
    use crate::scenario::ScenarioDoc;
    use crate::stats::Report;

    /// A scenario under an event budget, so a model bug shows as a failed run, not a hang.
    fn scenario_on(preset: &str, workload: &str) -> Result<Scenario, ScenarioError> {
        let text = format!(
            "[run]\nmax_events = 2_000_000\n[machine]\npreset = \"{preset}\"\n[workload]\nkind = \"smt\"\n{workload}"
        );
        ScenarioDoc::parse("t.toml", &text)?.validate()
    }

    fn build(workload: &str) -> Result<SmtModel, ScenarioError> {
        SmtModel::from_scenario(&scenario_on("smt-2way", workload)?)
    }

    fn run_seeded(workload: &str, seed: u64) -> (Report, Sim<Ev>) {
        let mut s = scenario_on("smt-2way", workload).unwrap();
        s.seed = seed;
        let mut m = SmtModel::from_scenario(&s).unwrap();
        simulate(&s, &mut m, false, &mut |_| {})
    }

    fn run(workload: &str) -> (Report, Sim<Ev>) {
        run_seeded(workload, 1)
    }

    fn metric(r: &Report, name: &str) -> f64 {
        r.model.metrics.iter().find(|m| m.name == name).unwrap_or_else(|| panic!("no metric {name}")).value
    }

    const ONE_APP: &str = "[[workload.apps]]\nname = \"a\"\nclass = \"smt\"\n";

    #[test]
    fn up_by_hand() {
        // One thread, two 1000 ns iterations on a full-speed context: 2000 ns, nothing on cpu1.
        let (r, sim) =
            run(&format!("mode = \"up\"\n{ONE_APP}threads = 1\niterations = 2\niteration_ns = 1000"));
        assert_eq!(sim.now(), 2_000_000);
        assert_eq!((r.ops, metric(&r, "makespan")), (2, 0.002));
        assert_eq!((metric(&r, "iteration_mean"), metric(&r, "iteration_sd")), (1.0, 0.0));
        assert_eq!((sim.stats.cores.busy(0), sim.stats.cores.busy(1)), (2_000_000, 0));
    }

    #[test]
    fn smp_co_running_by_hand() {
        // Two SMT-class threads side by side keep 0.65 each: 1000 ns of work takes 1538.462 ns.
        let (r, sim) =
            run(&format!("mode = \"smp\"\n{ONE_APP}threads = 2\niterations = 1\niteration_ns = 1000"));
        assert_eq!(sim.now(), 1_538_462);
        assert_eq!((sim.stats.cores.busy(0), sim.stats.cores.busy(1)), (1_538_462, 1_538_462));
        assert_eq!(r.ops, 2);
    }

    #[test]
    fn amp_keeps_threads_off_the_reserved_context() {
        // Without interrupts the reserved context never runs anything; threads take turns on
        // the application context (2 × 3 × 1000 ns).
        let app = format!("{ONE_APP}threads = 2\niterations = 3\niteration_ns = 1000");
        let (r, sim) = run(&format!("mode = \"amp\"\nquantum_us = 0.5\n{app}"));
        assert_eq!(sim.stats.cores.busy(1), 0);
        assert_eq!(metric(&r, "makespan"), 0.006);
        // With interrupts, every bottom half runs on the reserved context.
        let app = format!("{ONE_APP}threads = 2\niterations = 300\niteration_ns = 1000");
        let (r, sim) = run(&format!("mode = \"amp\"\ninterrupt_rate_per_s = 50000\n{app}"));
        assert!(metric(&r, "interrupts") > 10.0);
        assert_eq!(metric(&r, "bottom_halves_on_app_context"), 0.0);
        assert!(sim.stats.cores.busy(1) > 0);
        let (r, _) = run(&format!("mode = \"smp\"\ninterrupt_rate_per_s = 50000\n{app}"));
        assert!(metric(&r, "bottom_halves_on_app_context") > 0.0);
    }

    #[test]
    fn bottom_halves_pollute_and_stall_the_interrupted_thread_in_up() {
        let app = format!("{ONE_APP}threads = 1\niterations = 100\niteration_ns = 10000");
        let (quiet, _) = run(&format!("mode = \"up\"\n{app}"));
        let (busy, sim) = run(&format!("mode = \"up\"\ninterrupt_rate_per_s = 50000\n{app}"));
        // The last interrupt may arrive after the application finished.
        let n = metric(&busy, "interrupts") - 1.0;
        let top = sim.machine.costs().interrupt_ns;
        // Each interrupt stalls the thread for its top and bottom half; each burst of them
        // (one or more back to back) adds one cache refill.
        let extra_ns = (metric(&busy, "makespan") - metric(&quiet, "makespan")) * 1e6;
        let (lo, hi) = (n * (top + 8_000.0), (n + 1.0) * (top + 8_000.0 + 3_000.0));
        assert!(
            n > 10.0 && extra_ns >= lo && extra_ns <= hi,
            "extra {extra_ns} ns, not in [{lo}, {hi}] for {n}"
        );
    }

    #[test]
    fn same_seed_same_report() {
        let w = format!("mode = \"hybrid\"\ninterrupt_rate_per_s = 20000\nbottom_half_ns = {{ exponential = 5000 }}\n{ONE_APP}threads = 3\niterations = 50\niteration_ns = {{ uniform = [1000, 9000] }}\n[[workload.apps]]\nname = \"b\"\nclass = \"uni\"\niterations = 40\niteration_ns = 3000");
        let a = serde_json::to_string(&run_seeded(&w, 9).0).unwrap();
        let b = serde_json::to_string(&run_seeded(&w, 9).0).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, serde_json::to_string(&run_seeded(&w, 10).0).unwrap());
    }

    fn load(file: &str, sets: &[(&str, toml::Value)]) -> Scenario {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios").join(file);
        let mut doc = ScenarioDoc::load(&path).unwrap();
        for (k, v) in sets {
            doc.set_value(k, v.clone()).unwrap();
        }
        doc.validate().unwrap()
    }

    fn makespan(file: &str, sets: &[(&str, toml::Value)]) -> f64 {
        let s = load(file, sets);
        let mut m = SmtModel::from_scenario(&s).unwrap();
        metric(&simulate(&s, &mut m, false, &mut |_| {}).0, "makespan")
    }

    fn s(v: &str) -> toml::Value {
        toml::Value::String(v.into())
    }

    #[test]
    fn paper_amp_matches_up_without_interrupts_and_beats_it_with_them() {
        for app in ["art", "mesa"] {
            let at = |mode: &str, rate: i64| {
                makespan(
                    "smt-modes.toml",
                    &[
                        ("workload.only", s(app)),
                        ("workload.mode", s(mode)),
                        ("workload.interrupt_rate_per_s", rate.into()),
                    ],
                )
            };
            let (up, amp) = (at("up", 0), at("amp", 0));
            assert!((amp / up - 1.0).abs() < 0.01, "{app}: AMP {amp} vs UP {up} without interrupts");
            let (up, amp) = (at("up", 10_000), at("amp", 10_000));
            assert!(amp < 0.95 * up, "{app}: AMP {amp} vs UP {up} with interrupts");
        }
    }

    #[test]
    fn paper_hybrid_beats_every_single_mode() {
        let at = |mode: &str| makespan("smt-hybrid.toml", &[("workload.mode", s(mode))]);
        let hybrid = at("hybrid");
        for mode in ["up", "smp", "amp"] {
            assert!(hybrid < at(mode), "hybrid {hybrid} vs {mode} {}", at(mode));
        }
        // Also when both applications run at once and the hybrid alternates time slices.
        let at = |mode: &str| {
            makespan("smt-hybrid.toml", &[("workload.mode", s(mode)), ("workload.sequential", false.into())])
        };
        let hybrid = at("hybrid");
        for mode in ["up", "smp", "amp"] {
            assert!(hybrid < at(mode), "concurrent: hybrid {hybrid} vs {mode} {}", at(mode));
        }
    }

    #[test]
    fn paper_amp_stays_predictable_under_interrupts_while_smp_does_not() {
        let spread = |mode: &str, rate: i64| {
            let runs: Vec<(f64, f64)> = (1..=4)
                .map(|seed| {
                    let mut sc = load(
                        "smt-variance.toml",
                        &[("workload.mode", s(mode)), ("workload.interrupt_rate_per_s", rate.into())],
                    );
                    sc.seed = seed;
                    let mut m = SmtModel::from_scenario(&sc).unwrap();
                    let r = simulate(&sc, &mut m, false, &mut |_| {}).0;
                    (metric(&r, "makespan"), metric(&r, "iteration_cv"))
                })
                .collect();
            let (lo, hi) = runs.iter().fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(r.0), hi.max(r.0)));
            (hi - lo, runs.iter().map(|r| r.1).sum::<f64>() / runs.len() as f64)
        };
        let (amp_range, amp_cv) = spread("amp", 10_000);
        let (smp_range, smp_cv) = spread("smp", 10_000);
        assert!(smp_cv > 5.0 * amp_cv, "iteration CV: SMP {smp_cv}% vs AMP {amp_cv}%");
        assert!(
            smp_range > 2.0 * amp_range,
            "makespan spread over seeds: SMP {smp_range} vs AMP {amp_range} ms"
        );
        let (_, quiet_smp_cv) = spread("smp", 0);
        assert!(
            smp_cv > 10.0 * quiet_smp_cv,
            "SMP grows by an order of magnitude: {quiet_smp_cv}% → {smp_cv}%"
        );
    }

    #[test]
    fn bad_input_names_the_key() {
        let err = |w: &str| build(w).err().map(|e| (e.key.clone(), e.to_string())).expect("an error");
        let app = format!("{ONE_APP}iterations = 1\niteration_ns = 100");
        assert_eq!(err("mode = \"amp\"\napps = []").0, "workload.apps");
        assert_eq!(
            err(&format!("mode = \"amp\"\n{ONE_APP}threads = 0\niterations = 1\niteration_ns = 1")).0,
            "workload.apps[0].threads"
        );
        assert_eq!(
            err(&format!("mode = \"amp\"\n{ONE_APP}iterations = 0\niteration_ns = 1")).0,
            "workload.apps[0].iterations"
        );
        assert_eq!(err(&format!("mode = \"amp\"\nbeside_service = 1.5\n{app}")).0, "workload.beside_service");
        assert_eq!(
            err(&format!("mode = \"amp\"\ninterrupt_rate_per_s = -1\n{app}")).0,
            "workload.interrupt_rate_per_s"
        );
        assert_eq!(err(&format!("mode = \"amp\"\nquantum_us = 0\n{app}")).0, "workload.quantum_us");
        let (key, text) = err(&format!("mode = \"up\"\ninterrupt_rate_per_s = 200000\n{app}"));
        assert!(key == "workload.interrupt_rate_per_s" && text.contains("livelock"), "{text}");
        assert_eq!(
            err(&format!(
                "mode = \"amp\"\ninterference.uni = {{ uni = 0.49, smt = 0.0, any = 0.47 }}\n{app}"
            ))
            .0,
            "workload.interference.uni.smt"
        );
        let (key, text) = err(&format!("mode = \"amp\"\nonly = \"zz\"\n{app}"));
        assert!(key == "workload.only" && text.contains("no application named \"zz\""), "{text}");
        assert!(err(&format!("mode = \"turbo\"\n{app}")).0.starts_with("workload"));
        assert!(err(&format!("mode = \"amp\"\nbogus = 1\n{app}")).1.contains("bogus"));
        // SMP, AMP and the hybrid need an SMT core; UP runs anywhere.
        let no_smt = scenario_on("switch-cc", &format!("mode = \"amp\"\n{app}")).unwrap();
        let e = SmtModel::from_scenario(&no_smt).err().unwrap();
        assert!(e.key == "machine" && e.to_string().contains("needs an SMT core"), "{e}");
        assert!(SmtModel::from_scenario(
            &scenario_on("switch-cc", &format!("mode = \"up\"\n{app}")).unwrap()
        )
        .is_ok());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Whatever the mode, load and seed: every iteration of every thread completes exactly
        /// once, every application finishes, and no CPU is busy longer than the run.
        #[test]
        fn nothing_lost_or_duplicated(
            mode in proptest::sample::select(vec!["up", "smp", "amp", "hybrid"]),
            threads in 1u32..5, iterations in 1u32..20, rate in proptest::sample::select(vec![0u32, 20_000, 90_000]),
            sequential: bool, seed in 0u64..1000, second in proptest::sample::select(vec!["uni", "smt", "any"]),
        ) {
            let w = format!(
                "mode = \"{mode}\"\nsequential = {sequential}\ninterrupt_rate_per_s = {rate}\nslice_us = 20\nquantum_us = 7\n\
                 [[workload.apps]]\nname = \"a\"\nclass = \"uni\"\nthreads = {threads}\niterations = {iterations}\niteration_ns = {{ uniform = [500, 5000] }}\n\
                 [[workload.apps]]\nname = \"b\"\nclass = \"{second}\"\nthreads = 2\niterations = {iterations}\niteration_ns = 2000"
            );
            let (r, sim) = run_seeded(&w, seed);
            proptest::prop_assert_eq!(r.stop, crate::engine::Stop::Drained);
            proptest::prop_assert_eq!(r.ops, u64::from((threads + 2) * iterations));
            proptest::prop_assert!(metric(&r, "a_time") > 0.0 && metric(&r, "b_time") > 0.0);
            for cpu in 0..2 {
                proptest::prop_assert_eq!(sim.stats.cores.busy(cpu) + sim.stats.cores.idle(cpu), sim.now());
            }
            if mode == "amp" {
                proptest::prop_assert_eq!(metric(&r, "bottom_halves_on_app_context"), 0.0);
            }
        }
    }
}
