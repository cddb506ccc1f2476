//! `kind = "pipeline"`: the multiserver network stack of "When Slower is Faster" (§4): packets
//! of TCP streams pass driver → IP → TCP, each a component on a CPU (dedicated, shared, or an
//! SMT thread), each CPU throttled to a fraction of its speed.
//!
//! The sender is window-limited, as lwIP without window scaling is: at most `window` packets
//! are in flight; each delivered packet's ACK lets the sender put another on the wire
//! `wire_ns` later (at most one per `line_rate_gbps` serialisation time). Throughput is
//! therefore window / round-trip time, and everything that lengthens the round trip inside
//! the machine costs throughput. That is where *slower is faster* comes from: a fast core
//! empties its queue, polls for a while, sleeps (a kernel call into MWAIT), and the next packet
//! waits for it to wake (the power-up delay plus the kernel path back, an interrupt for the
//! driver). A slower core stays busy, never sleeps, and its packets never wait for a wake-up.
//!
//! ```toml
//! [workload]
//! kind = "pipeline"
//! placement = [0, 2, 4]         # CPU of driver, IP, TCP (the paper's configuration #1)
//! speed = 1.0                   # throttle of every CPU the stack uses (fraction of full speed)
//! tcp_speed = 1.0               # optional: throttle of TCP's CPU (its SMT siblings too)
//! work_ns = [300, 300, 450]     # per packet at full speed: driver, IP, TCP
//! memory_ns = [0, 0, 350]       # per packet stall that does not scale with speed (TCP's copy)
//! window = 48                   # packets in flight over all streams
//! wire_ns = 12000               # from a delivery to the next packet's arrival, outside the machine
//! line_rate_gbps = 10
//! payload_bytes = 1460
//! packets = 60000               # delivered packets to simulate
//! idle = "poll-then-park"       # poll | park | poll-then-park (corehop_policy::spin's budget)
//! poll_ns = 1000                # optional: a fixed poll before parking instead of the adaptive one
//! sleep_ns = 1500               # kernel path into MWAIT and back, CPU time at full speed
//! controller = false            # run corehop_policy::components::Controller every epoch
//! epoch_us = 200
//! allowed = [0, 1, 2, 3, 4, 5, 6, 7]   # CPUs the controller may use (default: all)
//! ```
//!
//! A CPU serves its components round-robin, one packet at a time, like a runtime host. A
//! packet that reaches an idle CPU starts at once if the CPU is still polling
//! (`CoreLedger::is_polling`); otherwise the CPU was asleep and first pays the wake-up. SMT
//! siblings run at once, each slowed by the cost model's SMT interference while the other is
//! busy ([`Sim::exec`]).
//!
//! With `controller = true` the model calls the same [`Controller`] the live runtime uses,
//! every `epoch_us`, with each component's busy time and queue, and applies its moves and
//! speeds; the report's metrics then say where it settled.
use std::collections::VecDeque;

use corehop_policy::components::{
    Action, ComponentId, Controller, ControllerConfig, Idle, Layout, Observation,
};
use corehop_policy::spin::{SpinBudget, SpinConfig};
use corehop_topology::CpuId;
use serde::Deserialize;

use crate::engine::{ns_to_ps, ps_to_ns, Model, Ps, Sim};
use crate::models::{FromScenario, ModelEntry};
use crate::scenario::{Problem, Scenario, ScenarioError};
use crate::stats::{Metric, ModelReport};

/// Registry entry.
pub const ENTRY: ModelEntry = ModelEntry::of::<Pipeline>(
    "pipeline",
    "multiserver network stack (driver → IP → TCP) on dedicated, shared, SMT or throttled cores",
);

const STAGES: usize = 3;
/// Capacity of a channel between components, as `corehop bench pipeline` builds them: what the
/// controller judges a queue's fill against (the window bounds how full they get here).
const CHANNEL_CAPACITY: usize = 256;
const NAMES: [&str; STAGES] = ["driver", "ip", "tcp"];

