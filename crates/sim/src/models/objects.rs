//! `kind = "objects"`: the O² paper's directory-lookup benchmark (o2-coretime §5, Figure 4).
//!
//! Threads repeatedly look up a random file in a random directory (an object of
//! `object_bytes`, 1 000 entries of 32 bytes in the paper). Three schedulers:
//!
//! - `threads`: every lookup runs where its thread is (the paper's "without CoreTime");
//! - `sharded`: every lookup hops to the directory's home CPU, `directory mod CPUs` (static
//!   sharding, what a Seastar user would write);
//! - `o2`: the lookup runs where [`corehop_policy::objects::Placer`] put the directory — the
//!   same placer, fed the same per-period samples, as the live runtime (CoreTime).
//!
//! ```toml
//! [workload]
//! kind = "objects"
//! scheduler = "o2"               # threads | sharded | o2
//! total_kib = 4096               # all directories together
//! object_bytes = 32000           # one directory
//! entries = 1000                 # entries per directory (a lookup scans to a random one)
//! popularity = "uniform"         # uniform | oscillating
//! oscillate_us = 20000           # oscillating: phase length; the active set flips between
//! oscillate_divisor = 16         #   all directories and 1/16 of them, as in Figure 4(b)
//! threads_per_cpu = 2
//! mechanism = "spin"             # how lookups hop (CoreTime's migration polls a flag: spin)
//! batch = 1                      # o2: lookups per batch bound for another CPU (1: a hop each)
//! entry_ns = 1.0                 # compare work per entry at full speed
//! mlp = 1.0                      # cache lines in flight during a scan (1: latency-bound, as
//!                                #   the paper's 2009 Opteron scans were; raise for prefetch)
//! period_us = 10000              # placement period (o2; the runtime's default)
//! gate = true                    # o2: weigh following the placer at all against staying
//! warmup_us = 10000              # lookups before this are not counted
//! ```
//!
//! **Cache model.** Each CPU's private cache of level ≥ 2 and the shared last-level cache of
//! its chip hold whole directories, least recently used first out. A lookup finds its directory
//! in the private cache (L2 latency per line), the chip's shared cache (L3 latency; the line
//! moves up, the shared cache is a victim cache as on the paper's Opterons), another cache
//! (cross-cache transfer latency; read-only, so the copy stays) or memory; the directory then
//! sits in the private cache and what it displaces drops to the shared cache. A scan costs
//! `entries scanned × entry_ns` of work (scaled by the CPU's speed) plus `lines × latency /
//! mlp` of stall. Lookups on one directory are serialised by its lock (the paper's
//! per-directory spin locks): a lookup waits, busy, until the directory is free.
//!
//! **The gate.** As in the live registry, following the placer's routes is itself a move that
//! must pay: a [`corehop_policy::payoff::ArmSampler`] over "every lookup where its thread is"
//! (arm 0) and "the placer's routes" (arm 1), scored by the lookups each period completes,
//! sets whether the next period follows the routes and how long it lasts (a trial period is
//! shorter). While it stays, the placer still watches and places; its routes wait. It starts
//! staying, as the runtime's does, and its first trial waits until its regret budget covers
//! it: on the paper's machine with 10 ms periods the routes take over after about 0.4 s of
//! virtual time, so O² scenarios warm up for longer than that.
//!
//! **Batches.** With `batch` > 1 the lookups a thread sends to another CPU travel `batch` at a
//! time, as `Objects::read_batch` sends them: a lookup still runs on the target CPU (its
//! cache, its lock, its queue), but pays `1/batch` of the hop's CPU time on each side, as its
//! share of one request; the placer is told that share as a batched move's cost.
use std::collections::{BTreeMap, HashMap};

use rand::Rng;
use serde::Deserialize;

use corehop_policy::objects::{
    CoreSample, ObjectHints, ObjectId, ObjectSample, Placement, Placer, PlacerConfig,
};
use corehop_policy::payoff::{ArmSampler, PayoffConfig, STAY};
use corehop_topology::{CacheKind, CpuId, Machine};

use crate::engine::{ns_to_ps, ps_to_ns, Model, Ps, Sim};
use crate::machine::{HopTiming, Mechanism};
use crate::models::{FromScenario, ModelEntry};
use crate::scenario::{Problem, Scenario, ScenarioError};
use crate::stats::{Metric, ModelReport, RunQueues};

/// Registry entry.
pub const ENTRY: ModelEntry = ModelEntry::of::<Objects>(
    "objects",
    "O² directory lookups: plain threads vs static sharding vs O² cache packing (o2-coretime §5)",
);

/// Which scheduler places lookups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheduler {
    /// Every lookup runs on its thread's CPU (no hop).
    Threads,
    /// Every lookup hops to its directory's home CPU, `directory mod CPUs`.
    Sharded,
    /// Every lookup hops to where the O² placer put its directory.
    O2,
}

/// Which directories are looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Popularity {
    /// Every directory equally likely, all the time.
    Uniform,
    /// Every `oscillate_us` the active set flips between all directories and
    /// 1/`oscillate_divisor` of them.
    Oscillating,
}

