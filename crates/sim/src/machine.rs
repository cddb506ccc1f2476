//! The modelled machine: a `corehop_topology::Machine` plus the costs of running on it.
//!
//! Work is given in nanoseconds *at full speed* and takes `work / speed` on a CPU, where speed
//! is the CPU's effective speed (hardware speed × emulated speed). Memory stalls do not scale
//! with speed: a slow core waits for DRAM as long as a fast one. That split is what makes OS-like
//! (memory-bound) code lose little on a slow core, the premise of the core-switching paper.
//!
//! A hop (one task moving from CPU `a` to CPU `b`) costs, with [`SimMachine::hop`]:
//!
//! ```text
//!  a: |-- source path (a's speed) + cache misses --|                      (a is then free)
//!                                                  |-- signal --|
//!  b:                                                           |-- wake? + interrupt? + target path
//!                                                                   + task state pulled from a --|
//! ```
//!
//! The signal is an IPI plus an interrupt handler (V1–V3), a polling idle loop that notices a
//! flag (V4), or a cross-core wake-up issued as the source path starts, which hides the
//! power-up delay behind the source path when that path is long enough (V5).

use serde::{Deserialize, Serialize};

use corehop_topology::{CoreClass, Machine};

use crate::engine::{ns_to_ps, Ps};
use crate::scenario::Problem;

/// How a task moves between cores (the paper's V1–V5).
///
/// In the runtime's terms (docs/architecture.md): `Affinity` is `Mechanism::Affinity`; `Handoff` and
/// `FastPath` are `Mechanism::Handoff` through a slow or a fast scheduler path with an IPI
/// wake; `Spin` is the fast hand-off with `Wake::Spin`, `Wakeup` with `Wake::Park` on a CPU
/// that can be woken early (UMWAIT-like). `Wake::SpinThenPark` is the switch model's
/// `mechanism = "spinpark"`, which picks `Spin` or `FastPath` timing per hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mechanism {
    /// V1: the kernel's migration thread (`sched_setaffinity`): an extra context switch.
    #[serde(alias = "v1")]
    Affinity,
    /// V2: the task hands itself to the target through the (modified) scheduler; IPI wake.
    #[serde(alias = "v2")]
    Handoff,
    /// V3: scheduler fast paths on source and target; IPI wake.
    #[serde(alias = "v3")]
    FastPath,
    /// V4: fast paths, and idle cores poll instead of sleeping: no IPI, no wake-up delay.
    #[serde(alias = "v4")]
    Spin,
    /// V5: fast paths, idle cores sleep, the source issues a cross-core wake-up early.
    #[serde(alias = "v5")]
    Wakeup,
}

impl Mechanism {
    /// Every mechanism, in the paper's order V1..V5.
    pub const ALL: [Mechanism; 5] =
        [Mechanism::Affinity, Mechanism::Handoff, Mechanism::FastPath, Mechanism::Spin, Mechanism::Wakeup];

    /// The scenario name ("affinity", ...).
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Affinity => "affinity",
            Mechanism::Handoff => "handoff",
            Mechanism::FastPath => "fastpath",
            Mechanism::Spin => "spin",
            Mechanism::Wakeup => "wakeup",
        }
    }

    /// The paper's name ("V1", ...).
    pub fn paper_name(self) -> &'static str {
        match self {
            Mechanism::Affinity => "V1",
            Mechanism::Handoff => "V2",
            Mechanism::FastPath => "V3",
            Mechanism::Spin => "V4",
            Mechanism::Wakeup => "V5",
        }
    }

    /// Whether idle CPUs poll (and so never need waking) under this mechanism.
    pub fn idle_polls(self) -> bool {
        self == Mechanism::Spin
    }
}

/// Software path of one hop mechanism, at full speed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathCost {
    /// Instructions run on the source CPU to leave it (ns at full speed).
    pub src_ns: f64,
    /// Instructions run on the target CPU to pick the task up (ns at full speed).
    pub dst_ns: f64,
    /// Code and data each side touches (KiB); what does not fit in the CPU's L1 misses to
    /// the next cache level.
    pub footprint_kib: f64,
}

/// Software paths of the hop mechanisms. V4 and V5 use the fast path.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HopPaths {
    /// V1, [`Mechanism::Affinity`].
    pub affinity: PathCost,
    /// V2, [`Mechanism::Handoff`].
    pub handoff: PathCost,
    /// V3, [`Mechanism::FastPath`]; also V4 and V5.
    pub fastpath: PathCost,
    /// Extra instructions of V5 on the target (issue the wake-up, reset flags), ns at full speed.
    pub wakeup_extra_ns: f64,
}