/// The `[workload]` table of `kind = "pipeline"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// CPU of the driver, IP and TCP components, in that order (dense CPU indexes; default
    /// `[0, 2, 4]`).
    #[serde(default = "default_placement")]
    pub placement: Vec<usize>,
    /// Throttle of every CPU the stack uses, fraction of full speed (default 1.0).
    #[serde(default = "one")]
    pub speed: f64,
    /// Throttle of TCP's CPU and its SMT siblings, fraction of full speed; unset: `speed`.
    pub tcp_speed: Option<f64>,
    /// Work per packet of driver, IP and TCP, ns at full speed.
    #[serde(default = "default_work")]
    pub work_ns: Vec<f64>,
    /// Memory stall per packet of driver, IP and TCP, ns (does not scale with speed).
    #[serde(default = "default_memory")]
    pub memory_ns: Vec<f64>,
    /// Packets in flight over all streams (default 48).
    #[serde(default = "default_window")]
    pub window: u32,
    /// From a delivery to the next packet's arrival, outside the machine, ns (default 12 000).
    #[serde(default = "default_wire")]
    pub wire_ns: f64,
    /// Line rate, Gbit/s (default 10): at most one packet arrives per serialisation time.
    #[serde(default = "default_line_rate")]
    pub line_rate_gbps: f64,
    /// Payload of one packet, bytes (default 1460).
    #[serde(default = "default_payload")]
    pub payload_bytes: u32,
    /// Delivered packets to simulate (default 60 000).
    #[serde(default = "default_packets")]
    pub packets: u64,
    /// How a CPU with nothing to do waits (default poll-then-park).
    #[serde(default)]
    pub idle: Idle,
    /// With `idle = "poll-then-park"`: poll this long before sleeping (NewtOS polled "a little
    /// while"); unset, the budget is corehop's adaptive one.
    pub poll_ns: Option<f64>,
    /// Kernel path into MWAIT and back, CPU time in ns at full speed (default 1500).
    #[serde(default = "default_sleep")]
    pub sleep_ns: f64,
    /// Whether the component controller moves components and sets speeds every epoch.
    #[serde(default)]
    pub controller: bool,
    /// The controller's epoch, µs of virtual time (default 200).
    #[serde(default = "default_epoch")]
    pub epoch_us: f64,
    /// CPUs the controller may use (dense CPU indexes); unset: all.
    pub allowed: Option<Vec<usize>>,
}

fn default_placement() -> Vec<usize> {
    vec![0, 2, 4]
}
fn one() -> f64 {
    1.0
}
fn default_work() -> Vec<f64> {
    vec![300.0, 300.0, 450.0]
}
fn default_memory() -> Vec<f64> {
    vec![0.0, 0.0, 350.0]
}
fn default_window() -> u32 {
    48
}
fn default_wire() -> f64 {
    12_000.0
}
fn default_line_rate() -> f64 {
    10.0
}
fn default_payload() -> u32 {
    1460
}
fn default_packets() -> u64 {
    60_000
}
fn default_sleep() -> f64 {
    1_500.0
}
fn default_epoch() -> f64 {
    200.0
}

/// The events of the pipeline model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A packet reaches the NIC: the driver's queue.
    Arrive,
    /// `cpu` finished the packet it was working on.
    Done {
        /// The CPU (dense index).
        cpu: u32,
    },
    /// Sleeping `cpu` is awake again.
    Woken {
        /// The CPU (dense index).
        cpu: u32,
    },
    /// The controller's observation window closed.
    Epoch,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum CpuState {
    Idle,
    Waking,
    /// Working on a packet of `stage` that entered the machine at `born`.
    Busy {
        stage: usize,
        born: Ps,
    },
}