/// The `[workload]` table of `kind = "objects"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectsConfig {
    /// Which scheduler places lookups.
    pub scheduler: Scheduler,
    /// Size of all directories together, KiB; with `object_bytes` it sets how many there are.
    pub total_kib: f64,
    /// Size of one directory, bytes (default 32 000).
    #[serde(default = "d_object_bytes")]
    pub object_bytes: u64,
    /// Entries per directory (default 1000); a lookup scans to a random one.
    #[serde(default = "d_entries")]
    pub entries: u32,
    /// Which directories are looked up (default uniform).
    #[serde(default = "d_popularity")]
    pub popularity: Popularity,
    /// Phase length of the oscillating popularity, µs of virtual time (default 20 000).
    #[serde(default = "d_oscillate_us")]
    pub oscillate_us: f64,
    /// In the small phase, 1/this of the directories are active (default 16).
    #[serde(default = "d_divisor")]
    pub oscillate_divisor: u32,
    /// Lookup threads per CPU (default 2).
    #[serde(default = "d_threads")]
    pub threads_per_cpu: u32,
    /// How a lookup hops to another CPU (default spin, as CoreTime's migration polls a flag).
    #[serde(default = "d_mechanism")]
    pub mechanism: Mechanism,
    /// Lookups per batch bound for another CPU (default 1: each hops on its own).
    #[serde(default = "d_batch")]
    pub batch: u32,
    /// Compare work per entry scanned, ns at full speed (default 1.0).
    #[serde(default = "d_entry_ns")]
    pub entry_ns: f64,
    /// Memory-level parallelism: cache lines in flight during a scan (default 1.0,
    /// latency-bound).
    #[serde(default = "d_mlp")]
    pub mlp: f64,
    /// Placement period of the O² placer, µs of virtual time (default 10 000, the runtime's
    /// default: the gate's trials are fractions of it, and shorter ones end before the
    /// owners' caches have warmed).
    #[serde(default = "d_period_us")]
    pub period_us: f64,
    /// Lookups completing before this time are not counted, µs of virtual time (default 10 000).
    #[serde(default = "d_warmup_us")]
    pub warmup_us: f64,
    /// The placer's knobs (o2), as in `policy::objects::PlacerConfig`.
    #[serde(default)]
    pub placer: PlacerConfig,
    /// Whether following the placer's routes is weighed against running every lookup where its
    /// thread is, period by period, as the live registry's payoff gate does (o2; default
    /// true). `false`: the routes are always followed.
    #[serde(default = "d_gate")]
    pub gate: bool,
}

fn d_gate() -> bool {
    true
}

fn d_object_bytes() -> u64 {
    32_000
}
fn d_entries() -> u32 {
    1000
}
fn d_popularity() -> Popularity {
    Popularity::Uniform
}
fn d_oscillate_us() -> f64 {
    20_000.0
}
fn d_divisor() -> u32 {
    16
}
fn d_threads() -> u32 {
    2
}
fn d_mechanism() -> Mechanism {
    Mechanism::Spin
}
fn d_batch() -> u32 {
    1
}
fn d_entry_ns() -> f64 {
    1.0
}
fn d_mlp() -> f64 {
    1.0
}
fn d_period_us() -> f64 {
    10_000.0
}
fn d_warmup_us() -> f64 {
    10_000.0
}

/// The events of the objects model; `thread` indexes its lookup threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The thread holds its CPU and may start its next lookup.
    Run {
        /// The lookup thread.
        thread: u32,
    },
    /// The thread finished the source half of a hop and leaves its CPU.
    Left {
        /// The lookup thread.
        thread: u32,
    },
    /// The hop's transit is over: the thread queues at its target CPU.
    Queue {
        /// The lookup thread.
        thread: u32,
    },
    /// The target half of the hop is done on the target CPU: the lookup starts.
    Arrive {
        /// The lookup thread.
        thread: u32,
    },
    /// The thread's lookup finished.
    Done {
        /// The lookup thread.
        thread: u32,
    },
    /// The placement period ends (o2).
    Period,
}

/// Where a lookup found its directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Private,
    Shared,
    Remote,
    Memory,
}

/// A cache holding whole objects, least recently used evicted first.
#[derive(Debug, Clone, Default)]
struct Lru {
    capacity: usize,
    stamp_of: HashMap<u32, u64>,
    by_stamp: BTreeMap<u64, u32>,
}

impl Lru {
    fn contains(&self, o: u32) -> bool {
        self.stamp_of.contains_key(&o)
    }

    fn remove(&mut self, o: u32) -> bool {
        match self.stamp_of.remove(&o) {
            Some(s) => {
                self.by_stamp.remove(&s);
                true
            }
            None => false,
        }
    }

    /// Inserts or refreshes `o`; returns what it evicted.
    fn touch(&mut self, o: u32, stamp: u64) -> Option<u32> {
        self.remove(o);
        if self.capacity == 0 {
            return Some(o);
        }
        self.stamp_of.insert(o, stamp);
        self.by_stamp.insert(stamp, o);
        if self.stamp_of.len() > self.capacity {
            let (&s, &victim) = self.by_stamp.iter().next().expect("over capacity means non-empty");
            self.by_stamp.remove(&s);
            self.stamp_of.remove(&victim);
            return Some(victim);
        }
        None
    }
}