/// Cost parameters of a machine. Every field has a default; presets override some
/// (see [`CostModel::for_preset`]); a scenario's `[costs]` table overrides any.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CostModel {
    /// Full-speed clock in GHz; converts cycle counts (the wake-up delay) to time. A CPU with
    /// an emulated speed runs its clock at that fraction.
    pub clock_ghz: f64,
    /// Clock of each CPU in GHz, by dense id, for machines whose cores run at different clocks;
    /// empty: every CPU runs at `clock_ghz` × its emulated speed.
    pub cpu_clock_ghz: Vec<f64>,
    /// Latency of an L1 hit, ns.
    pub l1_latency_ns: f64,
    /// Latency of an L2 hit, ns.
    pub l2_latency_ns: f64,
    /// Latency of an L3 hit, ns.
    pub l3_latency_ns: f64,
    /// Latency of a DRAM access, ns.
    pub mem_latency_ns: f64,
    /// Bringing one line from another core's cache, ns.
    pub remote_line_ns: f64,
    /// Fraction of its speed an SMT context keeps while a sibling context is busy (0..=1].
    pub smt_interference: f64,
    /// Interrupt entry + handler + exit, ns at full speed.
    pub interrupt_ns: f64,
    /// Sending an inter-processor interrupt until the target takes it, ns.
    pub ipi_latency_ns: f64,
    /// Power-up delay of a core woken from a low-power wait, in that core's cycles.
    pub wake_delay_cycles: f64,
    /// Cache lines of task state (registers, stack top, task struct) that follow a hop.
    pub task_state_lines: u32,
    /// The software path of each hop mechanism.
    pub hop: HopPaths,
}

impl Default for CostModel {
    /// A current desktop-class x86 machine.
    fn default() -> CostModel {
        CostModel {
            clock_ghz: 3.0,
            cpu_clock_ghz: Vec::new(),
            l1_latency_ns: 1.3,
            l2_latency_ns: 4.0,
            l3_latency_ns: 14.0,
            mem_latency_ns: 80.0,
            remote_line_ns: 45.0,
            smt_interference: 0.6,
            interrupt_ns: 500.0,
            ipi_latency_ns: 800.0,
            wake_delay_cycles: 3000.0,
            task_state_lines: 8,
            hop: HopPaths {
                affinity: PathCost { src_ns: 2500.0, dst_ns: 1500.0, footprint_kib: 24.0 },
                handoff: PathCost { src_ns: 800.0, dst_ns: 700.0, footprint_kib: 16.0 },
                fastpath: PathCost { src_ns: 250.0, dst_ns: 250.0, footprint_kib: 8.0 },
                wakeup_extra_ns: 40.0,
            },
        }
    }
}

impl CostModel {
    /// The cost parameters of a named machine (the same names as the topology presets);
    /// unknown names get the defaults.
    ///
    /// The `switch-*` values are calibrated against the M5 Alpha model of the core-switching
    /// paper (3 GHz, 4 ns shared L2, 25 ns memory, 160 ns interrupt path): with them the
    /// simulated `gettid` round trip on `switch-cc` is within a few percent of Table 2(b).
    pub fn for_preset(name: &str) -> CostModel {
        let base = CostModel::default();
        match name {
            n if n.starts_with("switch-") => CostModel {
                clock_ghz: 3.0,
                // Upper-case letters of the paper's names run at 3 GHz, lower-case at 750 MHz.
                cpu_clock_ghz: switch_clocks(n),
                l1_latency_ns: 0.67,
                l2_latency_ns: 4.0,
                l3_latency_ns: 4.0,
                mem_latency_ns: 25.0,
                remote_line_ns: 30.0,
                interrupt_ns: 160.0,
                ipi_latency_ns: 150.0,
                wake_delay_cycles: 0.0,
                task_state_lines: 16,
                hop: HopPaths {
                    affinity: PathCost { src_ns: 990.0, dst_ns: 495.0, footprint_kib: 36.6 },
                    handoff: PathCost { src_ns: 420.0, dst_ns: 354.0, footprint_kib: 36.5 },
                    fastpath: PathCost { src_ns: 212.0, dst_ns: 212.0, footprint_kib: 31.3 },
                    wakeup_extra_ns: 28.0,
                },
                ..base
            },
            "o2-16core" => CostModel {
                clock_ghz: 2.0,
                l2_latency_ns: 7.5,
                l3_latency_ns: 25.0,
                mem_latency_ns: 120.0,
                remote_line_ns: 100.0,
                ..base
            },
            "offload-2core" => CostModel {
                clock_ghz: 1.0,
                l2_latency_ns: 10.0,
                l3_latency_ns: 10.0,
                mem_latency_ns: 90.0,
                remote_line_ns: 25.0,
                ..base
            },
            "multiserver-xeon" => CostModel {
                clock_ghz: 2.3,
                l3_latency_ns: 18.0,
                mem_latency_ns: 90.0,
                remote_line_ns: 60.0,
                smt_interference: 0.55,
                ..base
            },
            "smt-2way" => CostModel { smt_interference: 0.55, ..base },
            "hybrid-laptop" => CostModel {
                clock_ghz: 4.5,
                l3_latency_ns: 12.0,
                mem_latency_ns: 95.0,
                remote_line_ns: 55.0,
                smt_interference: 0.62,
                ..base
            },
            _ => base,
        }
    }