/// The model.
#[derive(Debug)]
pub struct Pipeline {
    cfg: PipelineConfig,
    stage_cpu: [usize; STAGES],
    throttle: Vec<f64>,
    queues: [VecDeque<Ps>; STAGES],
    state: Vec<CpuState>,
    cursor: Vec<usize>,
    spin: Vec<SpinBudget>,
    stage_busy: [Ps; STAGES],
    sleeps: u64,
    sent: u64,
    delivered: u64,
    last_arrival: Ps,
    controller: Option<Controller>,
    /// Packets each stage finished.
    stage_done: [u64; STAGES],
    /// Busy time, queue lengths and packets done per stage when the last epoch closed.
    last_epoch: ([Ps; STAGES], [usize; STAGES], [u64; STAGES]),
    moves: u64,
}

impl FromScenario for Pipeline {
    fn from_scenario(s: &Scenario) -> Result<Pipeline, ScenarioError> {
        let cfg: PipelineConfig = s.workload()?;
        let three = |key: &str, len: usize| -> Result<(), ScenarioError> {
            if len == STAGES {
                Ok(())
            } else {
                Err(s.error(key, Problem::Invalid(format!("needs 3 entries (driver, ip, tcp), got {len}"))))
            }
        };
        three("workload.placement", cfg.placement.len())?;
        three("workload.work_ns", cfg.work_ns.len())?;
        three("workload.memory_ns", cfg.memory_ns.len())?;
        for (i, &cpu) in cfg.placement.iter().enumerate() {
            s.check_cpu(&format!("workload.placement[{i}]"), cpu)?;
        }
        let fraction = |key: &str, v: f64| {
            if v > 0.0 && v <= 1.0 {
                Ok(())
            } else {
                Err(s.error(key, Problem::Invalid(format!("speed must be in (0, 1], got {v:?}"))))
            }
        };
        fraction("workload.speed", cfg.speed)?;
        if let Some(t) = cfg.tcp_speed {
            fraction("workload.tcp_speed", t)?;
        }
        let non_negative = |key: String, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(s.error(&key, Problem::Negative(v.to_string())))
            }
        };
        for i in 0..STAGES {
            non_negative(format!("workload.work_ns[{i}]"), cfg.work_ns[i])?;
            non_negative(format!("workload.memory_ns[{i}]"), cfg.memory_ns[i])?;
        }
        non_negative("workload.wire_ns".into(), cfg.wire_ns)?;
        non_negative("workload.sleep_ns".into(), cfg.sleep_ns)?;
        if let Some(p) = cfg.poll_ns {
            non_negative("workload.poll_ns".into(), p)?;
        }
        let positive = |key: &str, ok: bool, what: String| {
            if ok {
                Ok(())
            } else {
                Err(s.error(key, Problem::Invalid(what)))
            }
        };
        positive("workload.window", cfg.window > 0, "needs at least 1 packet in flight".into())?;
        positive("workload.packets", cfg.packets > 0, "needs at least 1 packet".into())?;
        positive("workload.payload_bytes", cfg.payload_bytes > 0, "needs at least 1 byte".into())?;
        let rate = cfg.line_rate_gbps;
        positive(
            "workload.line_rate_gbps",
            rate.is_finite() && rate > 0.0,
            format!("must be > 0, got {rate:?}"),
        )?;
        let epoch = cfg.epoch_us;
        positive(
            "workload.epoch_us",
            epoch.is_finite() && epoch > 0.0,
            format!("must be > 0, got {epoch:?}"),
        )?;

        let n = s.machine.cpu_count();
        let mut throttle = vec![cfg.speed; n];
        let stage_cpu = [cfg.placement[0], cfg.placement[1], cfg.placement[2]];
        if let Some(t) = cfg.tcp_speed {
            // Both threads of a core run at one clock.
            for sib in s.machine.topology().smt_siblings(CpuId(stage_cpu[2])) {
                throttle[sib.0] = t;
            }
        }
        let controller = if cfg.controller {
            let allowed: Vec<usize> = match &cfg.allowed {
                Some(list) => {
                    for (i, &cpu) in list.iter().enumerate() {
                        s.check_cpu(&format!("workload.allowed[{i}]"), cpu)?;
                    }
                    list.clone()
                }
                None => (0..n).collect(),
            };
            let ctl = Controller::new(
                ControllerConfig::default(),
                s.machine.topology(),
                allowed.into_iter().map(CpuId).collect(),
            )
            .map_err(|e| s.error("workload.allowed", Problem::Invalid(e.to_string())))?;
            Some(ctl)
        } else {
            None
        };
        Ok(Pipeline {
            stage_cpu,
            throttle,
            queues: Default::default(),
            state: vec![CpuState::Idle; n],
            cursor: vec![0; n],
            spin: vec![SpinBudget::new(SpinConfig::default()); n],
            stage_busy: [0; STAGES],
            sleeps: 0,
            sent: 0,
            delivered: 0,
            last_arrival: 0,
            controller,
            stage_done: [0; STAGES],
            last_epoch: ([0; STAGES], [0; STAGES], [0; STAGES]),
            moves: 0,
            cfg,
        })
    }
}