/// Every private and shared cache of the machine, in objects.
#[derive(Debug, Clone)]
struct Caches {
    caches: Vec<Lru>,
    /// Per CPU: its private cache and its shared cache (indexes into `caches`).
    private: Vec<Option<usize>>,
    shared: Vec<Option<usize>>,
    /// How many caches hold each object.
    holders: Vec<u32>,
    stamp: u64,
}

impl Caches {
    fn new(machine: &Machine, object_bytes: u64, objects: usize) -> Caches {
        let mut caches = Vec::new();
        let mut index: Vec<(usize, usize)> = Vec::new(); // (machine cache index, our index)
        let mut slot = |i: usize, size: u64, caches: &mut Vec<Lru>| match index.iter().find(|(m, _)| *m == i)
        {
            Some(&(_, ours)) => ours,
            None => {
                caches.push(Lru { capacity: (size / object_bytes.max(1)) as usize, ..Lru::default() });
                index.push((i, caches.len() - 1));
                caches.len() - 1
            }
        };
        let (mut private, mut shared) = (Vec::new(), Vec::new());
        for cpu in machine.cpus() {
            let siblings = machine.smt_siblings(cpu.id);
            let mut mine: Vec<(usize, &corehop_topology::Cache)> = machine
                .caches
                .iter()
                .enumerate()
                .filter(|(_, c)| c.cpus.contains(&cpu.id) && c.level >= 2 && c.kind != CacheKind::Instruction)
                .collect();
            mine.sort_by_key(|(_, c)| c.level);
            let p = mine.iter().rev().find(|(_, c)| c.cpus.iter().all(|x| siblings.contains(x)));
            let s = mine.iter().rev().find(|(_, c)| !c.cpus.iter().all(|x| siblings.contains(x)));
            private.push(p.map(|&(i, c)| slot(i, c.size_bytes, &mut caches)));
            shared.push(s.map(|&(i, c)| slot(i, c.size_bytes, &mut caches)));
        }
        Caches { caches, private, shared, holders: vec![0; objects], stamp: 0 }
    }

    fn insert(&mut self, cache: usize, o: u32) {
        self.stamp += 1;
        let was = self.caches[cache].contains(o);
        let evicted = self.caches[cache].touch(o, self.stamp);
        if !was {
            self.holders[o as usize] += 1;
        }
        if let Some(v) = evicted {
            self.holders[v as usize] -= 1;
            if v != o {
                self.demote(cache, v);
            }
        }
    }

    /// An object evicted from a private cache drops into the shared cache of the same CPUs.
    fn demote(&mut self, from: usize, o: u32) {
        let Some(cpu) = self.private.iter().position(|p| *p == Some(from)) else { return };
        if let Some(shared) = self.shared[cpu] {
            self.stamp += 1;
            if !self.caches[shared].contains(o) {
                self.holders[o as usize] += 1;
            }
            if let Some(v) = self.caches[shared].touch(o, self.stamp) {
                self.holders[v as usize] -= 1;
            }
        }
    }

    /// Looks `o` up from `cpu`, moves it into `cpu`'s private cache and says where it was.
    fn access(&mut self, cpu: usize, o: u32) -> Level {
        let private = self.private[cpu];
        let shared = self.shared[cpu];
        let level = if private.is_some_and(|p| self.caches[p].contains(o)) {
            Level::Private
        } else if shared.is_some_and(|s| self.caches[s].contains(o)) {
            Level::Shared
        } else if self.holders[o as usize] > 0 {
            Level::Remote
        } else {
            Level::Memory
        };
        match (private, shared) {
            (Some(p), s) => {
                if let (Level::Shared, Some(s)) = (level, s) {
                    if self.caches[s].remove(o) {
                        self.holders[o as usize] -= 1;
                    }
                }
                self.insert(p, o);
            }
            (None, Some(s)) => self.insert(s, o),
            (None, None) => {}
        }
        level
    }
}

#[derive(Debug, Clone)]
struct Thread {
    /// Where the thread lives; it returns here after a lookup that ran elsewhere (CoreTime's
    /// `ct_end` hands the thread back to its original core).
    home: usize,
    cpu: usize,
    /// The hop in flight takes the thread home (no lookup at its end).
    returning: bool,
    /// The lookup this thread is doing: directory, entries to scan, when it was issued.
    object: u32,
    scan: u32,
    issued: Ps,
    /// Whether the lookup was routed to an owner (else it ran locally), and the hop it took.
    routed: bool,
    hop: Option<(usize, usize, crate::machine::HopTiming)>,
    hop_ps: Ps,
    /// When the lookup got the directory's lock, and where it found the directory.
    started: Ps,
    level: Level,
}