    /// Every field that is not a valid cost, as (field, problem). Latencies must be finite and
    /// >= 0, the clocks > 0, the SMT factor in (0, 1].
    pub fn problems(&self) -> Vec<(String, Problem)> {
        let mut out = Vec::new();
        let mut non_negative = |name: &str, v: f64| {
            if v < 0.0 {
                out.push((name.to_string(), Problem::Negative(v.to_string())));
            } else if !v.is_finite() {
                out.push((name.to_string(), Problem::Invalid(format!("must be a finite number, got {v:?}"))));
            }
        };
        non_negative("l1_latency_ns", self.l1_latency_ns);
        non_negative("l2_latency_ns", self.l2_latency_ns);
        non_negative("l3_latency_ns", self.l3_latency_ns);
        non_negative("mem_latency_ns", self.mem_latency_ns);
        non_negative("remote_line_ns", self.remote_line_ns);
        non_negative("interrupt_ns", self.interrupt_ns);
        non_negative("ipi_latency_ns", self.ipi_latency_ns);
        non_negative("wake_delay_cycles", self.wake_delay_cycles);
        non_negative("hop.wakeup_extra_ns", self.hop.wakeup_extra_ns);
        for (name, p) in
            [("affinity", self.hop.affinity), ("handoff", self.hop.handoff), ("fastpath", self.hop.fastpath)]
        {
            non_negative(&format!("hop.{name}.src_ns"), p.src_ns);
            non_negative(&format!("hop.{name}.dst_ns"), p.dst_ns);
            non_negative(&format!("hop.{name}.footprint_kib"), p.footprint_kib);
        }
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !positive(self.clock_ghz) {
            out.push((
                "clock_ghz".into(),
                Problem::Invalid(format!("must be > 0, got {:?}", self.clock_ghz)),
            ));
        }
        for (i, &ghz) in self.cpu_clock_ghz.iter().enumerate() {
            if !positive(ghz) {
                out.push((
                    format!("cpu_clock_ghz[{i}]"),
                    Problem::Invalid(format!("must be > 0, got {ghz:?}")),
                ));
            }
        }
        if !(self.smt_interference > 0.0 && self.smt_interference <= 1.0) {
            let why = format!("must be in (0, 1], got {:?}", self.smt_interference);
            out.push(("smt_interference".into(), Problem::Invalid(why)));
        }
        out
    }

    fn path(&self, mechanism: Mechanism) -> PathCost {
        match mechanism {
            Mechanism::Affinity => self.hop.affinity,
            Mechanism::Handoff => self.hop.handoff,
            Mechanism::FastPath | Mechanism::Spin | Mechanism::Wakeup => self.hop.fastpath,
        }
    }
}

/// Per-CPU clocks of the 750 MHz `switch-*` presets (CPU ids follow the paper's letters).
fn switch_clocks(preset: &str) -> Vec<f64> {
    let letters = match preset {
        "switch-cs-quarter" => "Cs",
        "switch-cc-quarter" => "Cc",
        "switch-ccss-quarter" => "CCss",
        _ => return Vec::new(),
    };
    letters.chars().map(|c| if c.is_ascii_lowercase() { 0.75 } else { 3.0 }).collect()
}