impl Pipeline {
    /// Where each component runs now (driver, IP, TCP) and each CPU's throttle. For tests.
    pub fn layout(&self) -> ([usize; STAGES], Vec<f64>) {
        (self.stage_cpu, self.throttle.clone())
    }

    fn line_gap(&self) -> Ps {
        ns_to_ps(f64::from(self.cfg.payload_bytes + 54) * 8.0 / self.cfg.line_rate_gbps)
    }

    /// Puts the next packet on the wire, to arrive `after` from now (line rate permitting).
    fn send(&mut self, after: Ps, sim: &mut Sim<Event>) {
        if self.sent >= self.cfg.packets {
            return;
        }
        self.sent += 1;
        let at = (sim.now() + after).max(self.last_arrival + self.line_gap());
        self.last_arrival = at;
        sim.schedule_at(at, Event::Arrive);
    }

    fn poll_budget(&self, cpu: usize) -> Ps {
        match self.cfg.idle {
            Idle::Poll => Ps::MAX,
            Idle::Park => 0,
            Idle::PollThenPark => match self.cfg.poll_ns {
                Some(fixed) => ns_to_ps(fixed),
                None => ns_to_ps(self.spin[cpu].budget_ns() as f64),
            },
        }
    }

    /// Work of `stage` for one packet on `cpu`: compute at the CPU's throttled speed (and SMT
    /// interference), the memory-bound part as is.
    fn packet_time(&self, stage: usize, cpu: usize, sim: &Sim<Event>) -> Ps {
        let compute = ns_to_ps(self.cfg.work_ns[stage] / self.throttle[cpu]);
        sim.exec(cpu, compute) + ns_to_ps(self.cfg.memory_ns[stage])
    }

    /// Work arrived for `cpu`: start it now if the CPU is polling, else wake it first.
    fn kick(&mut self, cpu: usize, sim: &mut Sim<Event>) {
        if self.state[cpu] != CpuState::Idle {
            return;
        }
        let now = sim.now();
        let since = sim.stats.cores.idle_since(cpu).unwrap_or(now);
        let gap_ns = ps_to_ns(now - since) as u64;
        if sim.stats.cores.is_polling(cpu, now) {
            self.spin[cpu].observe_idle_gap(gap_ns);
            self.start_next(cpu, sim);
            return;
        }
        // Asleep: the power-up delay, then the kernel path back out (and the interrupt that
        // wakes a driver) on this CPU before any packet.
        self.sleeps += 1;
        let delay = sim.machine.wake_delay(cpu);
        let mut kernel = ns_to_ps(self.cfg.sleep_ns / self.throttle[cpu]);
        if self.stage_cpu[0] == cpu {
            kernel += ns_to_ps(sim.machine.costs().interrupt_ns / self.throttle[cpu]);
        }
        let kernel = sim.exec(cpu, kernel);
        self.spin[cpu].observe_idle_gap(gap_ns);
        self.spin[cpu].observe_wake_cost(ps_to_ns(delay + kernel) as u64);
        self.state[cpu] = CpuState::Waking;
        sim.stats.cores.set_busy(cpu, now);
        sim.schedule_in(delay + kernel, Event::Woken { cpu: cpu as u32 });
    }