/// The model's state.
pub struct Objects {
    cfg: ObjectsConfig,
    objects: u32,
    caches: Caches,
    placer: Option<Placer>,
    /// Weighs following the placer's routes against staying (o2 with `gate`).
    gate: Option<ArmSampler>,
    /// Whether lookups follow the placer's routes this period.
    moving: bool,
    /// Lookups completed this period (the gate's score).
    period_ops: u64,
    /// Per CPU: its domain in the placer's budgets.
    domain: Vec<usize>,
    threads: Vec<Thread>,
    queues: RunQueues<u32>,
    /// When each directory's lock is free again.
    free_at: Vec<Ps>,
    samples: Vec<ObjectSample>,
    busy: Vec<Ps>,
    period_started: Ps,
    counted: u64,
    counted_ps: Ps,
    levels: [u64; 4],
    counted_hops: u64,
    moves: u64,
    /// Periods ended (o2), and those after which the routes were followed.
    periods: u64,
    periods_following: u64,
}

/// A checked `[workload]`: the settings, how many objects, and the placer for this machine
/// (no object registered yet).
struct Checked {
    cfg: ObjectsConfig,
    objects: u32,
    cpus: Vec<CpuId>,
    placer: Placer,
}

impl Objects {
    /// Checks the scenario's settings and bounds, allocating nothing per object or thread.
    fn checked(s: &Scenario) -> Result<Checked, ScenarioError> {
        let cfg: ObjectsConfig = s.workload()?;
        let positive = |key: &str, v: f64| {
            if !v.is_finite() || v < 0.0 {
                Err(s.error(key, Problem::Negative(v.to_string())))
            } else if v == 0.0 {
                Err(s.error(key, Problem::Invalid("must be > 0".into())))
            } else {
                Ok(())
            }
        };
        positive("workload.total_kib", cfg.total_kib)?;
        positive("workload.object_bytes", cfg.object_bytes as f64)?;
        positive("workload.entries", f64::from(cfg.entries))?;
        positive("workload.oscillate_us", cfg.oscillate_us)?;
        positive("workload.oscillate_divisor", f64::from(cfg.oscillate_divisor))?;
        positive("workload.threads_per_cpu", f64::from(cfg.threads_per_cpu))?;
        positive("workload.batch", f64::from(cfg.batch))?;
        positive("workload.mlp", cfg.mlp)?;
        positive("workload.period_us", cfg.period_us)?;
        if !(cfg.entry_ns.is_finite() && cfg.entry_ns >= 0.0) {
            return Err(s.error("workload.entry_ns", Problem::Negative(cfg.entry_ns.to_string())));
        }
        if !(cfg.warmup_us.is_finite() && cfg.warmup_us >= 0.0) {
            return Err(s.error("workload.warmup_us", Problem::Negative(cfg.warmup_us.to_string())));
        }
        let objects = ((cfg.total_kib * 1024.0) / cfg.object_bytes as f64).round().max(1.0);
        if objects > super::MAX_OBJECTS as f64 {
            return Err(s.error(
                "workload.total_kib",
                Problem::Invalid(format!(
                    "{objects} directories of {} bytes is too many: at most {}",
                    cfg.object_bytes,
                    super::MAX_OBJECTS
                )),
            ));
        }
        let objects = objects as u32;
        let machine = s.machine.topology();
        let cpus: Vec<CpuId> = machine.cpus().iter().map(|c| c.id).collect();
        let n = cpus.len();
        if n.saturating_mul(cfg.threads_per_cpu as usize) > super::MAX_TASKS {
            return Err(s.error(
                "workload.threads_per_cpu",
                Problem::Invalid(format!(
                    "{} threads on each of {n} CPUs is too many: at most {} in all",
                    cfg.threads_per_cpu,
                    super::MAX_TASKS
                )),
            ));
        }
        let mut placer_cfg = cfg.placer.clone();
        // The placer starts from this machine's hop cost (there and back, CPU time), as the
        // runtime starts from its own.
        let probe = s.machine.hop(cfg.mechanism, 0, n.saturating_sub(1), false);
        placer_cfg.hop_ns_hint = 2.0 * ps_to_ns(probe.src + probe.dst);
        let placer = Placer::for_machine(machine, &cpus, placer_cfg)
            .map_err(|e| s.error("workload.placer", Problem::Invalid(e.to_string())))?;
        Ok(Checked { cfg, objects, cpus, placer })
    }
}

impl FromScenario for Objects {
    fn check(s: &Scenario) -> Result<(), ScenarioError> {
        Objects::checked(s).map(drop)
    }

    fn from_scenario(s: &Scenario) -> Result<Objects, ScenarioError> {
        let Checked { cfg, objects, cpus, mut placer } = Objects::checked(s)?;
        let machine = s.machine.topology();
        let n = cpus.len();
        for _ in 0..objects {
            placer.register(ObjectHints { bytes: cfg.object_bytes, ..ObjectHints::default() });
        }
        let domain = placer.budgets().cores.iter().map(|c| c.domain).collect();
        let o2 = cfg.scheduler == Scheduler::O2;
        let gate = (o2 && cfg.gate)
            .then(|| ArmSampler::new(2, PayoffConfig::default()))
            .transpose()
            .map_err(|e| s.error("workload.gate", Problem::Invalid(e.to_string())))?;
        let moving = gate.as_ref().is_none_or(|g| g.next_epoch().arm != STAY);
        let threads = (0..n * cfg.threads_per_cpu as usize)
            .map(|i| Thread {
                home: i % n,
                cpu: i % n,
                returning: false,
                object: 0,
                scan: 0,
                issued: 0,
                routed: false,
                hop: None,
                hop_ps: 0,
                started: 0,
                level: Level::Memory,
            })
            .collect();
        Ok(Objects {
            caches: Caches::new(machine, cfg.object_bytes, objects as usize),
            placer: o2.then_some(placer),
            gate,
            moving,
            period_ops: 0,
            domain,
            threads,
            queues: RunQueues::new(n),
            free_at: vec![0; objects as usize],
            samples: vec![ObjectSample::default(); objects as usize],
            busy: vec![0; n],
            period_started: 0,
            counted: 0,
            counted_ps: 0,
            levels: [0; 4],
            counted_hops: 0,
            moves: 0,
            periods: 0,
            periods_following: 0,
            objects,
            cfg,
        })
    }
}