/// Per-CPU facts the engine needs, derived once from the topology and the costs.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuModel {
    /// Big, little or uniform, from the topology.
    pub class: CoreClass,
    /// Effective speed (hardware × emulated), relative to full speed 1.0.
    pub speed: f64,
    /// Clock in GHz (full-speed clock × emulated speed).
    pub clock_ghz: f64,
    /// Bytes of level-1 cache (all kinds) this CPU uses.
    pub l1_bytes: u64,
    /// Cache line size in bytes (64 when the topology gives none).
    pub line_bytes: u64,
    /// Latency of the level below L1 (L2, else L3, else memory).
    pub miss_latency: Ps,
    /// Other hardware threads of the same core.
    pub siblings: Vec<usize>,
}

/// When the parts of one hop happen, relative to the moment the source path starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HopTiming {
    /// The source CPU is busy this long, then free.
    pub src: Ps,
    /// From the end of the source path until the target CPU starts picking the task up.
    pub transit: Ps,
    /// The target CPU is busy this long before the task runs its own code there.
    pub dst: Ps,
}

impl HopTiming {
    /// From the start of the source path until the task runs on the target.
    pub fn total(&self) -> Ps {
        self.src + self.transit + self.dst
    }
}

/// A machine ready to simulate: topology, costs and per-CPU derived facts.
#[derive(Debug, Clone)]
pub struct SimMachine {
    machine: Machine,
    costs: CostModel,
    cpus: Vec<CpuModel>,
}

impl SimMachine {
    /// Combines a topology with cost parameters (assumed valid: see [`CostModel::problems`]).
    pub fn new(machine: Machine, costs: CostModel) -> SimMachine {
        let cpus = machine
            .cpus()
            .iter()
            .map(|cpu| {
                let caches: Vec<_> = machine.caches_of(cpu.id).collect();
                let l1_bytes = caches.iter().filter(|c| c.level == 1).map(|c| c.size_bytes).sum();
                let line_bytes =
                    caches.iter().map(|c| u64::from(c.line_bytes)).find(|&l| l > 0).unwrap_or(64);
                let lowest_below_l1 = caches.iter().map(|c| c.level).filter(|&l| l > 1).min();
                let miss_latency = ns_to_ps(match lowest_below_l1 {
                    Some(2) => costs.l2_latency_ns,
                    Some(_) => costs.l3_latency_ns,
                    None => costs.mem_latency_ns,
                });
                let emulated = cpu.emulated_speed.unwrap_or(1.0);
                let clock = costs.cpu_clock_ghz.get(cpu.id.0).copied().unwrap_or(costs.clock_ghz);
                CpuModel {
                    class: cpu.class,
                    speed: cpu.effective_speed(),
                    clock_ghz: clock * emulated,
                    l1_bytes,
                    line_bytes,
                    miss_latency,
                    siblings: machine
                        .smt_siblings(cpu.id)
                        .into_iter()
                        .map(|s| s.0)
                        .filter(|&s| s != cpu.id.0)
                        .collect(),
                }
            })
            .collect();
        SimMachine { machine, costs, cpus }
    }

    /// The machine's name (the preset's, or the description's `name`).
    pub fn name(&self) -> &str {
        &self.machine.name
    }

    /// The topology it was built from.
    pub fn topology(&self) -> &Machine {
        &self.machine
    }

    /// The cost parameters in force.
    pub fn costs(&self) -> &CostModel {
        &self.costs
    }

    /// How many CPUs it has; CPU indexes run from 0 to this, exclusive.
    pub fn cpu_count(&self) -> usize {
        self.cpus.len()
    }

    /// Derived facts of `cpu` (panics if it does not exist: scenarios are validated first).
    pub fn cpu(&self, cpu: usize) -> &CpuModel {
        &self.cpus[cpu]
    }

    /// Time to run `work` (picoseconds at full speed) on `cpu`; `sibling_busy` applies the SMT
    /// interference factor.
    pub fn exec(&self, cpu: usize, work: Ps, sibling_busy: bool) -> Ps {
        let mut speed = self.cpus[cpu].speed;
        if sibling_busy {
            speed *= self.costs.smt_interference;
        }
        (work as f64 / speed).round() as Ps
    }