    /// `cpu` is free: take the next packet of one of its components, round-robin, or go idle.
    fn start_next(&mut self, cpu: usize, sim: &mut Sim<Event>) {
        let now = sim.now();
        let mine: Vec<usize> = (0..STAGES).filter(|&s| self.stage_cpu[s] == cpu).collect();
        let pick = (0..mine.len())
            .map(|k| mine[(self.cursor[cpu] + k) % mine.len()])
            .find(|&s| !self.queues[s].is_empty());
        match pick {
            Some(stage) => {
                self.cursor[cpu] = (mine.iter().position(|&s| s == stage).unwrap_or(0) + 1) % mine.len();
                let born = self.queues[stage].pop_front().expect("picked a non-empty queue");
                sim.stats.cores.set_busy(cpu, now);
                let t = self.packet_time(stage, cpu, sim);
                self.stage_busy[stage] += t;
                self.state[cpu] = CpuState::Busy { stage, born };
                sim.schedule_in(t, Event::Done { cpu: cpu as u32 });
            }
            None => {
                self.state[cpu] = CpuState::Idle;
                sim.stats.cores.set_poll_budget(cpu, self.poll_budget(cpu));
                sim.stats.cores.set_idle(cpu, now);
            }
        }
    }

    /// One controller window: observations in, moves and speeds out, applied at once.
    fn epoch(&mut self, sim: &mut Sim<Event>) {
        let Some(ctl) = self.controller.as_mut() else { return };
        let window_ns = (self.cfg.epoch_us * 1e3) as u64;
        let obs: Vec<Observation> = (0..STAGES)
            .map(|s| Observation {
                busy_ns: ps_to_ns(self.stage_busy[s] - self.last_epoch.0[s]) as u64,
                window_ns,
                queue_start: self.last_epoch.1[s],
                queue_end: self.queues[s].len(),
                queue_capacity: CHANNEL_CAPACITY,
                done: self.stage_done[s] - self.last_epoch.2[s],
            })
            .collect();
        let layout = Layout {
            cpu_of: self.stage_cpu.iter().map(|&c| CpuId(c)).collect(),
            speed: self.throttle.clone(),
        };
        // The layout is the model's own and the observations are well formed: an error here is
        // a bug, reported as no action rather than a panic.
        let actions = ctl.observe(sim.machine.topology(), &layout, &obs).unwrap_or_default();
        for action in actions {
            match action {
                Action::Move { component: ComponentId(s), to, .. } => {
                    self.stage_cpu[s] = to.0;
                    self.moves += 1;
                    self.kick(to.0, sim);
                }
                Action::SetSpeed { cpu, speed } => self.throttle[cpu.0] = speed,
            }
        }
        self.last_epoch = (self.stage_busy, [0, 1, 2].map(|s| self.queues[s].len()), self.stage_done);
        if self.delivered < self.cfg.packets {
            sim.schedule_in(ns_to_ps(self.cfg.epoch_us * 1e3), Event::Epoch);
        }
    }
}

impl Model for Pipeline {
    type Event = Event;

    fn start(&mut self, sim: &mut Sim<Event>) {
        for cpu in 0..self.state.len() {
            let budget = self.poll_budget(cpu);
            sim.stats.cores.set_poll_budget(cpu, budget);
        }
        for _ in 0..self.cfg.window {
            self.send(0, sim);
        }
        if self.controller.is_some() {
            sim.schedule_in(ns_to_ps(self.cfg.epoch_us * 1e3), Event::Epoch);
        }
    }

    fn on_event(&mut self, event: Event, sim: &mut Sim<Event>) {
        match event {
            Event::Arrive => {
                self.queues[0].push_back(sim.now());
                self.kick(self.stage_cpu[0], sim);
            }
            Event::Woken { cpu } => self.start_next(cpu as usize, sim),
            Event::Done { cpu } => {
                let cpu = cpu as usize;
                let CpuState::Busy { stage, born } = self.state[cpu] else { return };
                self.stage_done[stage] += 1;
                if stage + 1 < STAGES {
                    self.queues[stage + 1].push_back(born);
                    let next = self.stage_cpu[stage + 1];
                    if next != cpu {
                        self.kick(next, sim);
                    }
                } else {
                    self.delivered += 1;
                    sim.stats.record_op(sim.now() - born);
                    let wire = ns_to_ps(self.cfg.wire_ns);
                    self.send(wire, sim);
                }
                self.start_next(cpu, sim);
            }
            Event::Epoch => self.epoch(sim),
        }
    }