impl Objects {
    /// Directories in use now.
    fn active(&self, now: Ps) -> u32 {
        match self.cfg.popularity {
            Popularity::Uniform => self.objects,
            Popularity::Oscillating => {
                let phase = now / ns_to_ps(self.cfg.oscillate_us * 1e3).max(1);
                if phase.is_multiple_of(2) {
                    self.objects
                } else {
                    (self.objects / self.cfg.oscillate_divisor).max(1)
                }
            }
        }
    }

    /// Where a lookup of `o` issued on `cpu` runs.
    fn target(&self, cpu: usize, o: u32) -> usize {
        match (&self.placer, self.cfg.scheduler) {
            (_, Scheduler::Threads) => cpu,
            (_, Scheduler::Sharded) => o as usize % self.busy.len(),
            (Some(_), Scheduler::O2) if !self.moving => cpu,
            (Some(p), Scheduler::O2) => {
                let at_home = p.config().domain_ops_at_home;
                p.placement(ObjectId(o as usize)).target_in(CpuId(cpu), self.domain[cpu], at_home).0
            }
            (None, Scheduler::O2) => cpu,
        }
    }

    /// Whether O² lookups travel in batches.
    fn batched(&self) -> bool {
        self.cfg.scheduler == Scheduler::O2 && self.cfg.batch > 1
    }

    /// A lookup's move from `from` to `to`: a hop of its own, or its share of a batch's (the
    /// CPU time on both sides divided among the batch; the transit is the batch's).
    fn hop(&self, sim: &Sim<Event>, from: usize, to: usize, target_idle: bool) -> HopTiming {
        let mut timing = sim.machine.hop(self.cfg.mechanism, from, to, target_idle);
        if self.batched() {
            let share = u64::from(self.cfg.batch);
            (timing.src, timing.dst) = (timing.src / share, timing.dst / share);
        }
        timing
    }

    fn next(&mut self, t: u32, sim: &mut Sim<Event>) {
        let now = sim.now();
        let active = self.active(now);
        let (o, scan) = {
            let rng = sim.rng();
            (rng.gen_range(0..active), rng.gen_range(1..=self.cfg.entries))
        };
        let cpu = self.threads[t as usize].cpu;
        let target = self.target(cpu, o);
        let th = &mut self.threads[t as usize];
        (th.object, th.scan, th.issued, th.hop_ps) = (o, scan, now, 0);
        th.routed = match (&self.placer, self.cfg.scheduler) {
            (_, Scheduler::Sharded) => true,
            (Some(_), Scheduler::O2) if !self.moving => false,
            (Some(p), Scheduler::O2) => match p.placement(ObjectId(o as usize)) {
                Placement::Core { .. } => true,
                Placement::Domain { domain, .. } => {
                    domain != self.domain[cpu] || p.config().domain_ops_at_home
                }
                Placement::Local | Placement::Replicated => false,
            },
            _ => false,
        };
        if target == cpu {
            self.lookup(t, sim);
        } else {
            let idle = !sim.stats.cores.is_busy(target);
            let timing = self.hop(sim, cpu, target, idle);
            self.threads[t as usize].hop = Some((cpu, target, timing));
            sim.schedule_in(timing.src, Event::Left { thread: t });
        }
    }

    /// Runs thread `t`'s lookup on the CPU it holds.
    fn lookup(&mut self, t: u32, sim: &mut Sim<Event>) {
        let now = sim.now();
        let (cpu, o, scan) = {
            let th = &self.threads[t as usize];
            (th.cpu, th.object, th.scan)
        };
        let level = self.caches.access(cpu, o);
        let costs = sim.machine.costs();
        let latency = match level {
            Level::Private => costs.l2_latency_ns,
            Level::Shared => costs.l3_latency_ns,
            Level::Remote => costs.remote_line_ns,
            Level::Memory => costs.mem_latency_ns,
        };
        let line = sim.machine.cpu(cpu).line_bytes.max(1);
        let entry_bytes = (self.cfg.object_bytes / u64::from(self.cfg.entries)).max(1);
        let lines = (u64::from(scan) * entry_bytes).div_ceil(line);
        let stall = ns_to_ps(lines as f64 * latency / self.cfg.mlp);
        let work = sim.exec(cpu, ns_to_ps(f64::from(scan) * self.cfg.entry_ns));
        let start = now.max(self.free_at[o as usize]);
        let done = start + work + stall;
        self.free_at[o as usize] = done;
        let th = &mut self.threads[t as usize];
        (th.started, th.level) = (start, level);
        sim.schedule_at(done, Event::Done { thread: t });
    }