    /// Stall time of touching `footprint` bytes of code and data on `cpu`: what does not fit
    /// in its L1 comes from the next level.
    pub fn capacity_stall(&self, cpu: usize, footprint: u64) -> Ps {
        let c = &self.cpus[cpu];
        let missing = footprint.saturating_sub(c.l1_bytes);
        missing.div_ceil(c.line_bytes) * c.miss_latency
    }

    /// Power-up delay of `cpu` from a low-power wait.
    pub fn wake_delay(&self, cpu: usize) -> Ps {
        ns_to_ps(self.costs.wake_delay_cycles / self.cpus[cpu].clock_ghz)
    }

    /// The timing of one hop of a task from `from` to `to` with `mechanism`. `target_idle`
    /// says whether `to` was idle (asleep unless the mechanism polls) when the hop began.
    pub fn hop(&self, mechanism: Mechanism, from: usize, to: usize, target_idle: bool) -> HopTiming {
        let c = &self.costs;
        let path = c.path(mechanism);
        let footprint = (path.footprint_kib * 1024.0).round() as u64;
        let src = self.exec(from, ns_to_ps(path.src_ns), false) + self.capacity_stall(from, footprint);
        let remote_line = ns_to_ps(c.remote_line_ns);
        let pickup = self.exec(to, ns_to_ps(path.dst_ns), false)
            + self.capacity_stall(to, footprint)
            + u64::from(c.task_state_lines) * remote_line;
        let asleep = target_idle && !mechanism.idle_polls();
        let wake = if asleep { self.wake_delay(to) } else { 0 };
        match mechanism {
            Mechanism::Affinity | Mechanism::Handoff | Mechanism::FastPath => HopTiming {
                src,
                transit: ns_to_ps(c.ipi_latency_ns),
                dst: wake + self.exec(to, ns_to_ps(c.interrupt_ns), false) + pickup,
            },
            Mechanism::Spin => HopTiming { src, transit: remote_line, dst: pickup },
            // The wake-up is issued as the source path starts, so only the part of the
            // power-up delay longer than the source path shows. If the target is not awake
            // and polling (flag set: one line transfer) by the time the source path ends, the
            // source falls back to an IPI and the target takes the interrupt (§7.2).
            Mechanism::Wakeup if asleep && wake + remote_line > src => HopTiming {
                src,
                transit: ns_to_ps(c.ipi_latency_ns).max(wake - src.min(wake)),
                dst: self.exec(to, ns_to_ps(c.interrupt_ns), false)
                    + pickup
                    + self.exec(to, ns_to_ps(c.hop.wakeup_extra_ns), false),
            },
            Mechanism::Wakeup => HopTiming {
                src,
                transit: remote_line,
                dst: pickup + self.exec(to, ns_to_ps(c.hop.wakeup_extra_ns), false),
            },
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use corehop_topology::{Cache, CacheKind, Cpu, CpuId};

    /// A machine of `speeds.len()` single-thread cores with the given speeds and L1 sizes
    /// (KiB, split evenly into I and D), sharing one L2.
    pub(crate) fn machine(speeds: &[(f64, Option<f64>, u64)]) -> Machine {
        let n = speeds.len();
        let cpus = speeds
            .iter()
            .enumerate()
            .map(|(i, &(speed, emulated, _))| Cpu {
                id: CpuId(i),
                os_id: corehop_topology::OsCpu(i),
                core: i,
                package: 0,
                class: if speed < 1.0 { CoreClass::Little } else { CoreClass::Big },
                speed,
                emulated_speed: emulated,
            })
            .collect();
        let mut caches = Vec::new();
        for (i, &(_, _, l1_kib)) in speeds.iter().enumerate() {
            for kind in [CacheKind::Instruction, CacheKind::Data] {
                caches.push(Cache {
                    level: 1,
                    kind,
                    size_bytes: l1_kib * 512,
                    line_bytes: 64,
                    cpus: vec![CpuId(i)],
                });
            }
        }
        caches.push(Cache {
            level: 2,
            kind: CacheKind::Unified,
            size_bytes: 3584 * 1024,
            line_bytes: 64,
            cpus: (0..n).map(CpuId).collect(),
        });
        Machine { name: "test".into(), source: "test".into(), cpus, caches, waitpkg: false }
    }

    /// `n` identical full-speed cores with 64 KiB L1.
    pub(crate) fn uniform_machine(n: usize) -> SimMachine {
        SimMachine::new(machine(&vec![(1.0, None, 64); n]), CostModel::default())
    }

    #[test]
    fn exec_scales_with_speed_and_smt_interference() {
        let m = SimMachine::new(machine(&[(1.0, None, 64), (0.5, Some(0.5), 8)]), CostModel::default());
        assert_eq!(m.exec(0, 1000, false), 1000);
        assert_eq!(m.exec(1, 1000, false), 4000);
        assert_eq!(m.exec(0, 600, true), 1000);
        assert_eq!(m.cpu(1).clock_ghz, 1.5);
    }

    #[test]
    fn capacity_stall_counts_lines_beyond_l1() {
        let m =
            SimMachine::new(machine(&[(1.0, None, 64), (1.0, None, 8)]), CostModel::for_preset("switch-cs"));
        assert_eq!(m.capacity_stall(0, 64 * 1024), 0);
        // 16 KiB beyond an 8 KiB L1 = 256 lines of 64 B at 4 ns.
        assert_eq!(m.capacity_stall(1, 24 * 1024), 256 * 4000);
    }

    #[test]
    fn hop_timing_by_hand() {
        let costs = CostModel {
            remote_line_ns: 10.0,
            ipi_latency_ns: 100.0,
            interrupt_ns: 50.0,
            wake_delay_cycles: 300.0, // 100 ns at 3 GHz
            task_state_lines: 2,
            hop: HopPaths {
                affinity: PathCost { src_ns: 1000.0, dst_ns: 500.0, footprint_kib: 0.0 },
                handoff: PathCost { src_ns: 400.0, dst_ns: 300.0, footprint_kib: 0.0 },
                fastpath: PathCost { src_ns: 60.0, dst_ns: 40.0, footprint_kib: 0.0 },
                wakeup_extra_ns: 5.0,
            },
            ..CostModel::default()
        };
        let m = SimMachine::new(machine(&[(1.0, None, 64), (1.0, None, 64)]), costs.clone());
        let ns = |t: HopTiming| (t.src / 1000, t.transit / 1000, t.dst / 1000);
        // V3 to a sleeping core: IPI, wake-up delay, interrupt, target path, 2 lines.
        assert_eq!(ns(m.hop(Mechanism::FastPath, 0, 1, true)), (60, 100, 100 + 50 + 40 + 20));
        // ... to a busy core: no wake-up delay.
        assert_eq!(ns(m.hop(Mechanism::FastPath, 0, 1, false)), (60, 100, 50 + 40 + 20));
        // V4: the idle loop polls, so one line transfer signals it.
        assert_eq!(ns(m.hop(Mechanism::Spin, 0, 1, true)), (60, 10, 40 + 20));
        // V5: a 100 ns wake-up issued at the start of a 60 ns source path is late: the source
        // sends an IPI (100 ns; the remaining 40 ns of power-up overlap it) and the target
        // takes the interrupt.
        assert_eq!(ns(m.hop(Mechanism::Wakeup, 0, 1, true)), (60, 100, 50 + 40 + 20 + 5));
        // ... in time behind a 200 ns source path: the target polls, no IPI.
        let mut slow_source = costs;
        slow_source.hop.fastpath.src_ns = 200.0;
        let m2 = SimMachine::new(machine(&[(1.0, None, 64), (1.0, None, 64)]), slow_source);
        assert_eq!(ns(m2.hop(Mechanism::Wakeup, 0, 1, true)), (200, 10, 40 + 20 + 5));
        assert_eq!(ns(m.hop(Mechanism::Affinity, 0, 1, false)), (1000, 100, 50 + 500 + 20));
    }

    #[test]
    fn cost_problems_name_the_field() {
        let mut c = CostModel::for_preset("switch-cc");
        assert!(c.problems().is_empty());
        c.mem_latency_ns = -5.0;
        c.hop.handoff.dst_ns = f64::NAN;
        c.smt_interference = 0.0;
        let names: Vec<String> = c.problems().into_iter().map(|(k, _)| k).collect();
        assert_eq!(names, ["mem_latency_ns", "hop.handoff.dst_ns", "smt_interference"]);
    }

    #[test]
    fn every_preset_has_valid_costs() {
        for name in [
            "switch-cc",
            "switch-cs",
            "o2-16core",
            "offload-2core",
            "multiserver-xeon",
            "smt-2way",
            "hybrid-laptop",
            "anything",
        ] {
            assert!(CostModel::for_preset(name).problems().is_empty(), "{name}");
        }
    }
}