    fn report(&self, sim: &Sim<Event>) -> ModelReport {
        let elapsed_ns = ps_to_ns(sim.now()).max(1.0);
        let gbps = self.delivered as f64 * f64::from(self.cfg.payload_bytes) * 8.0 / elapsed_ns;
        let mut metrics = vec![Metric::new("throughput", gbps, "Gbit/s")];
        for (name, busy) in NAMES.iter().zip(self.stage_busy) {
            metrics.push(Metric::new(format!("{name} utilisation"), ps_to_ns(busy) / elapsed_ns, "fraction"));
        }
        let mut used: Vec<usize> = self.stage_cpu.to_vec();
        used.sort();
        used.dedup();
        let resources: f64 = used.iter().map(|&c| self.throttle[c]).sum();
        metrics.push(Metric::new("core resources", resources, "full-speed CPUs"));
        metrics.push(Metric::new("sleeps per ms", self.sleeps as f64 / (elapsed_ns / 1e6), "per ms"));
        if self.controller.is_some() {
            metrics.push(Metric::new("controller moves", self.moves as f64, "moves"));
            metrics.push(Metric::new("cpus used", used.len() as f64, "cpus"));
            for (name, &cpu) in NAMES.iter().zip(&self.stage_cpu) {
                metrics.push(Metric::new(format!("{name} cpu"), cpu as f64, "cpu"));
                metrics.push(Metric::new(format!("{name} speed"), self.throttle[cpu], "fraction"));
            }
        }
        ModelReport { op_name: "packet".into(), metrics }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::run_scenario;
    use crate::scenario::ScenarioDoc;
    use crate::stats::Report;

    fn scenario(workload: &str) -> Scenario {
        let text = format!(
            "seed = 1\n[machine]\npreset = \"multiserver-xeon\"\n[workload]\nkind = \"pipeline\"\n{workload}"
        );
        ScenarioDoc::parse("t.toml", &text).unwrap().validate().unwrap()
    }

    fn metric(r: &Report, name: &str) -> f64 {
        r.model.metrics.iter().find(|m| m.name == name).unwrap_or_else(|| panic!("no {name}")).value
    }

    fn run(workload: &str) -> Report {
        run_scenario(&scenario(workload), &mut |_| {}).unwrap()
    }

    #[test]
    fn one_packet_by_hand() {
        // One packet, polling CPUs, no wire: driver 300 + IP 300 + TCP 450 + 350 stall, on three
        // cores of a 2.3 GHz preset at full speed: 1400 ns from NIC to delivery.
        let r = run("packets = 1\nwindow = 1\nidle = \"poll\"\nwire_ns = 0");
        assert_eq!(r.ops, 1);
        assert_eq!(r.op_latency.as_ref().unwrap().max_ns, 1400.0);
    }

    #[test]
    fn every_packet_is_delivered_whatever_the_layout() {
        for w in [
            "placement = [0, 0, 0]",
            "placement = [0, 1, 2]\nidle = \"park\"",
            "placement = [2, 3, 4]\nspeed = 0.25",
            "controller = true\nplacement = [0, 0, 0]\nallowed = [0, 2, 4, 6]",
        ] {
            let r = run(&format!("packets = 3000\n{w}"));
            assert_eq!(r.ops, 3000, "{w}");
            let busy: f64 = r.cpus.iter().map(|c| c.busy_ns + c.idle_ns).sum::<f64>() / r.cpus.len() as f64;
            assert!((busy - r.elapsed_ns).abs() < 1.0, "busy + idle = elapsed: {w}");
        }
    }

    /// The parameters of `scenarios/multiserver-sweep.toml`: TCP at full speed, the driver
    /// and IP cores throttled to `speed`.
    fn sweep_point(idle: &str, speed: f64) -> Report {
        run(&format!(
            "tcp_speed = 1.0\nwindow = 16\nsleep_ns = 200\npackets = 20000\nidle = \"{idle}\"\nspeed = {speed}"
        ))
    }

    #[test]
    fn slower_is_faster_when_fast_cores_sleep() {
        // Parking at once: at a quarter speed the driver and IP cores stay busy and seldom
        // sleep; at 3/8 they fall asleep between packets and the wake-ups cost more than the
        // extra speed gives.
        let slow = sweep_point("park", 0.25);
        let faster = sweep_point("park", 0.375);
        assert!(metric(&slow, "throughput") > metric(&faster, "throughput"));
        assert!(metric(&slow, "sleeps per ms") < metric(&faster, "sleeps per ms"));
        // Polling removes the effect.
        let slow = sweep_point("poll", 0.25);
        let faster = sweep_point("poll", 0.375);
        assert!(metric(&slow, "throughput") <= metric(&faster, "throughput"));
        assert_eq!(metric(&faster, "sleeps per ms"), 0.0);
        // And slower cores are good enough: 5/8 of full speed already delivers what full does.
        let full = sweep_point("park", 1.0);
        let part = sweep_point("park", 0.625);
        assert!(metric(&part, "throughput") >= 0.99 * metric(&full, "throughput"));
    }

    #[test]
    fn the_controller_consolidates_a_light_load_and_slows_it_down() {
        // Three dedicated cores for a trickle: the controller packs the stack onto one slow CPU.
        let r = run("controller = true\nwindow = 1\npackets = 4000\nepoch_us = 100\nallowed = [0, 2, 4, 6]");
        assert_eq!(metric(&r, "cpus used"), 1.0, "{:?}", r.model.metrics);
        assert!(metric(&r, "controller moves") >= 2.0);
        assert!(metric(&r, "tcp speed") < 0.5);
    }

    #[test]
    fn the_controller_gives_tcp_its_own_core_under_load_and_settles() {
        let r = run(
            "controller = true\nplacement = [0, 0, 0]\nwindow = 48\nsleep_ns = 200\npackets = 20000\nallowed = [0, 1, 2, 3, 4, 5, 6, 7]",
        );
        let tcp = metric(&r, "tcp cpu");
        assert_ne!(tcp, metric(&r, "driver cpu"), "{:?}", r.model.metrics);
        assert_ne!(tcp, metric(&r, "ip cpu"));
        // A handful of moves, not a flip-flop every window.
        assert!(metric(&r, "controller moves") <= 6.0, "{:?}", r.model.metrics);
    }

    #[test]
    fn bad_workloads_are_errors_naming_the_key() {
        for (w, key) in [
            ("placement = [0, 1]", "workload.placement"),
            ("placement = [0, 1, 99]", "workload.placement[2]"),
            ("speed = 0", "workload.speed"),
            ("tcp_speed = 2", "workload.tcp_speed"),
            ("work_ns = [1, -1, 1]", "workload.work_ns[1]"),
            ("window = 0", "workload.window"),
            ("line_rate_gbps = 0", "workload.line_rate_gbps"),
            ("controller = true\nallowed = [40]", "workload.allowed[0]"),
            ("speeed = 1", "workload"),
        ] {
            let text =
                format!("[machine]\npreset = \"multiserver-xeon\"\n[workload]\nkind = \"pipeline\"\n{w}");
            let s = ScenarioDoc::parse("t.toml", &text).unwrap().validate().unwrap();
            let err = Pipeline::from_scenario(&s).unwrap_err();
            assert!(err.key.starts_with(key), "{w}: {err}");
        }
    }

    #[test]
    fn same_seed_same_report() {
        let a = run("packets = 2000\nidle = \"poll-then-park\"");
        let b = run("packets = 2000\nidle = \"poll-then-park\"");
        assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
    }
}