    fn done(&mut self, t: u32, sim: &mut Sim<Event>) {
        let now = sim.now();
        let th = self.threads[t as usize].clone();
        // As the runtime times it: from taking the lock to the end (lock waits excluded).
        let ran = now - th.started;
        let batched = self.batched();
        let s = &mut self.samples[th.object as usize];
        if th.routed {
            s.owner_ops += 1;
            s.owner_ns += ps_to_ns(ran) as u64;
            if batched {
                s.batch_ops += 1;
                s.batch_hop_ns += ps_to_ns(th.hop_ps) as u64;
            } else {
                s.hop_ns += ps_to_ns(th.hop_ps) as u64;
            }
        } else {
            s.local_ops += 1;
            s.local_ns += ps_to_ns(ran) as u64;
        }
        self.busy[th.cpu] += ran;
        self.period_ops += 1;
        if now >= ns_to_ps(self.cfg.warmup_us * 1e3) {
            if self.counted == 0 {
                self.counted_ps = now;
            }
            self.counted += 1;
            self.levels[th.level as usize] += 1;
            sim.stats.record_op(now - th.issued);
        }
        if th.cpu != th.home {
            let idle = !sim.stats.cores.is_busy(th.home);
            let timing = self.hop(sim, th.cpu, th.home, idle);
            let me = &mut self.threads[t as usize];
            (me.hop, me.returning) = (Some((th.cpu, th.home, timing)), true);
            sim.schedule_in(timing.src, Event::Left { thread: t });
            return;
        }
        // Cooperative: a thread yields its CPU to threads waiting there after each lookup.
        if self.queues.waiting(th.cpu) > 0 {
            if let Some(next) = self.queues.finish(th.cpu, sim) {
                sim.schedule_in(0, Event::Run { thread: next });
            }
            if let Some(me) = self.queues.submit(th.cpu, t, sim) {
                sim.schedule_in(0, Event::Run { thread: me });
            }
        } else {
            sim.schedule_in(0, Event::Run { thread: t });
        }
    }

    fn end_period(&mut self, sim: &mut Sim<Event>) {
        let now = sim.now();
        let elapsed = ps_to_ns(now - self.period_started) as u64;
        self.period_started = now;
        let cores: Vec<CoreSample> = self
            .busy
            .iter_mut()
            .map(|b| CoreSample {
                busy_ns: (ps_to_ns(std::mem::take(b)) as u64).min(elapsed),
                elapsed_ns: elapsed,
            })
            .collect();
        let samples =
            std::mem::replace(&mut self.samples, vec![ObjectSample::default(); self.objects as usize]);
        if let Some(placer) = &mut self.placer {
            self.moves += placer.end_period(&samples, &cores).len() as u64;
        }
        let mut period_ns = self.cfg.period_us * 1e3;
        if let Some(gate) = &mut self.gate {
            gate.epoch_end(std::mem::take(&mut self.period_ops) as f64, elapsed);
            let next = gate.next_epoch();
            self.moving = next.arm != STAY;
            period_ns = next.length(period_ns as u64) as f64;
        }
        self.periods += 1;
        self.periods_following += u64::from(self.moving);
        sim.schedule_in(ns_to_ps(period_ns), Event::Period);
    }
}

impl Model for Objects {
    type Event = Event;

    fn start(&mut self, sim: &mut Sim<Event>) {
        for t in 0..self.threads.len() as u32 {
            let cpu = self.threads[t as usize].cpu;
            if let Some(t) = self.queues.submit(cpu, t, sim) {
                sim.schedule_in(0, Event::Run { thread: t });
            }
        }
        if self.placer.is_some() {
            sim.schedule_in(ns_to_ps(self.cfg.period_us * 1e3), Event::Period);
        }
    }

    fn on_event(&mut self, event: Event, sim: &mut Sim<Event>) {
        match event {
            Event::Run { thread } => match self.threads[thread as usize].hop.take() {
                // Granted the CPU it hopped to: the target half of the hop, then the lookup.
                Some((from, to, timing)) => {
                    let now = sim.now();
                    let th = &mut self.threads[thread as usize];
                    if th.returning {
                        // Home again, ready for the next lookup.
                        th.returning = false;
                        sim.stats.record_hop(from, to, timing.total());
                        sim.schedule_in(timing.dst, Event::Run { thread });
                    } else {
                        if now >= ns_to_ps(self.cfg.warmup_us * 1e3) {
                            self.counted_hops += 1;
                        }
                        // The placer weighs the CPU time of the move there and back (waiting in
                        // the target's queue is not lost work: the CPUs run others meanwhile).
                        th.hop_ps = 2 * (timing.src + timing.dst);
                        sim.stats.record_hop(from, to, now + timing.dst - th.issued);
                        sim.schedule_in(timing.dst, Event::Arrive { thread });
                    }
                }
                None => self.next(thread, sim),
            },
            Event::Left { thread } => {
                let th = &mut self.threads[thread as usize];
                let (from, to, timing) = th.hop.expect("a hop is in flight");
                th.cpu = to;
                if let Some(next) = self.queues.finish(from, sim) {
                    sim.schedule_in(0, Event::Run { thread: next });
                }
                sim.schedule_in(timing.transit, Event::Queue { thread });
            }
            Event::Queue { thread } => {
                let cpu = self.threads[thread as usize].cpu;
                if let Some(t) = self.queues.submit(cpu, thread, sim) {
                    sim.schedule_in(0, Event::Run { thread: t });
                }
            }
            Event::Arrive { thread } => self.lookup(thread, sim),
            Event::Done { thread } => self.done(thread, sim),
            Event::Period => self.end_period(sim),
        }
    }

    fn report(&self, sim: &Sim<Event>) -> ModelReport {
        let window = sim.now().saturating_sub(self.counted_ps);
        let per_s = if window == 0 { 0.0 } else { self.counted as f64 / (window as f64 * 1e-12) };
        let all: u64 = self.levels.iter().sum::<u64>().max(1);
        let share = |l: Level| self.levels[l as usize] as f64 / all as f64;
        let placed =
            self.placer.as_ref().map_or(0, |p| p.placements().iter().filter(|x| x.is_scheduled()).count());
        ModelReport {
            op_name: "directory lookup".into(),
            metrics: vec![
                Metric::new("lookups_per_s", per_s, "lookups/s"),
                Metric::new("directories", f64::from(self.objects), "directories"),
                Metric::new("private_hits", share(Level::Private), "fraction"),
                Metric::new("shared_hits", share(Level::Shared), "fraction"),
                Metric::new("remote_hits", share(Level::Remote), "fraction"),
                Metric::new("memory_loads", share(Level::Memory), "fraction"),
                Metric::new("hops_per_lookup", self.counted_hops as f64 / self.counted.max(1) as f64, "hops"),
                Metric::new("scheduled_directories", placed as f64, "directories"),
                Metric::new("placement_moves", self.moves as f64, "moves"),
                Metric::new(
                    "periods_following_routes",
                    self.periods_following as f64 / self.periods.max(1) as f64,
                    "fraction",
                ),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::simulate;
    use crate::scenario::ScenarioDoc;
    use crate::stats::Report;

    fn scenario(preset: &str, horizon_us: f64, workload: &str) -> Scenario {
        let text = format!(
            "[run]\nhorizon_us = {horizon_us}\n[machine]\npreset = \"{preset}\"\n[workload]\nkind = \"objects\"\n{workload}"
        );
        ScenarioDoc::parse("t.toml", &text).unwrap().validate().unwrap()
    }

    fn run(preset: &str, horizon_us: f64, workload: &str) -> Report {
        let s = scenario(preset, horizon_us, workload);
        let mut m = Objects::from_scenario(&s).unwrap();
        simulate(&s, &mut m, false, &mut |_| {}).0
    }

    fn metric(r: &Report, name: &str) -> f64 {
        r.model.metrics.iter().find(|m| m.name == name).unwrap_or_else(|| panic!("no metric {name}")).value
    }

    #[test]
    fn one_contended_directory_by_hand() {
        // offload-2core (no warm-up): private 1 MiB L2 per CPU, no L3; memory 90 ns, cache-to-cache 25 ns,
        // L2 10 ns. One 64-byte directory with one entry, one thread per CPU, 10 ns per entry.
        // cpu0: memory, 90 + 10 → done at 100. cpu1: remote, 25 + 10, waits for the lock → 135.
        // Then private hits of 20 ns, alternating under the lock: 155, 175, ... 995.
        let r = run(
            "offload-2core",
            1.0,
            "scheduler = \"threads\"\ntotal_kib = 0.0625\nobject_bytes = 64\nentries = 1\n\
             threads_per_cpu = 1\nentry_ns = 10\nmlp = 1\nwarmup_us = 0",
        );
        assert_eq!(r.ops, 45);
        assert_eq!(metric(&r, "directories"), 1.0);
        assert_eq!(metric(&r, "memory_loads"), 1.0 / 45.0);
        assert_eq!(metric(&r, "remote_hits"), 1.0 / 45.0);
        assert_eq!(metric(&r, "private_hits"), 43.0 / 45.0);
        assert_eq!(r.hops, 0);
    }

    #[test]
    fn sharding_hops_to_the_home_cpu() {
        let r = run(
            "offload-2core",
            200.0,
            "scheduler = \"sharded\"\ntotal_kib = 64\nobject_bytes = 4096\nentries = 64\nwarmup_us = 0",
        );
        assert!(r.hops > 0);
        // Half the lookups are for the other CPU's directories: about one hop per two lookups.
        let per = metric(&r, "hops_per_lookup");
        assert!((0.35..0.65).contains(&per), "{per}");
    }

    #[test]
    fn o2_beats_threads_when_data_outgrows_one_cache_on_the_paper_machine() {
        // 8 MB of directories on the 16-core Opteron: 4× one chip's L3, half of all caches.
        let w = |s: &str| {
            format!(
                "scheduler = \"{s}\"\ntotal_kib = 8192\nwarmup_us = 10000\nperiod_us = 1000\ngate = false"
            )
        };
        let threads = run("o2-16core", 30_000.0, &w("threads"));
        let o2 = run("o2-16core", 30_000.0, &w("o2"));
        let (t, o) = (metric(&threads, "lookups_per_s"), metric(&o2, "lookups_per_s"));
        assert!(o > 1.5 * t, "o2 {o:.0}/s vs threads {t:.0}/s");
        assert!(metric(&o2, "scheduled_directories") > 100.0);
        assert!(metric(&o2, "memory_loads") < metric(&threads, "memory_loads"));
    }

    /// Lookups per second of `scheduler` over `kib` of directories on the paper's machine,
    /// measured after the gate has had time to choose (0.6 s of 10 ms periods), and the share
    /// of periods that followed the placer's routes.
    fn after_the_gate(scheduler: &str, kib: u32, gate: bool) -> (f64, f64) {
        let w = format!("scheduler = \"{scheduler}\"\ntotal_kib = {kib}\nwarmup_us = 600000\ngate = {gate}");
        let r = run("o2-16core", 800_000.0, &w);
        (metric(&r, "lookups_per_s"), metric(&r, "periods_following_routes"))
    }

    #[test]
    fn the_gate_finds_the_routes_that_pay() {
        // 8 MB: half of all caches, where O²'s placement pays about 3× on this machine.
        let (threads, _) = after_the_gate("threads", 8192, true);
        let (o2, following) = after_the_gate("o2", 8192, true);
        assert!(o2 > 2.0 * threads, "o2 {o2:.0}/s vs threads {threads:.0}/s");
        assert!(following > 0.3, "{following}");
    }

    #[test]
    fn the_gate_falls_back_to_staying_where_the_routes_lose() {
        // 32 MB: twice all caches. Packing half the directories into the caches and hopping to
        // them loses to plain threads; the gate keeps every lookup where its thread is.
        let (threads, _) = after_the_gate("threads", 32768, true);
        let (ungated, always) = after_the_gate("o2", 32768, false);
        let (gated, following) = after_the_gate("o2", 32768, true);
        assert_eq!(always, 1.0);
        assert!(ungated < 0.97 * threads, "without the gate o2 {ungated:.0}/s vs threads {threads:.0}/s");
        assert!(gated > 0.98 * threads, "o2 {gated:.0}/s vs threads {threads:.0}/s");
        assert!(following < 0.25, "{following}");
    }

    #[test]
    fn small_data_stays_local_under_o2() {
        // 384 KB fits in every private cache: nothing is worth a hop.
        let w = |s: &str| {
            format!("scheduler = \"{s}\"\ntotal_kib = 384\nwarmup_us = 10000\nperiod_us = 1000\ngate = false")
        };
        let threads = run("o2-16core", 30_000.0, &w("threads"));
        let o2 = run("o2-16core", 30_000.0, &w("o2"));
        assert!(metric(&o2, "hops_per_lookup") < 0.05, "{}", metric(&o2, "hops_per_lookup"));
        let (t, o) = (metric(&threads, "lookups_per_s"), metric(&o2, "lookups_per_s"));
        assert!(o > 0.9 * t, "o2 {o:.0}/s vs threads {t:.0}/s");
    }

    #[test]
    fn same_seed_same_report_other_seed_differs() {
        let w = "scheduler = \"o2\"\ntotal_kib = 2048\npopularity = \"oscillating\"\noscillate_us = 500\nwarmup_us = 500\nperiod_us = 100";
        let a = run("hybrid-laptop", 2000.0, w);
        let b = run("hybrid-laptop", 2000.0, w);
        assert_eq!(a, b);
        let text = format!("seed = 9\n[run]\nhorizon_us = 2000\n[machine]\npreset = \"hybrid-laptop\"\n[workload]\nkind = \"objects\"\n{w}");
        let s = ScenarioDoc::parse("t.toml", &text).unwrap().validate().unwrap();
        let c = simulate(&s, &mut Objects::from_scenario(&s).unwrap(), false, &mut |_| {}).0;
        assert_ne!(a.ops, c.ops);
    }

    #[test]
    fn bad_workloads_name_the_key() {
        let err = |w: &str| {
            let s = scenario("o2-16core", 10.0, w);
            Objects::from_scenario(&s).err().expect("an error")
        };
        let e = err("scheduler = \"o2\"\ntotal_kib = -5");
        assert_eq!((e.key.as_str(), &e.problem), ("workload.total_kib", &Problem::Negative("-5".into())));
        let e = err("scheduler = \"o2\"\ntotal_kib = 64\nmlp = 0");
        assert_eq!(e.key, "workload.mlp");
        let e = err("scheduler = \"fifo\"\ntotal_kib = 64");
        assert_eq!(e.key, "workload.scheduler");
        let e = err("scheduler = \"o2\"\ntotal_kib = 64\ndirs = 3");
        assert!(matches!(e.problem, Problem::UnknownKey(_)), "{e}");
        let e = err("scheduler = \"o2\"\ntotal_kib = 64\nplacer = { fill = 2.0 }");
        assert_eq!(e.key, "workload.placer");
    }
}
