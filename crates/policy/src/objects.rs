//! O² object placement: which core's cache holds each expensive object.
//!
//! The O² paper (CoreTime) runs each operation on the core whose cache holds its object. This
//! module makes every decision of that scheme, as pure code the runtime and the simulator share:
//!
//! - **Budgets** ([`Budgets::from_machine`]): each core has a *private* budget (its own caches,
//!   L2 and below, split among SMT siblings) and each shared-cache *domain* (the CPUs under one
//!   last-level cache) a *shared* budget. Only a fraction ([`PlacerConfig::fill`]) is planned, so
//!   stacks, code and the unscheduled objects keep some room.
//! - **Monitoring → expense.** The driver times every operation and reports, per object and per
//!   period, an [`ObjectSample`]: operations run locally (unscheduled), run on the owner, the
//!   time each took and the hop time to reach the owner. There are no cache-miss counters on the
//!   machines we target, so an object is judged by an A/B trial: an object whose local operations
//!   cost more than a hop is placed on trial; when its operations on the owner plus the hop cost
//!   clearly less than the same operations run locally on (cold) data, it stays scheduled,
//!   otherwise it goes back to local execution and is retried much later.
//! - **Cache packing** ([`pack`]): greedy first fit of expensive objects, hottest first, into the
//!   private budgets of the fastest cores first and then into the shared domain budgets, with a
//!   per-core load cap proportional to core speed so one core never gets all the hot objects.
//!   Sorting dominates: O(n log n) for n objects (times the core count, a small constant).
//! - **Rebalancing** ([`Placer::end_period`]): a core that is saturated, or whose objects now
//!   cost clearly more than they used to (they miss in its cache), while another core idles, sheds
//!   objects to the idle core, preferring one in the same shared-cache domain. Hysteresis keeps
//!   oscillating popularity from thrashing: heat is a moving average, an imbalance must persist
//!   for [`PlacerConfig::patience`] periods, and a moved object stays put for
//!   [`PlacerConfig::min_residency`] periods.
//! - **Beyond the paper**: read-mostly objects declared replicable whose load alone would
//!   saturate a core are replicated (every core runs their reads locally, each charged the bytes);
//!   objects declared as a group (used together) are packed as one unit; on heterogeneous
//!   machines the hottest objects go to the fastest cores.
//!
//! Invariants (property-tested below): no budget is ever over-filled, and every registered object
//! has exactly one [`Placement`] whose core exists.
use corehop_topology::{CacheKind, CpuId, Machine};
use serde::{Deserialize, Serialize};

/// Dense index of an object in one [`Placer`], in registration order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ObjectId(pub usize);

/// Where an object's operations run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Not scheduled: every operation runs on the caller's core (the hardware caches it).
    Local,
    /// Packed into this core's private cache: every operation runs on `owner`.
    Core {
        /// The core.
        owner: CpuId,
    },
    /// Packed into the shared cache of `domain`: callers inside the domain run operations where
    /// they are, callers outside hop to `home` (a core of the domain).
    Domain {
        /// The domain (an index into the budgets).
        domain: usize,
        /// The core of the domain that callers from outside hop to.
        home: CpuId,
    },
    /// Read-mostly and too hot for one core: every core runs reads locally on its own copy.
    Replicated,
}

impl Placement {
    /// The core an operation issued on `caller` runs on, given the caller's domain, with
    /// [`PlacerConfig::domain_ops_at_home`] off.
    pub fn target(&self, caller: CpuId, caller_domain: usize) -> CpuId {
        self.target_in(caller, caller_domain, false)
    }

    /// The core an operation issued on `caller` runs on; `at_home` sends operations on
    /// domain-placed objects to their home even from inside the domain.
    pub fn target_in(&self, caller: CpuId, caller_domain: usize, at_home: bool) -> CpuId {
        match *self {
            Placement::Local | Placement::Replicated => caller,
            Placement::Core { owner } => owner,
            Placement::Domain { domain, .. } if domain == caller_domain && !at_home => caller,
            Placement::Domain { home, .. } => home,
        }
    }

    /// Whether operations are routed to a specific core (the object is scheduled, not local).
    pub fn is_scheduled(&self) -> bool {
        matches!(self, Placement::Core { .. } | Placement::Domain { .. })
    }
}

/// Errors building a placer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PlacementError {
    /// The placer was given no core.
    #[error("no cores to place objects on")]
    NoCores,
    /// A CPU the machine does not have.
    #[error("{cpu} is not a CPU of machine {machine:?}")]
    UnknownCpu {
        /// The CPU.
        cpu: CpuId,
        /// The machine's name.
        machine: String,
    },
    /// A CPU without data caches in the description: no budget can be sized.
    #[error("machine {machine:?} lists no data caches for {cpu}: cannot size its cache budget")]
    NoCacheInfo {
        /// The CPU.
        cpu: CpuId,
        /// The machine's name.
        machine: String,
    },
    /// An object that fits in no free budget of its core.
    #[error("object {object:?} ({bytes} bytes) does not fit in the free cache budget of {cpu}")]
    NoRoom {
        /// The object.
        object: ObjectId,
        /// Its size.
        bytes: u64,
        /// The core.
        cpu: CpuId,
    },
    /// An object id the placer never registered.
    #[error("unknown object {0:?}")]
    UnknownObject(ObjectId),
    /// A placer setting out of its range.
    #[error("invalid placer setting {name} = {value}: {why}")]
    BadConfig {
        /// The setting.
        name: &'static str,
        /// Its value.
        value: f64,
        /// What it must be.
        why: &'static str,
    },
}

/// One core's share of the caches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoreBudget {
    /// The core.
    pub cpu: CpuId,
    /// Bytes of this core's private caches the packer may fill.
    pub private_bytes: u64,
    /// Index into [`Budgets::domains`].
    pub domain: usize,
    /// Relative speed (1.0 = fastest), from the topology's effective speed.
    pub speed: f64,
}

/// A group of cores under one shared last-level cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DomainBudget {
    /// Bytes of the shared cache the packer may fill.
    pub shared_bytes: u64,
    /// The cores that share the cache.
    pub cpus: Vec<CpuId>,
}

/// The cache budgets of the cores objects may be placed on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Budgets {
    /// Per core: its private budget.
    pub cores: Vec<CoreBudget>,
    /// Per shared-cache domain: its shared budget.
    pub domains: Vec<DomainBudget>,
}

impl Budgets {
    /// Budgets for `cpus` of `machine`, planning `fill` (0, 1] of each cache.
    ///
    /// A cache is private to a core when every CPU sharing it is an SMT sibling of that core; its
    /// size is split among the siblings in `cpus`. The largest cache shared beyond one core is
    /// the CPU's domain; CPUs with no such cache form a domain of their own with no shared bytes.
    /// Level-1 caches are left out: they sit inside L2 on the machines we model and are too small
    /// to pack.
    pub fn from_machine(machine: &Machine, cpus: &[CpuId], fill: f64) -> Result<Budgets, PlacementError> {
        check_fraction("fill", fill)?;
        if cpus.is_empty() {
            return Err(PlacementError::NoCores);
        }
        let mut cores = Vec::with_capacity(cpus.len());
        let mut domains: Vec<DomainBudget> = Vec::new();
        let mut domain_keys: Vec<Vec<CpuId>> = Vec::new();
        for &cpu in cpus {
            let unknown = || PlacementError::UnknownCpu { cpu, machine: machine.name.clone() };
            let info = machine.cpu(cpu).ok_or_else(unknown)?;
            let siblings = machine.smt_siblings(cpu);
            let data = machine.caches_of(cpu).filter(|c| c.kind != CacheKind::Instruction);
            let (mut private, mut shared): (u64, Option<&corehop_topology::Cache>) = (0, None);
            let mut any_cache = false;
            for cache in data {
                any_cache = true;
                if cache.level < 2 {
                    continue;
                }
                if cache.cpus.iter().all(|c| siblings.contains(c)) {
                    let sharers = cache.cpus.iter().filter(|c| cpus.contains(c)).count().max(1);
                    private += cache.size_bytes / sharers as u64;
                } else if shared.is_none_or(|s| cache.level > s.level) {
                    shared = Some(cache);
                }
            }
            if !any_cache {
                return Err(PlacementError::NoCacheInfo { cpu, machine: machine.name.clone() });
            }
            let (key, shared_bytes) = match shared {
                Some(cache) => (cache.cpus.clone(), cache.size_bytes),
                None => (vec![cpu], 0),
            };
            let domain = match domain_keys.iter().position(|k| *k == key) {
                Some(d) => d,
                None => {
                    domain_keys.push(key);
                    domains.push(DomainBudget { shared_bytes: scale(shared_bytes, fill), cpus: Vec::new() });
                    domains.len() - 1
                }
            };
            domains[domain].cpus.push(cpu);
            cores.push(CoreBudget {
                cpu,
                private_bytes: scale(private, fill),
                domain,
                speed: info.effective_speed(),
            });
        }
        Ok(Budgets { cores, domains })
    }

    /// Total bytes the packer may fill (all private plus all shared budgets).
    pub fn total_bytes(&self) -> u64 {
        self.cores.iter().map(|c| c.private_bytes).sum::<u64>()
            + self.domains.iter().map(|d| d.shared_bytes).sum::<u64>()
    }

    /// The domain of `cpu`, if it is one of these cores.
    pub fn domain_of(&self, cpu: CpuId) -> Option<usize> {
        self.cores.iter().find(|c| c.cpu == cpu).map(|c| c.domain)
    }

    fn validate(&self) -> Result<(), PlacementError> {
        if self.cores.is_empty() {
            return Err(PlacementError::NoCores);
        }
        for core in &self.cores {
            if core.domain >= self.domains.len() {
                return Err(PlacementError::BadConfig {
                    name: "domain",
                    value: core.domain as f64,
                    why: "a core names a domain that is not listed",
                });
            }
            if !(core.speed > 0.0 && core.speed.is_finite()) {
                return Err(PlacementError::BadConfig {
                    name: "speed",
                    value: core.speed,
                    why: "must be > 0",
                });
            }
        }
        Ok(())
    }
}

fn scale(bytes: u64, fraction: f64) -> u64 {
    (bytes as f64 * fraction) as u64
}

fn check_fraction(name: &'static str, value: f64) -> Result<(), PlacementError> {
    if value > 0.0 && value <= 1.0 {
        Ok(())
    } else {
        Err(PlacementError::BadConfig { name, value, why: "must be in (0, 1]" })
    }
}

/// The knobs of the placer, with the defaults the runtime and simulator use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlacerConfig {
    /// Fraction of each cache budget to plan (the rest is for stacks, code, unscheduled data).
    pub fill: f64,
    /// A core may carry this fraction more than its speed-weighted fair share of load.
    pub load_slack: f64,
    /// Scheduled operations (owner time + hop) must be at most this fraction of the local cost
    /// for a trial to succeed.
    pub keep_ratio: f64,
    /// Operations sampled locally and on the owner before an object is judged.
    pub min_samples: u64,
    /// Active periods an object is watched locally before it can be tried, and on its owner
    /// before its trial is judged; the first half of each is not measured (caches are still
    /// warming up, which says nothing about the steady state).
    pub watch_periods: u64,
    /// Periods a demoted (cheap) object waits before it is tried again.
    pub retry_periods: u64,
    /// Objects tried while no trial has shown what a move saves, and again every
    /// `retry_periods` while none is predicted to pay: the others are tried only once the
    /// saving predicted from the trials judged so far exceeds the measured cost of a move.
    pub probe_objects: usize,
    /// Weight of the newest period in the moving averages (heat, costs).
    pub alpha: f64,
    /// Busy fraction above which a core counts as saturated.
    pub saturated_busy: f64,
    /// Busy fraction below which a core counts as idle (able to take load).
    pub idle_busy: f64,
    /// Owner cost over its best past cost above which a core's objects count as missing.
    pub miss_ratio: f64,
    /// Periods an imbalance must persist before objects move.
    pub patience: u32,
    /// Periods an object stays on a core after it moved there.
    pub min_residency: u64,
    /// A replicable object is replicated when its load alone exceeds this share of one core.
    pub replicate_load_share: f64,
    /// Write fraction above which a replicated object goes back to a single owner.
    pub replicate_max_writes: f64,
    /// Periods without any operation after which a scheduled object frees its budget.
    pub cold_periods: u64,
    /// What a hop costs (ns) before any has been measured; objects cheaper than a hop are never
    /// tried. Drivers that measured their hop cost pass it here.
    pub hop_ns_hint: f64,
    /// Run every operation on a domain-placed object at its home core, even from the same
    /// domain. Right for exclusive (victim) shared caches, as on the O² paper's Opterons, where
    /// a line read by another core leaves the shared cache; off for inclusive shared caches,
    /// where any core of the domain reads it there without a hop.
    pub domain_ops_at_home: bool,
}

impl Default for PlacerConfig {
    fn default() -> Self {
        PlacerConfig {
            fill: 0.75,
            load_slack: 0.2,
            keep_ratio: 0.9,
            min_samples: 8,
            watch_periods: 4,
            retry_periods: 50,
            probe_objects: 2,
            alpha: 0.3,
            saturated_busy: 0.9,
            idle_busy: 0.6,
            miss_ratio: 1.5,
            patience: 2,
            min_residency: 4,
            replicate_load_share: 0.5,
            replicate_max_writes: 0.05,
            cold_periods: 100,
            hop_ns_hint: 500.0,
            domain_ops_at_home: false,
        }
    }
}

impl PlacerConfig {
    /// Checks every knob; the error names the first bad one.
    pub fn validate(&self) -> Result<(), PlacementError> {
        check_fraction("fill", self.fill)?;
        check_fraction("keep_ratio", self.keep_ratio)?;
        check_fraction("alpha", self.alpha)?;
        check_fraction("saturated_busy", self.saturated_busy)?;
        check_fraction("idle_busy", self.idle_busy)?;
        check_fraction("replicate_load_share", self.replicate_load_share)?;
        check_fraction("replicate_max_writes", self.replicate_max_writes)?;
        if !(self.load_slack >= 0.0 && self.load_slack.is_finite()) {
            return Err(PlacementError::BadConfig {
                name: "load_slack",
                value: self.load_slack,
                why: "must be >= 0",
            });
        }
        if !(self.miss_ratio > 1.0 && self.miss_ratio.is_finite()) {
            return Err(PlacementError::BadConfig {
                name: "miss_ratio",
                value: self.miss_ratio,
                why: "must be > 1",
            });
        }
        if !(self.hop_ns_hint >= 0.0 && self.hop_ns_hint.is_finite()) {
            return Err(PlacementError::BadConfig {
                name: "hop_ns_hint",
                value: self.hop_ns_hint,
                why: "must be >= 0",
            });
        }
        if self.idle_busy >= self.saturated_busy {
            return Err(PlacementError::BadConfig {
                name: "idle_busy",
                value: self.idle_busy,
                why: "must be below saturated_busy",
            });
        }
        Ok(())
    }
}

/// What the driver declares about an object when registering it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ObjectHints {
    /// Bytes its operations touch (its size).
    pub bytes: u64,
    /// Objects with the same group id are used together and packed on one core when they fit.
    pub group: Option<u64>,
    /// Reads may run concurrently on copies (the driver guarantees this is safe).
    pub replicable: bool,
}

/// One object's operations during one period, as the driver measured them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ObjectSample {
    /// Operations run on the caller's core (object local, or caller in the object's domain).
    pub local_ops: u64,
    /// Their summed run time, in ns.
    pub local_ns: u64,
    /// Operations run on the owner after a hop there.
    pub owner_ops: u64,
    /// Their summed run time on the owner, in ns (the hop excluded).
    pub owner_ns: u64,
    /// CPU time spent moving operations to the owner and back one at a time (summed over the
    /// `owner_ops` that did not come in a batch); time spent waiting in the owner's queue is
    /// not counted (the CPUs run other work meanwhile).
    pub hop_ns: u64,
    /// Of `owner_ops`, those that travelled in a batch with others for the same owner.
    pub batch_ops: u64,
    /// Their share of their batches' CPU time beyond the operations themselves, summed.
    pub batch_hop_ns: u64,
    /// Operations that wrote the object.
    pub writes: u64,
}

impl ObjectSample {
    /// All operations, wherever they ran.
    pub fn ops(&self) -> u64 {
        self.local_ops + self.owner_ops
    }
}

/// One core during one period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CoreSample {
    /// Time the core spent running operations, in ns.
    pub busy_ns: u64,
    /// Length of the period, in ns.
    pub elapsed_ns: u64,
}

/// Why an object moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveReason {
    /// Looks expensive to fetch: packed to measure it on an owner.
    Trial,
    /// Its trial showed no gain: back to local execution.
    Cheap,
    /// No operations for a while: budget freed.
    Cold,
    /// Its core was saturated while another idled.
    Saturated,
    /// Its core's objects missed while another core idled.
    Missing,
    /// Too hot for one core and read-mostly.
    Replicate,
    /// Written too often to keep copies.
    Unreplicate,
}

/// Which operations on a scheduled object follow its route to the owner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// Every operation: the saving pays for a move of its own.
    #[default]
    Any,
    /// Only operations that travel in a batch: the saving pays for a batch's share of a move
    /// and not for a move of its own, so an operation issued alone runs where it is called.
    Batches,
}

/// A placement change the driver must apply.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Move {
    /// The object.
    pub object: ObjectId,
    /// Where it was.
    pub from: Placement,
    /// Where it goes.
    pub to: Placement,
    /// Which operations go there.
    pub via: Via,
    /// Why.
    pub reason: MoveReason,
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// An exponentially weighted moving average that starts at its first sample.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Ewma(Option<f64>);

impl Ewma {
    fn add(&mut self, x: f64, alpha: f64) {
        self.0 = Some(match self.0 {
            Some(v) => v + alpha * (x - v),
            None => x,
        });
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Gathering local samples.
    Watching,
    /// Placed to be measured on its owner.
    OnTrial,
    /// Proved worth scheduling.
    Scheduled,
    /// Proved not worth it; retried at the given period.
    Cheap { retry_at: u64 },
}

#[derive(Debug, Clone)]
struct ObjectState {
    hints: ObjectHints,
    placement: Placement,
    phase: Phase,
    /// Operations per period.
    heat: Ewma,
    local_ns: Ewma,
    owner_ns: Ewma,
    /// Its cost per operation on the owner when its trial succeeded: what the owner's cache
    /// gave then, to notice when it starts missing.
    accepted_owner_ns: Option<f64>,
    /// Per operation moved on its own, and per operation moved in a batch.
    hop_ns: Ewma,
    batch_hop_ns: Ewma,
    via: Via,
    write_share: Ewma,
    /// Periods with operations in the current phase (watching or on trial).
    phase_periods: u64,
    /// The last period's sample.
    recent: ObjectSample,
    /// Cost (ns, ops) summed over the phase, first period excepted: local operations while
    /// watching, operations on the owner (moves excluded) while on trial.
    watched_local: (f64, u64),
    trial_owner: (f64, u64),
    /// The cost per byte of the operations on unscheduled objects in the same periods,
    /// weighted by this object's operations, while it was watched and while on trial: the
    /// host's drift between the two (another tenant, a frequency change) is not a saving.
    watch_control: (f64, u64),
    trial_control: (f64, u64),
    idle_periods: u64,
    moved_at: Option<u64>,
    /// Placed by the driver ([`Placer::pin`]): never moved by the placer.
    pinned: bool,
}

impl ObjectState {
    fn enter(&mut self, phase: Phase) {
        self.phase = phase;
        self.phase_periods = 0;
        match phase {
            Phase::Watching => (self.watched_local, self.watch_control) = ((0.0, 0), (0.0, 0)),
            Phase::OnTrial => (self.trial_owner, self.trial_control) = ((0.0, 0), (0.0, 0)),
            Phase::Scheduled | Phase::Cheap { .. } => {}
        }
    }

    /// Estimated work per period on its owner, in ns (what it adds to a core's load).
    fn load(&self) -> f64 {
        let cost = self.owner_ns.0.or(self.local_ns.0).unwrap_or(0.0);
        self.heat.0.unwrap_or(0.0) * cost
    }

    /// Work it brought in the last period alone, in ns.
    fn recent_load(&self) -> f64 {
        let cost = self.owner_ns.0.or(self.local_ns.0).unwrap_or(0.0);
        self.recent.ops() as f64 * cost
    }

    fn watched_local_ns(&self) -> Option<f64> {
        (self.watched_local.1 > 0).then(|| self.watched_local.0 / self.watched_local.1 as f64)
    }

    /// What its operations would cost where they are called now, on trial: the cost watched,
    /// scaled by how the unscheduled objects' cost changed since (when both were measured).
    fn local_now_ns(&self, min_ops: u64) -> Option<f64> {
        let watched = self.watched_local_ns()?;
        let ((w, wn), (t, tn)) = (self.watch_control, self.trial_control);
        if wn >= min_ops && tn >= min_ops && w > 0.0 {
            Some(watched * (t / tn as f64) / (w / wn as f64))
        } else {
            Some(watched)
        }
    }
}

/// An item for [`pack`]: one object or one group of objects used together.
#[derive(Debug, Clone, PartialEq)]
pub struct PackItem {
    /// Bytes it occupies in a cache.
    pub bytes: u64,
    /// Work it brings per period (any unit, the same for all items).
    pub load: f64,
}

/// Free room while packing: bytes per core and per domain, and load per core.
#[derive(Debug, Clone)]
struct Room {
    core_free: Vec<u64>,
    domain_free: Vec<u64>,
    core_load: Vec<f64>,
    load_cap: Vec<f64>,
}

impl Room {
    fn new(budgets: &Budgets, total_load: f64, slack: f64) -> Room {
        let speed_sum: f64 = budgets.cores.iter().map(|c| c.speed).sum();
        Room {
            core_free: budgets.cores.iter().map(|c| c.private_bytes).collect(),
            domain_free: budgets.domains.iter().map(|d| d.shared_bytes).collect(),
            core_load: vec![0.0; budgets.cores.len()],
            load_cap: budgets
                .cores
                .iter()
                .map(|c| total_load * c.speed / speed_sum * (1.0 + slack))
                .collect(),
        }
    }

    fn take(&mut self, at: Slot, bytes: u64, load: f64) {
        match at {
            Slot::Core(i) => self.core_free[i] -= bytes,
            Slot::Domain(d, _) => self.domain_free[d] -= bytes,
        }
        self.core_load[at.core()] += load;
    }

    fn give(&mut self, at: Slot, bytes: u64, load: f64) {
        match at {
            Slot::Core(i) => self.core_free[i] += bytes,
            Slot::Domain(d, _) => self.domain_free[d] += bytes,
        }
        self.core_load[at.core()] -= load;
    }

    /// First fit: the first core (fastest first) with private room and load room; else the
    /// domain with room whose least-loaded core is least loaded, if that core has load room;
    /// else the least-loaded core with private room, then that domain. `None` when nothing has
    /// the bytes.
    fn first_fit(&self, order: &[usize], budgets: &Budgets, bytes: u64, load: f64) -> Option<Slot> {
        let fits_load = |i: usize| self.core_load[i] + load <= self.load_cap[i] || self.core_load[i] == 0.0;
        if let Some(&i) = order.iter().find(|&&i| self.core_free[i] >= bytes && fits_load(i)) {
            return Some(Slot::Core(i));
        }
        let ratio = |i: usize| self.core_load[i] / self.load_cap[i].max(1e-9);
        // Spread over the domains: the one whose least-loaded core is least loaded.
        let best_domain = (0..self.domain_free.len())
            .filter(|&d| self.domain_free[d] >= bytes)
            .filter_map(|d| {
                let home = order
                    .iter()
                    .copied()
                    .filter(|&i| budgets.cores[i].domain == d)
                    .min_by(|&a, &b| ratio(a).total_cmp(&ratio(b)))?;
                Some((d, home))
            })
            .min_by(|a, b| ratio(a.1).total_cmp(&ratio(b.1)).then(a.0.cmp(&b.0)));
        let mut fallback = None;
        if let Some((d, home)) = best_domain {
            if fits_load(home) {
                return Some(Slot::Domain(d, home));
            }
            fallback = Some(Slot::Domain(d, home));
        }
        let least_loaded_core = order
            .iter()
            .copied()
            .filter(|&i| self.core_free[i] >= bytes)
            .min_by(|&a, &b| self.core_load[a].total_cmp(&self.core_load[b]));
        least_loaded_core.map(Slot::Core).or(fallback)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Slot {
    /// Private cache of core index i.
    Core(usize),
    /// Shared cache of domain d, homed at core index i.
    Domain(usize, usize),
}

impl Slot {
    fn core(self) -> usize {
        match self {
            Slot::Core(i) | Slot::Domain(_, i) => i,
        }
    }

    fn placement(self, budgets: &Budgets) -> Placement {
        match self {
            Slot::Core(i) => Placement::Core { owner: budgets.cores[i].cpu },
            Slot::Domain(d, i) => Placement::Domain { domain: d, home: budgets.cores[i].cpu },
        }
    }

    fn of(placement: Placement, budgets: &Budgets) -> Option<Slot> {
        let index = |cpu: CpuId| budgets.cores.iter().position(|c| c.cpu == cpu);
        match placement {
            Placement::Core { owner } => index(owner).map(Slot::Core),
            Placement::Domain { domain, home } => index(home).map(|i| Slot::Domain(domain, i)),
            Placement::Local | Placement::Replicated => None,
        }
    }
}

/// Cores in first-fit order: fastest first, then by id (so the hottest objects land on the
/// fastest cores).
fn core_order(budgets: &Budgets) -> Vec<usize> {
    let mut order: Vec<usize> = (0..budgets.cores.len()).collect();
    order.sort_by(|&a, &b| budgets.cores[b].speed.total_cmp(&budgets.cores[a].speed).then(a.cmp(&b)));
    order
}

/// Greedy first-fit cache packing, hottest item first: one [`Placement`] per item
/// ([`Placement::Local`] for items that fit nowhere). Never over-fills a budget.
pub fn pack(items: &[PackItem], budgets: &Budgets, load_slack: f64) -> Vec<Placement> {
    let total_load: f64 = items.iter().map(|i| i.load.max(0.0)).sum();
    let mut room = Room::new(budgets, total_load, load_slack);
    let order = core_order(budgets);
    let mut by_heat: Vec<usize> = (0..items.len()).collect();
    by_heat.sort_by(|&a, &b| items[b].load.total_cmp(&items[a].load).then(a.cmp(&b)));
    let mut out = vec![Placement::Local; items.len()];
    for i in by_heat {
        let (bytes, load) = (items[i].bytes, items[i].load.max(0.0));
        if let Some(slot) = room.first_fit(&order, budgets, bytes, load) {
            room.take(slot, bytes, load);
            out[i] = slot.placement(budgets);
        }
    }
    out
}

/// The O² placer: keeps every object's placement and changes it once per period.
#[derive(Debug, Clone)]
pub struct Placer {
    config: PlacerConfig,
    budgets: Budgets,
    objects: Vec<ObjectState>,
    period: u64,
    /// Consecutive periods each core has been overloaded (saturated or missing).
    overloaded_for: Vec<u32>,
    /// Cost per byte of an operation on an owner, from the trials judged so far: predicts
    /// what scheduling an object not yet tried would save.
    owner_ns_per_byte: Ewma,
    /// The period from which probe trials may start again.
    next_probe_at: u64,
}

impl Placer {
    /// A placer over `budgets`.
    pub fn new(budgets: Budgets, config: PlacerConfig) -> Result<Placer, PlacementError> {
        config.validate()?;
        budgets.validate()?;
        let n = budgets.cores.len();
        Ok(Placer {
            config,
            budgets,
            objects: Vec::new(),
            period: 0,
            overloaded_for: vec![0; n],
            owner_ns_per_byte: Ewma::default(),
            next_probe_at: 0,
        })
    }

    /// A placer for `cpus` of `machine`, budgets sized from its caches.
    pub fn for_machine(
        machine: &Machine,
        cpus: &[CpuId],
        config: PlacerConfig,
    ) -> Result<Placer, PlacementError> {
        let budgets = Budgets::from_machine(machine, cpus, config.fill)?;
        Placer::new(budgets, config)
    }

    /// The cache budgets it packs into.
    pub fn budgets(&self) -> &Budgets {
        &self.budgets
    }

    /// The settings in force.
    pub fn config(&self) -> &PlacerConfig {
        &self.config
    }

    /// Registers an object; it starts local (unscheduled) until monitoring says otherwise.
    pub fn register(&mut self, hints: ObjectHints) -> ObjectId {
        self.objects.push(ObjectState {
            hints,
            placement: Placement::Local,
            phase: Phase::Watching,
            heat: Ewma::default(),
            local_ns: Ewma::default(),
            owner_ns: Ewma::default(),
            accepted_owner_ns: None,
            hop_ns: Ewma::default(),
            batch_hop_ns: Ewma::default(),
            via: Via::Any,
            write_share: Ewma::default(),
            phase_periods: 0,
            recent: ObjectSample::default(),
            watched_local: (0.0, 0),
            trial_owner: (0.0, 0),
            watch_control: (0.0, 0),
            trial_control: (0.0, 0),
            idle_periods: 0,
            moved_at: None,
            pinned: false,
        });
        ObjectId(self.objects.len() - 1)
    }

    /// Places `id` on `cpu` for good (the driver knows better, e.g. a test or an explicit user
    /// request); `None` releases it back to the placer, unscheduled.
    pub fn pin(&mut self, id: ObjectId, cpu: Option<CpuId>) -> Result<Placement, PlacementError> {
        let o = self.objects.get(id.0).ok_or(PlacementError::UnknownObject(id))?;
        let (bytes, from) = (o.hints.bytes, o.placement);
        let Some(cpu) = cpu else {
            let o = &mut self.objects[id.0];
            (o.pinned, o.placement) = (false, Placement::Local);
            o.enter(Phase::Watching);
            return Ok(from);
        };
        let core = self
            .budgets
            .cores
            .iter()
            .position(|c| c.cpu == cpu)
            .ok_or(PlacementError::UnknownCpu { cpu, machine: "the placer's cores".into() })?;
        let mut room = self.room();
        if let Some(slot) = Slot::of(from, &self.budgets) {
            room.give(slot, bytes, 0.0);
        } else if from == Placement::Replicated {
            room.core_free.iter_mut().for_each(|f| *f += bytes);
        }
        if room.core_free[core] < bytes {
            return Err(PlacementError::NoRoom { object: id, bytes, cpu });
        }
        let o = &mut self.objects[id.0];
        (o.pinned, o.placement, o.via) = (true, Placement::Core { owner: cpu }, Via::Any);
        o.enter(Phase::Scheduled);
        Ok(from)
    }

    /// Registered objects.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether no object is registered.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Where `id` lives now (`Local` for an unknown id).
    pub fn placement(&self, id: ObjectId) -> Placement {
        self.objects.get(id.0).map_or(Placement::Local, |o| o.placement)
    }

    /// Every object's placement, in id order.
    pub fn placements(&self) -> Vec<Placement> {
        self.objects.iter().map(|o| o.placement).collect()
    }

    /// Bytes planned in each core's private budget and in each domain's shared budget.
    pub fn usage(&self) -> (Vec<u64>, Vec<u64>) {
        let mut cores = vec![0; self.budgets.cores.len()];
        let mut domains = vec![0; self.budgets.domains.len()];
        for o in &self.objects {
            match Slot::of(o.placement, &self.budgets) {
                Some(Slot::Core(i)) => cores[i] += o.hints.bytes,
                Some(Slot::Domain(d, _)) => domains[d] += o.hints.bytes,
                None if o.placement == Placement::Replicated => {
                    cores.iter_mut().for_each(|c| *c += o.hints.bytes);
                }
                None => {}
            }
        }
        (cores, domains)
    }

    /// Number of completed periods.
    pub fn period(&self) -> u64 {
        self.period
    }

    /// Ends a period: folds in what the driver measured (`objects[i]` is object i's sample, a
    /// shorter slice means no operations for the rest; `cores[j]` is `budgets().cores[j]`'s
    /// busy time, a shorter slice means unknown) and returns the moves to apply, already applied
    /// to this placer.
    pub fn end_period(&mut self, objects: &[ObjectSample], cores: &[CoreSample]) -> Vec<Move> {
        self.period += 1;
        self.observe(objects);
        let mut moves = Vec::new();
        if self.budgets.cores.len() < 2 {
            // One core: every operation already runs where any placement would send it, so a
            // placement would only cost the routed path's sampling and scheduling points.
            return moves;
        }
        self.judge_trials(&mut moves);
        self.free_cold(&mut moves);
        self.replicate(&mut moves);
        self.place_candidates(&mut moves);
        self.rebalance(cores, &mut moves);
        moves
    }

    fn observe(&mut self, samples: &[ObjectSample]) {
        let (alpha, watch) = (self.config.alpha, self.config.watch_periods);
        // This period's cost per byte of operations on unscheduled objects.
        let (mut ns, mut byte_ops) = (0.0, 0.0);
        for (o, s) in self.objects.iter().zip(samples) {
            if o.placement == Placement::Local && s.local_ops > 0 {
                ns += s.local_ns as f64;
                byte_ops += s.local_ops as f64 * o.hints.bytes.max(1) as f64;
            }
        }
        let control = (byte_ops > 0.0).then(|| ns / byte_ops);
        let add = |acc: &mut (f64, u64), ops: u64| {
            if let Some(c) = control {
                *acc = (acc.0 + c * ops as f64, acc.1 + ops);
            }
        };
        for (i, o) in self.objects.iter_mut().enumerate() {
            let s = samples.get(i).copied().unwrap_or_default();
            o.heat.add(s.ops() as f64, alpha);
            o.recent = s;
            if s.ops() == 0 {
                o.idle_periods += 1;
                continue;
            }
            o.idle_periods = 0;
            o.write_share.add(s.writes as f64 / s.ops() as f64, alpha);
            o.phase_periods += 1;
            // The first half of a phase runs on cold caches: not a steady-state cost.
            let cold = o.phase_periods <= watch / 2 && matches!(o.phase, Phase::Watching | Phase::OnTrial);
            if s.local_ops > 0 && !cold {
                let per_op = s.local_ns as f64 / s.local_ops as f64;
                o.local_ns.add(per_op, alpha);
                if o.phase == Phase::Watching {
                    o.watched_local =
                        (o.watched_local.0 + s.local_ns as f64, o.watched_local.1 + s.local_ops);
                    add(&mut o.watch_control, s.local_ops);
                }
            }
            if s.owner_ops > 0 && !cold {
                o.owner_ns.add(s.owner_ns as f64 / s.owner_ops as f64, alpha);
                let single = s.owner_ops.saturating_sub(s.batch_ops);
                if single > 0 {
                    o.hop_ns.add(s.hop_ns as f64 / single as f64, alpha);
                }
                if s.batch_ops > 0 {
                    o.batch_hop_ns.add(s.batch_hop_ns as f64 / s.batch_ops as f64, alpha);
                }
                if o.phase == Phase::OnTrial {
                    let (ns, ops) = o.trial_owner;
                    o.trial_owner = (ns + s.owner_ns as f64, ops + s.owner_ops);
                    add(&mut o.trial_control, s.owner_ops);
                }
            }
        }
    }

    /// Mean cost (ns) of moving one operation on its own, as scheduled objects measured it
    /// ([`PlacerConfig::hop_ns_hint`] before any did).
    fn hop_estimate(&self) -> f64 {
        mean(self.objects.iter().filter_map(|o| o.hop_ns.0)).unwrap_or(self.config.hop_ns_hint)
    }

    /// Mean cost (ns) of moving one operation in a batch, once any was measured.
    fn batch_hop_estimate(&self) -> Option<f64> {
        mean(self.objects.iter().filter_map(|o| o.batch_hop_ns.0))
    }

    /// The cheapest way to move an operation measured so far (ns).
    fn cheapest_hop(&self) -> f64 {
        let single = self.hop_estimate();
        self.batch_hop_estimate().map_or(single, |b| b.min(single))
    }

    /// Which operations a move that saves `saving_ns` of an operation costing `local_ns` pays
    /// for, given the measured hop costs (object `i`'s own where it has them); `None`: none.
    /// A move pays when the saving beats its cost by the margin [`PlacerConfig::keep_ratio`]
    /// asks for.
    fn paying_via(&self, i: usize, local_ns: f64, saving_ns: f64) -> Option<Via> {
        let margin = (1.0 - self.config.keep_ratio) * local_ns;
        let o = &self.objects[i];
        let single = o.hop_ns.0.unwrap_or_else(|| self.hop_estimate());
        let batched = o.batch_hop_ns.0.or_else(|| self.batch_hop_estimate());
        if saving_ns - single >= margin {
            Some(Via::Any)
        } else if batched.is_some_and(|b| saving_ns - b >= margin) {
            Some(Via::Batches)
        } else {
            None
        }
    }

    /// Which operations on `id` follow its route ([`Via::Any`] for an unscheduled object).
    pub fn via(&self, id: ObjectId) -> Via {
        self.objects.get(id.0).map_or(Via::Any, |o| o.via)
    }

    fn set(&mut self, i: usize, to: Placement, reason: MoveReason, moves: &mut Vec<Move>) {
        let via = if to.is_scheduled() { self.objects[i].via } else { Via::Any };
        self.set_via(i, to, via, reason, moves);
    }

    fn set_via(&mut self, i: usize, to: Placement, via: Via, reason: MoveReason, moves: &mut Vec<Move>) {
        let (from, was) = (self.objects[i].placement, self.objects[i].via);
        if from == to && was == via {
            return;
        }
        if from != to {
            self.objects[i].moved_at = Some(self.period);
        }
        (self.objects[i].placement, self.objects[i].via) = (to, via);
        moves.push(Move { object: ObjectId(i), from, to, via, reason });
    }

    fn judge_trials(&mut self, moves: &mut Vec<Move>) {
        let (min, retry) = (self.config.min_samples, self.config.retry_periods);
        let watch = self.config.watch_periods;
        for i in 0..self.objects.len() {
            let o = &self.objects[i];
            if o.pinned || o.phase != Phase::OnTrial || o.phase_periods < watch {
                continue;
            }
            let Some(local) = o.local_now_ns(min) else { continue };
            let (ns, ops) = o.trial_owner;
            if ops < min {
                continue;
            }
            // The saving it measured on its owner, against the moves it measured.
            let owner = ns / ops as f64;
            let bytes = o.hints.bytes.max(1) as f64;
            self.owner_ns_per_byte.add(owner / bytes, self.config.alpha);
            let placement = o.placement;
            match self.paying_via(i, local, local - owner) {
                Some(via) => {
                    self.objects[i].enter(Phase::Scheduled);
                    self.objects[i].accepted_owner_ns = Some(owner);
                    self.set_via(i, placement, via, MoveReason::Trial, moves);
                }
                None => {
                    self.objects[i].enter(Phase::Cheap { retry_at: self.period + retry });
                    self.set(i, Placement::Local, MoveReason::Cheap, moves);
                }
            }
        }
    }

    fn free_cold(&mut self, moves: &mut Vec<Move>) {
        for i in 0..self.objects.len() {
            let o = &self.objects[i];
            if !o.pinned && o.placement != Placement::Local && o.idle_periods >= self.config.cold_periods {
                self.objects[i].enter(Phase::Watching);
                self.set(i, Placement::Local, MoveReason::Cold, moves);
            }
        }
    }

    /// Load one core can carry per period: the mean load of scheduled objects per core, scaled.
    fn core_capacity(&self) -> f64 {
        let total: f64 = self.objects.iter().map(ObjectState::load).sum();
        let speed: f64 = self.budgets.cores.iter().map(|c| c.speed).sum();
        total / speed
    }

    fn replicate(&mut self, moves: &mut Vec<Move>) {
        let capacity = self.core_capacity();
        let (share, max_writes) = (self.config.replicate_load_share, self.config.replicate_max_writes);
        let (core_used, _) = self.usage();
        let mut free: Vec<u64> =
            self.budgets.cores.iter().zip(&core_used).map(|(b, used)| b.private_bytes - used).collect();
        for i in 0..self.objects.len() {
            let o = &self.objects[i];
            if o.pinned {
                continue;
            }
            let writes = o.write_share.0.unwrap_or(0.0);
            if o.placement == Placement::Replicated {
                if writes > 2.0 * max_writes {
                    self.objects[i].enter(Phase::Watching);
                    self.set(i, Placement::Local, MoveReason::Unreplicate, moves);
                }
                continue;
            }
            let too_hot = capacity > 0.0 && self.budgets.cores.len() > 1 && o.load() > share * capacity;
            let worth = matches!(o.phase, Phase::Scheduled | Phase::OnTrial);
            if !(o.hints.replicable && worth && too_hot && writes <= max_writes) {
                continue;
            }
            // Its single slot is freed, then every core is charged a copy.
            let bytes = o.hints.bytes;
            let own = match Slot::of(o.placement, &self.budgets) {
                Some(Slot::Core(c)) => Some(c),
                _ => None,
            };
            let fits =
                free.iter().enumerate().all(|(c, f)| f + if own == Some(c) { bytes } else { 0 } >= bytes);
            if fits {
                for (c, f) in free.iter_mut().enumerate() {
                    *f = *f + if own == Some(c) { bytes } else { 0 } - bytes;
                }
                self.objects[i].enter(Phase::Scheduled);
                self.set(i, Placement::Replicated, MoveReason::Replicate, moves);
            }
        }
    }

    /// Free room now, with every current placement charged.
    fn room(&self) -> Room {
        let total: f64 = self.objects.iter().map(ObjectState::load).sum();
        let mut room = Room::new(&self.budgets, total, self.config.load_slack);
        for o in &self.objects {
            if let Some(slot) = Slot::of(o.placement, &self.budgets) {
                room.take(slot, o.hints.bytes, o.load());
            } else if o.placement == Placement::Replicated {
                room.core_free.iter_mut().for_each(|f| *f -= o.hints.bytes);
            }
        }
        room
    }

    /// Packs objects that look expensive to fetch (watching ones, and cheap ones due for a
    /// retry, whose local cost exceeds the cheapest move) into the free room, hottest first,
    /// groups as units. Once trials have measured what an owner's cache gives, only objects
    /// whose predicted saving pays for a move are tried, plus a few probes every
    /// [`PlacerConfig::retry_periods`] (costs change); before, only the probes.
    fn place_candidates(&mut self, moves: &mut Vec<Move>) {
        let hop = self.cheapest_hop();
        let period = self.period;
        for o in &mut self.objects {
            if let Phase::Cheap { retry_at } = o.phase {
                if period >= retry_at {
                    o.enter(Phase::Watching);
                    o.owner_ns = Ewma::default();
                }
            }
        }
        let (min, watch) = (self.config.min_samples, self.config.watch_periods);
        let candidate = |o: &ObjectState| {
            !o.pinned
                && o.phase == Phase::Watching
                && o.placement == Placement::Local
                && o.watched_local.1 >= min
                && o.phase_periods >= watch
                && o.watched_local_ns().is_some_and(|c| c > hop)
        };
        // Units: a group's candidates together, or single objects.
        let mut units: Vec<Vec<usize>> = Vec::new();
        let mut group_unit: Vec<(u64, usize)> = Vec::new();
        for (i, o) in self.objects.iter().enumerate() {
            if !candidate(o) {
                continue;
            }
            match o.hints.group {
                Some(g) => match group_unit.iter().find(|(k, _)| *k == g) {
                    Some(&(_, u)) => units[u].push(i),
                    None => {
                        group_unit.push((g, units.len()));
                        units.push(vec![i]);
                    }
                },
                None => units.push(vec![i]),
            }
        }
        if units.is_empty() {
            return;
        }
        let on_trial = self.objects.iter().filter(|o| o.phase == Phase::OnTrial).count();
        let probes =
            if on_trial == 0 && period >= self.next_probe_at { self.config.probe_objects } else { 0 };
        let per_byte = self.owner_ns_per_byte.0;
        let pays = |i: usize| {
            let o = &self.objects[i];
            let local = o.watched_local_ns().unwrap_or(0.0);
            per_byte.is_some_and(|b| self.paying_via(i, local, local - b * o.hints.bytes as f64).is_some())
        };
        let (mut paying, mut rest): (Vec<Vec<usize>>, Vec<Vec<usize>>) =
            units.into_iter().partition(|u| u.iter().all(|&i| pays(i)));
        if paying.is_empty() && probes > 0 {
            self.next_probe_at = period + self.config.retry_periods;
        }
        let objects = &self.objects;
        let heat = |u: &Vec<usize>| u.iter().map(|&i| objects[i].load()).sum::<f64>();
        rest.sort_by(|a, b| heat(b).total_cmp(&heat(a)).then(a[0].cmp(&b[0])));
        paying.extend(rest.into_iter().take(probes));
        let units = paying;
        if units.is_empty() {
            return;
        }
        let mut units: Vec<(Vec<usize>, u64, f64)> = units
            .into_iter()
            .map(|u| {
                let bytes = u.iter().map(|&i| objects[i].hints.bytes).sum();
                let load = u.iter().map(|&i| objects[i].load()).sum();
                (u, bytes, load)
            })
            .collect();
        units.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0[0].cmp(&b.0[0])));
        let mut room = self.room();
        let order = core_order(&self.budgets);
        for (unit, bytes, load) in units {
            let mut slots: Vec<(usize, Slot)> = Vec::new();
            if let Some(slot) = room.first_fit(&order, &self.budgets, bytes, load) {
                room.take(slot, bytes, load);
                slots.extend(unit.iter().map(|&i| (i, slot)));
            } else {
                // Too big as a unit: members one by one.
                for &i in &unit {
                    let (bytes, load) = (self.objects[i].hints.bytes, self.objects[i].load());
                    if let Some(slot) = room.first_fit(&order, &self.budgets, bytes, load) {
                        room.take(slot, bytes, load);
                        slots.push((i, slot));
                    }
                }
            }
            for (i, slot) in slots {
                self.objects[i].enter(Phase::OnTrial);
                let to = slot.placement(&self.budgets);
                // On trial, every operation goes: both kinds of move get measured.
                self.set_via(i, to, Via::Any, MoveReason::Trial, moves);
            }
        }
    }

    /// Moves objects off saturated or missing cores onto idle ones.
    fn rebalance(&mut self, cores: &[CoreSample], moves: &mut Vec<Move>) {
        let n = self.budgets.cores.len();
        if cores.len() < n || n < 2 {
            return;
        }
        let busy: Vec<f64> = cores[..n]
            .iter()
            .map(|c| if c.elapsed_ns == 0 { 0.0 } else { c.busy_ns as f64 / c.elapsed_ns as f64 })
            .collect();
        let idle: Vec<usize> = (0..n).filter(|&i| busy[i] <= self.config.idle_busy).collect();
        let mut overloaded = Vec::new();
        for (i, &b) in busy.iter().enumerate() {
            let reason = if b >= self.config.saturated_busy {
                Some(MoveReason::Saturated)
            } else if self.core_missing(i) {
                Some(MoveReason::Missing)
            } else {
                None
            };
            match reason {
                Some(r) if idle.iter().any(|&t| t != i) => {
                    self.overloaded_for[i] += 1;
                    if self.overloaded_for[i] >= self.config.patience {
                        overloaded.push((i, r));
                    }
                }
                _ => self.overloaded_for[i] = 0,
            }
        }
        for (hot, reason) in overloaded {
            self.shed(hot, reason, &idle, &busy, moves);
            self.overloaded_for[hot] = 0;
        }
    }

    /// Whether core `i`'s scheduled objects cost clearly more on it in the last period than
    /// the same operations cost when their trials succeeded (its cache no longer holds them).
    fn core_missing(&self, i: usize) -> bool {
        let (mut actual, mut expected, mut ops) = (0.0, 0.0, 0);
        for o in &self.objects {
            if o.phase != Phase::Scheduled || Slot::of(o.placement, &self.budgets).map(Slot::core) != Some(i)
            {
                continue;
            }
            if let Some(accepted) = o.accepted_owner_ns {
                actual += o.recent.owner_ns as f64;
                expected += o.recent.owner_ops as f64 * accepted;
                ops += o.recent.owner_ops;
            }
        }
        ops >= 4 * self.config.min_samples && actual > self.config.miss_ratio * expected
    }

    /// Moves objects from core `hot` to idle cores until about half the busy gap has moved
    /// (saturation) or a quarter of its bytes (missing), objects that moved recently excepted.
    fn shed(&mut self, hot: usize, reason: MoveReason, idle: &[usize], busy: &[f64], moves: &mut Vec<Move>) {
        let residency = self.config.min_residency;
        let period = self.period;
        let mut mine: Vec<usize> = (0..self.objects.len())
            .filter(|&i| {
                let o = &self.objects[i];
                !o.pinned
                    && Slot::of(o.placement, &self.budgets).map(Slot::core) == Some(hot)
                    && o.moved_at.is_none_or(|t| period >= t + residency)
            })
            .collect();
        if mine.is_empty() {
            return;
        }
        // What loads the core now (this period), hottest first; an object bigger than what is
        // left of the goal is skipped so one move never overshoots into the other direction.
        let loads: Vec<f64> = self.objects.iter().map(ObjectState::recent_load).collect();
        let recent = |i: usize| loads[i];
        mine.retain(|&i| recent(i) > 0.0);
        mine.sort_by(|&a, &b| recent(b).total_cmp(&recent(a)).then(a.cmp(&b)));
        let hot_domain = self.budgets.cores[hot].domain;
        let targets: Vec<usize> = idle.iter().copied().filter(|&t| t != hot).collect();
        let core_load: f64 = mine.iter().map(|&i| recent(i)).sum();
        let mean_target_busy = targets.iter().map(|&t| busy[t]).sum::<f64>() / targets.len().max(1) as f64;
        let goal_load = match reason {
            MoveReason::Saturated => core_load * ((busy[hot] - mean_target_busy) / 2.0 / busy[hot].max(1e-9)),
            _ => core_load / 4.0,
        };
        let mut room = self.room();
        let mut added = vec![0.0; self.budgets.cores.len()];
        let mut moved = 0.0;
        for i in mine {
            let (bytes, load, pack_load) = (self.objects[i].hints.bytes, recent(i), self.objects[i].load());
            if moved >= goal_load {
                break;
            }
            if moved + load > goal_load * 1.5 {
                continue;
            }
            // The least-loaded idle core so far; the same shared-cache domain breaks ties.
            let Some(target) = targets.iter().copied().min_by(|&a, &b| {
                let key =
                    |t: usize| (added[t] + busy[t] * core_load, self.budgets.cores[t].domain != hot_domain);
                let (ka, kb) = (key(a), key(b));
                ka.0.total_cmp(&kb.0).then(ka.1.cmp(&kb.1)).then(a.cmp(&b))
            }) else {
                break;
            };
            let from = Slot::of(self.objects[i].placement, &self.budgets).expect("object is on core `hot`");
            if room.core_free[target] >= bytes {
                room.give(from, bytes, pack_load);
                room.take(Slot::Core(target), bytes, pack_load);
                added[target] += load;
                moved += load;
                self.set(i, Slot::Core(target).placement(&self.budgets), reason, moves);
                continue;
            }
            // The target's cache is full: swap with its coolest object, which takes `i`'s slot.
            let free_at_from = |room: &Room| match from {
                Slot::Core(c) => room.core_free[c],
                Slot::Domain(d, _) => room.domain_free[d],
            };
            let victim = (0..self.objects.len())
                .filter(|&v| {
                    let o = &self.objects[v];
                    !o.pinned
                        && Slot::of(o.placement, &self.budgets) == Some(Slot::Core(target))
                        && o.moved_at.is_none_or(|t| period >= t + residency)
                        && loads[v] < load / 2.0
                        && room.core_free[target] + o.hints.bytes >= bytes
                        && free_at_from(&room) + bytes >= o.hints.bytes
                })
                .min_by(|&a, &b| loads[a].total_cmp(&loads[b]).then(a.cmp(&b)));
            let Some(v) = victim else { continue };
            let (v_bytes, v_pack) = (self.objects[v].hints.bytes, self.objects[v].load());
            room.give(from, bytes, pack_load);
            room.give(Slot::Core(target), v_bytes, v_pack);
            room.take(Slot::Core(target), bytes, pack_load);
            room.take(from, v_bytes, v_pack);
            added[target] += load - loads[v];
            moved += load - loads[v];
            self.set(i, Slot::Core(target).placement(&self.budgets), reason, moves);
            self.set(v, from.placement(&self.budgets), reason, moves);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corehop_topology::{Cache, CoreClass, Cpu};
    use proptest::prelude::*;

    /// `chips` packages of `per_chip` cores: private L1d + L2, one L3 per chip.
    fn machine(chips: usize, per_chip: usize, l2: u64, l3: u64, speeds: &[f64]) -> Machine {
        let n = chips * per_chip;
        let cpus = (0..n)
            .map(|i| Cpu {
                id: CpuId(i),
                os_id: corehop_topology::OsCpu(i),
                core: i,
                package: i / per_chip,
                class: CoreClass::Uniform,
                speed: speeds.get(i).copied().unwrap_or(1.0),
                emulated_speed: None,
            })
            .collect();
        let mut caches = Vec::new();
        for i in 0..n {
            let cache = |level, size| Cache {
                level,
                kind: CacheKind::Data,
                size_bytes: size,
                line_bytes: 64,
                cpus: vec![CpuId(i)],
            };
            caches.push(cache(1, 64 << 10));
            caches.push(Cache { kind: CacheKind::Unified, ..cache(2, l2) });
        }
        for c in 0..chips {
            caches.push(Cache {
                level: 3,
                kind: CacheKind::Unified,
                size_bytes: l3,
                line_bytes: 64,
                cpus: (c * per_chip..(c + 1) * per_chip).map(CpuId).collect(),
            });
        }
        Machine { name: "test".into(), source: "test".into(), cpus, caches, waitpkg: false }
    }

    fn all(m: &Machine) -> Vec<CpuId> {
        m.cpus().iter().map(|c| c.id).collect()
    }

    #[test]
    fn budgets_split_private_and_shared_caches() {
        let m = machine(4, 4, 512 << 10, 2 << 20, &[]);
        let b = Budgets::from_machine(&m, &all(&m), 1.0).unwrap();
        assert_eq!(b.cores.len(), 16);
        assert_eq!(b.domains.len(), 4);
        assert!(b.cores.iter().all(|c| c.private_bytes == 512 << 10));
        assert_eq!(b.cores[5].domain, 1);
        // The paper: 16 × 512 KB L2 + 4 × 2 MB L3 = 16 MB of on-chip memory.
        assert_eq!(b.total_bytes(), 16 << 20);
        let half = Budgets::from_machine(&m, &all(&m), 0.5).unwrap();
        assert_eq!(half.total_bytes(), 8 << 20);
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let m = machine(1, 2, 1 << 20, 4 << 20, &[]);
        assert_eq!(Budgets::from_machine(&m, &[], 0.5), Err(PlacementError::NoCores));
        assert!(matches!(
            Budgets::from_machine(&m, &[CpuId(7)], 0.5),
            Err(PlacementError::UnknownCpu { cpu: CpuId(7), .. })
        ));
        assert!(matches!(
            Budgets::from_machine(&m, &all(&m), 1.5),
            Err(PlacementError::BadConfig { name: "fill", .. })
        ));
        let bare = Machine { caches: Vec::new(), ..m.clone() };
        assert!(matches!(
            Budgets::from_machine(&bare, &all(&bare), 0.5),
            Err(PlacementError::NoCacheInfo { .. })
        ));
        let config = PlacerConfig { idle_busy: 0.95, ..PlacerConfig::default() };
        assert!(matches!(
            Placer::for_machine(&m, &all(&m), config),
            Err(PlacementError::BadConfig { name: "idle_busy", .. })
        ));
    }

    #[test]
    fn pack_puts_hottest_on_fastest_core() {
        let m = machine(1, 2, 1 << 20, 0, &[0.5, 1.0]);
        let b = Budgets::from_machine(&m, &all(&m), 1.0).unwrap();
        let items = vec![PackItem { bytes: 100, load: 1.0 }, PackItem { bytes: 100, load: 10.0 }];
        let p = pack(&items, &b, 0.2);
        assert_eq!(p[1], Placement::Core { owner: CpuId(1) });
    }

    #[test]
    fn pack_spreads_load_and_leaves_overflow_local() {
        let m = machine(1, 2, 1000, 0, &[]);
        let b = Budgets::from_machine(&m, &all(&m), 1.0).unwrap();
        // Four equally hot objects of 400 bytes: two per core by load; a fifth does not fit.
        let items = vec![PackItem { bytes: 400, load: 1.0 }; 5];
        let p = pack(&items, &b, 0.1);
        let on = |cpu| p.iter().filter(|x| **x == Placement::Core { owner: CpuId(cpu) }).count();
        assert_eq!((on(0), on(1)), (2, 2));
        assert_eq!(p[4], Placement::Local);
    }

    #[test]
    fn pack_overflows_into_shared_domain() {
        let m = machine(2, 2, 1000, 10_000, &[]);
        let b = Budgets::from_machine(&m, &all(&m), 1.0).unwrap();
        let items = vec![PackItem { bytes: 900, load: 1.0 }; 6];
        let p = pack(&items, &b, 0.5);
        assert_eq!(p.iter().filter(|x| matches!(x, Placement::Core { .. })).count(), 4);
        assert_eq!(p.iter().filter(|x| matches!(x, Placement::Domain { .. })).count(), 2);
        // A domain placement runs locally for callers in the domain, at home otherwise.
        let d = p.iter().find(|x| matches!(x, Placement::Domain { .. })).unwrap();
        let Placement::Domain { domain, home } = *d else { unreachable!() };
        assert_eq!(d.target(CpuId(99), domain), CpuId(99));
        assert_eq!(d.target(CpuId(99), domain + 1), home);
    }

    /// Drives a placer: `cost(object, on_owner)` gives ns per op; every object gets `ops` ops
    /// per period; cores report `busy`.
    fn drive(
        p: &mut Placer,
        periods: usize,
        ops: &dyn Fn(usize) -> u64,
        cost: &dyn Fn(usize, bool) -> u64,
        busy: &dyn Fn(&Placer) -> Vec<CoreSample>,
    ) -> Vec<Move> {
        let mut all_moves = Vec::new();
        for _ in 0..periods {
            let samples: Vec<ObjectSample> = (0..p.len())
                .map(|i| {
                    let n = ops(i);
                    if p.placement(ObjectId(i)).is_scheduled() {
                        ObjectSample {
                            owner_ops: n,
                            owner_ns: n * cost(i, true),
                            hop_ns: n * 200,
                            ..Default::default()
                        }
                    } else {
                        ObjectSample { local_ops: n, local_ns: n * cost(i, false), ..Default::default() }
                    }
                })
                .collect();
            let cores = busy(p);
            all_moves.extend(p.end_period(&samples, &cores));
        }
        all_moves
    }

    fn flat_busy(p: &Placer) -> Vec<CoreSample> {
        vec![CoreSample { busy_ns: 50, elapsed_ns: 100 }; p.budgets().cores.len()]
    }

    #[test]
    fn expensive_objects_are_scheduled_cheap_ones_stay_local() {
        let mut p = cores_with(2, 20, 32_000);
        // Even objects: 5 µs cold, 1 µs on an owner (worth it). Odd: same cost either way.
        let cost = |i: usize, owner: bool| if i.is_multiple_of(2) && !owner { 5000 } else { 1000 };
        drive(&mut p, 10, &|_| 20, &cost, &flat_busy);
        for i in 0..20 {
            let placement = p.placement(ObjectId(i));
            assert_eq!(placement.is_scheduled(), i.is_multiple_of(2), "object {i}: {placement:?}");
        }
    }

    /// The saving that places half of two cores' objects places nothing on one core: every
    /// operation already runs there.
    #[test]
    fn one_core_places_nothing() {
        let mut p = cores_with(1, 20, 32_000);
        let cost = |i: usize, owner: bool| if i.is_multiple_of(2) && !owner { 5000 } else { 1000 };
        let moves = drive(&mut p, 10, &|_| 20, &cost, &flat_busy);
        assert!(moves.is_empty(), "{moves:?}");
        assert!(p.placements().iter().all(|pl| *pl == Placement::Local));
    }

    #[test]
    fn objects_cheaper_than_a_hop_are_never_tried() {
        let m = machine(1, 2, 1 << 20, 0, &[]);
        let mut p = Placer::for_machine(&m, &all(&m), PlacerConfig::default()).unwrap();
        p.register(ObjectHints { bytes: 64, ..Default::default() });
        let big = p.register(ObjectHints { bytes: 32_000, ..Default::default() });
        let cost = |i: usize, owner: bool| {
            if i == 1 && !owner {
                5000
            } else if i == 1 {
                1000
            } else {
                100
            }
        };
        let moves = drive(&mut p, 10, &|_| 20, &cost, &flat_busy);
        assert!(p.placement(big).is_scheduled());
        assert_eq!(p.placement(ObjectId(0)), Placement::Local);
        assert!(moves.iter().all(|m| m.object == big));
    }

    /// Drives `p` for `periods` with every object costing `local_ns` per operation where it is
    /// called, `owner_ns` on an owner, and `hop_ns` per operation to get there.
    fn drive_costs(p: &mut Placer, periods: usize, local_ns: u64, owner_ns: u64, hop_ns: u64) {
        drive_mixed(p, periods, (local_ns, owner_ns), (hop_ns, 0), 0);
    }

    /// A placer on two cores of 1 MiB L2 with `n` objects of `bytes`.
    fn two_cores_with(n: usize, bytes: u64) -> Placer {
        cores_with(2, n, bytes)
    }

    /// A placer on `cores` cores of 1 MiB L2 with `n` objects of `bytes`.
    fn cores_with(cores: usize, n: usize, bytes: u64) -> Placer {
        let m = machine(1, cores, 1 << 20, 0, &[]);
        let mut p = Placer::for_machine(&m, &all(&m), PlacerConfig::default()).unwrap();
        for _ in 0..n {
            p.register(ObjectHints { bytes, ..Default::default() });
        }
        p
    }

    /// The same cache saving (1 µs locally, 0.8 µs on an owner) pays with a batched move's
    /// share of a hop (20 ns an operation) and not with a round trip per operation (300 ns):
    /// then every trial fails, and nothing stays placed.
    #[test]
    fn a_saving_smaller_than_the_measured_hop_places_nothing() {
        for (hop_ns, pays) in [(300, false), (20, true)] {
            let mut p = two_cores_with(8, 32_000);
            drive_costs(&mut p, 40, 1000, 800, hop_ns);
            let placed = p.placements().iter().filter(|pl| pl.is_scheduled()).count();
            assert_eq!(placed, if pays { 8 } else { 0 }, "hop {hop_ns} ns: {:?}", p.placements());
        }
    }

    /// Drives `p` for `periods`: every object costs `local_ns` an operation where it is
    /// called and `owner_ns` on an owner; of a scheduled object's 20 operations a period,
    /// `batched` travel in batches at `batch_hop_ns` each and the rest alone at `hop_ns`.
    fn drive_mixed(
        p: &mut Placer,
        periods: usize,
        costs: (u64, u64),
        hops: (u64, u64),
        batched: u64,
    ) -> Vec<Move> {
        let ((local_ns, owner_ns), (hop_ns, batch_hop_ns)) = (costs, hops);
        let mut moves = Vec::new();
        for _ in 0..periods {
            let samples: Vec<ObjectSample> = (0..p.len())
                .map(|i| {
                    let n = 20;
                    let id = ObjectId(i);
                    match (p.placement(id).is_scheduled(), p.via(id)) {
                        (true, Via::Any) => ObjectSample {
                            owner_ops: n,
                            owner_ns: n * owner_ns,
                            hop_ns: (n - batched) * hop_ns,
                            batch_ops: batched,
                            batch_hop_ns: batched * batch_hop_ns,
                            ..Default::default()
                        },
                        // Operations issued alone run where they are called.
                        (true, Via::Batches) => ObjectSample {
                            local_ops: n - batched,
                            local_ns: (n - batched) * local_ns,
                            owner_ops: batched,
                            owner_ns: batched * owner_ns,
                            batch_ops: batched,
                            batch_hop_ns: batched * batch_hop_ns,
                            ..Default::default()
                        },
                        (false, _) => {
                            ObjectSample { local_ops: n, local_ns: n * local_ns, ..Default::default() }
                        }
                    }
                })
                .collect();
            let cores = flat_busy(p);
            moves.extend(p.end_period(&samples, &cores));
        }
        moves
    }

    /// A saving (1 µs locally, 0.8 µs on an owner) that pays for a batch's share of a move
    /// (20 ns) and not for a move of its own (300 ns): the objects are scheduled for batches
    /// only, and an operation issued alone stays where it is called.
    #[test]
    fn a_saving_that_pays_only_in_batches_schedules_for_batches() {
        let mut p = two_cores_with(8, 32_000);
        let moves = drive_mixed(&mut p, 40, (1000, 800), (300, 20), 10);
        for i in 0..8 {
            assert!(p.placement(ObjectId(i)).is_scheduled(), "{:?}", p.placements());
            assert_eq!(p.via(ObjectId(i)), Via::Batches);
        }
        assert!(moves.iter().any(|m| m.via == Via::Batches && m.to.is_scheduled()));
        // A larger saving pays for single moves too.
        let mut p = two_cores_with(8, 32_000);
        drive_mixed(&mut p, 40, (1000, 500), (300, 20), 10);
        assert!((0..8).all(|i| p.placement(ObjectId(i)).is_scheduled() && p.via(ObjectId(i)) == Via::Any));
    }

    /// The host gets twice as fast while the probes are on trial (another tenant stops): the
    /// probes' owner cost falls, and so does every unscheduled object's. That is no saving,
    /// and nothing is scheduled.
    #[test]
    fn a_drift_of_the_host_is_not_a_saving() {
        let mut p = two_cores_with(10, 32_000);
        let mut moves = drive_mixed(&mut p, 5, (1000, 1000), (100, 0), 0);
        moves.extend(drive_mixed(&mut p, 15, (500, 480), (100, 0), 0));
        assert!(moves.iter().any(|m| m.reason == MoveReason::Trial), "the probes were tried");
        assert!(p.placements().iter().all(|pl| !pl.is_scheduled()), "{moves:?}");
    }

    /// When no move pays (the saving measured is below every hop measured), only the probes
    /// are ever tried, once per retry interval; everything else stays where it is called.
    #[test]
    fn when_no_move_pays_only_probes_are_tried() {
        let mut p = two_cores_with(20, 32_000);
        let (probes, retry) = (p.config().probe_objects, p.config().retry_periods);
        let periods = 200;
        let moves = drive_mixed(&mut p, periods, (1000, 950), (300, 100), 10);
        let trials = moves.iter().filter(|m| m.reason == MoveReason::Trial && m.to.is_scheduled()).count();
        assert!(trials > 0, "probes are tried: costs change");
        assert!(trials <= probes * (1 + periods / retry as usize), "{trials} trials: {moves:?}");
        assert!(moves.iter().all(|m| m.via == Via::Any));
        // In between the probes, nothing is placed.
        let placed = p.placements().iter().filter(|pl| pl.is_scheduled()).count();
        assert!(placed <= probes, "{:?}", p.placements());
    }

    #[test]
    fn groups_are_packed_on_one_core() {
        let m = machine(1, 4, 1 << 20, 0, &[]);
        let mut p = Placer::for_machine(&m, &all(&m), PlacerConfig::default()).unwrap();
        let ids: Vec<ObjectId> = (0..8)
            .map(|i| p.register(ObjectHints { bytes: 10_000, group: Some(i / 4), ..Default::default() }))
            .collect();
        drive(&mut p, 8, &|_| 20, &|_, owner| if owner { 1000 } else { 5000 }, &flat_busy);
        for g in ids.chunks(4) {
            let first = p.placement(g[0]);
            assert!(first.is_scheduled());
            assert!(g.iter().all(|&id| p.placement(id) == first), "{:?}", p.placements());
        }
    }

    #[test]
    fn rebalancing_moves_load_off_a_saturated_core() {
        let m = machine(1, 2, 1 << 20, 0, &[]);
        let mut p = Placer::for_machine(&m, &all(&m), PlacerConfig::default()).unwrap();
        for _ in 0..16 {
            p.register(ObjectHints { bytes: 10_000, ..Default::default() });
        }
        let cost = |_: usize, owner: bool| if owner { 1000 } else { 5000 };
        // Uniform popularity first: probes, then the rest, spread over both cores.
        drive(&mut p, 10, &|_| 20, &cost, &flat_busy);
        let on_core = |p: &Placer, cpu: usize| {
            (0..p.len())
                .filter(|&i| p.placement(ObjectId(i)) == Placement::Core { owner: CpuId(cpu) })
                .collect::<Vec<_>>()
        };
        let hot: Vec<usize> = on_core(&p, 0);
        assert!(!hot.is_empty() && !on_core(&p, 1).is_empty());
        // Now only core 0's objects are used: core 0 saturates while core 1 idles.
        let ops = move |i: usize| if hot.contains(&i) { 40 } else { 0 };
        let busy = |p: &Placer| {
            let load =
                |cpu| on_core(p, cpu).iter().filter(|i| p.objects[**i].heat.0.unwrap_or(0.0) > 5.0).count();
            let frac = |cpu| (load(cpu) as f64 / 4.0).min(1.0);
            (0..2).map(|cpu| CoreSample { busy_ns: (frac(cpu) * 100.0) as u64, elapsed_ns: 100 }).collect()
        };
        let moves = drive(&mut p, 12, &ops, &cost, &busy);
        let shed: Vec<&Move> = moves.iter().filter(|m| m.reason == MoveReason::Saturated).collect();
        assert!(!shed.is_empty(), "no rebalancing moves: {moves:?}");
        assert!(shed
            .iter()
            .all(|m| m.from == Placement::Core { owner: CpuId(0) }
                && m.to == Placement::Core { owner: CpuId(1) }));
    }

    #[test]
    fn oscillating_popularity_does_not_thrash() {
        let m = machine(1, 2, 1 << 20, 0, &[]);
        let mut p = Placer::for_machine(&m, &all(&m), PlacerConfig::default()).unwrap();
        for _ in 0..32 {
            p.register(ObjectHints { bytes: 10_000, ..Default::default() });
        }
        let cost = |_: usize, owner: bool| if owner { 1000 } else { 5000 };
        drive(&mut p, 4, &|_| 20, &cost, &flat_busy);
        // Popularity flips each period between all objects and the first sixteenth; the busy
        // signal flips with it (core 0 hot in the small phase).
        let mut moves = Vec::new();
        for period in 0..40 {
            let small = period % 2 == 1;
            let ops = move |i: usize| if !small || i < 2 { 20 } else { 0 };
            let busy = move |_: &Placer| {
                let b = if small { [95, 10] } else { [60, 60] };
                b.iter().map(|&x| CoreSample { busy_ns: x, elapsed_ns: 100 }).collect()
            };
            moves.extend(drive(&mut p, 1, &ops, &cost, &busy));
        }
        // Busy flips every period, so the patience of two periods never triggers.
        assert!(moves.iter().all(|m| m.reason != MoveReason::Saturated), "{moves:?}");
    }

    #[test]
    fn replicable_objects_too_hot_for_one_core_are_replicated() {
        let m = machine(1, 2, 1 << 20, 0, &[]);
        let mut p = Placer::for_machine(&m, &all(&m), PlacerConfig::default()).unwrap();
        let hot = p.register(ObjectHints { bytes: 4_000, replicable: true, ..Default::default() });
        let writable_hot = p.register(ObjectHints { bytes: 4_000, replicable: false, ..Default::default() });
        for _ in 0..4 {
            p.register(ObjectHints { bytes: 4_000, replicable: true, ..Default::default() });
        }
        let ops = |i: usize| if i < 2 { 2000 } else { 20 };
        drive(&mut p, 12, &ops, &|_, owner| if owner { 1000 } else { 5000 }, &flat_busy);
        assert_eq!(p.placement(hot), Placement::Replicated);
        assert!(p.placement(writable_hot).is_scheduled());
        assert!((2..6).all(|i| p.placement(ObjectId(i)).is_scheduled()));
        // Writes make copies pointless: back to one place.
        let samples: Vec<ObjectSample> = (0..6)
            .map(|_| ObjectSample { local_ops: 100, local_ns: 100_000, writes: 50, ..Default::default() })
            .collect();
        let mut moves = Vec::new();
        for _ in 0..4 {
            moves.extend(p.end_period(&samples, &flat_busy(&p)));
        }
        assert!(moves.iter().any(|m| m.object == hot && m.reason == MoveReason::Unreplicate));
    }

    #[test]
    fn pinned_objects_stay_and_must_fit() {
        let m = machine(1, 2, 100_000, 0, &[]);
        let mut p =
            Placer::for_machine(&m, &all(&m), PlacerConfig { fill: 1.0, ..PlacerConfig::default() }).unwrap();
        let a = p.register(ObjectHints { bytes: 60_000, ..Default::default() });
        let b = p.register(ObjectHints { bytes: 60_000, ..Default::default() });
        assert_eq!(p.pin(a, Some(CpuId(1))), Ok(Placement::Local));
        assert_eq!(
            p.pin(b, Some(CpuId(1))),
            Err(PlacementError::NoRoom { object: b, bytes: 60_000, cpu: CpuId(1) })
        );
        assert!(matches!(p.pin(b, Some(CpuId(5))), Err(PlacementError::UnknownCpu { .. })));
        assert_eq!(p.pin(ObjectId(9), None), Err(PlacementError::UnknownObject(ObjectId(9))));
        // Cheap on its owner and never used: still pinned.
        drive(&mut p, 30, &|i| if i == 0 { 0 } else { 20 }, &|_, _| 10_000, &flat_busy);
        assert_eq!(p.placement(a), Placement::Core { owner: CpuId(1) });
        assert_eq!(p.pin(a, None), Ok(Placement::Core { owner: CpuId(1) }));
        assert_eq!(p.placement(a), Placement::Local);
    }

    fn check_invariants(p: &Placer) -> Result<(), TestCaseError> {
        let (cores, domains) = p.usage();
        for (used, budget) in cores.iter().zip(&p.budgets().cores) {
            prop_assert!(
                *used <= budget.private_bytes,
                "core over-filled: {used} > {}",
                budget.private_bytes
            );
        }
        for (used, budget) in domains.iter().zip(&p.budgets().domains) {
            prop_assert!(
                *used <= budget.shared_bytes,
                "domain over-filled: {used} > {}",
                budget.shared_bytes
            );
        }
        let cpus: Vec<CpuId> = p.budgets().cores.iter().map(|c| c.cpu).collect();
        prop_assert_eq!(p.placements().len(), p.len());
        for placement in p.placements() {
            match placement {
                Placement::Core { owner } => prop_assert!(cpus.contains(&owner)),
                Placement::Domain { domain, home } => {
                    prop_assert!(p.budgets().domains[domain].cpus.contains(&home))
                }
                Placement::Local | Placement::Replicated => {}
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn pack_never_overfills(
            sizes in prop::collection::vec((1u64..300_000, 0.0f64..100.0), 0..200),
            chips in 1usize..4, per_chip in 1usize..5,
        ) {
            let m = machine(chips, per_chip, 256 << 10, 1 << 20, &[]);
            let b = Budgets::from_machine(&m, &all(&m), 0.8).unwrap();
            let items: Vec<PackItem> = sizes.iter().map(|&(bytes, load)| PackItem { bytes, load }).collect();
            let placed = pack(&items, &b, 0.2);
            let mut core = vec![0u64; b.cores.len()];
            let mut dom = vec![0u64; b.domains.len()];
            for (item, p) in items.iter().zip(&placed) {
                match *p {
                    Placement::Core { owner } => core[owner.0] += item.bytes,
                    Placement::Domain { domain, home } => {
                        prop_assert!(b.domains[domain].cpus.contains(&home));
                        dom[domain] += item.bytes;
                    }
                    Placement::Local => {}
                    Placement::Replicated => prop_assert!(false, "pack never replicates"),
                }
            }
            for (used, budget) in core.iter().zip(&b.cores) { prop_assert!(*used <= budget.private_bytes); }
            for (used, budget) in dom.iter().zip(&b.domains) { prop_assert!(*used <= budget.shared_bytes); }
            // First fit leaves nothing local that would have fitted somewhere.
            let free = b.cores.iter().map(|c| c.private_bytes - core[c.cpu.0])
                .chain(b.domains.iter().enumerate().map(|(d, x)| x.shared_bytes - dom[d])).max().unwrap_or(0);
            for (item, p) in items.iter().zip(&placed) {
                if *p == Placement::Local { prop_assert!(item.bytes > free); }
            }
        }

        #[test]
        fn placer_keeps_budgets_and_single_owners(
            objects in prop::collection::vec((1u64..200_000, any::<bool>(), prop::option::of(0u64..4)), 1..60),
            periods in prop::collection::vec(
                (prop::collection::vec((0u64..50, any::<bool>(), 1u64..10_000, 0u64..5), 60), prop::collection::vec(0u64..100, 4)),
                1..25),
        ) {
            let m = machine(2, 2, 256 << 10, 1 << 20, &[1.0, 1.0, 0.5, 0.5]);
            let mut p = Placer::for_machine(&m, &all(&m), PlacerConfig::default()).unwrap();
            for &(bytes, replicable, group) in &objects {
                p.register(ObjectHints { bytes, replicable, group });
            }
            for (per_object, busy) in periods {
                let samples: Vec<ObjectSample> = per_object.iter().take(p.len()).enumerate().map(|(i, &(ops, _, cost, writes))| {
                    let writes = writes.min(ops);
                    if p.placement(ObjectId(i)).is_scheduled() {
                        ObjectSample { owner_ops: ops, owner_ns: ops * cost / 3, hop_ns: ops * 300, writes, ..Default::default() }
                    } else {
                        ObjectSample { local_ops: ops, local_ns: ops * cost, writes, ..Default::default() }
                    }
                }).collect();
                let cores: Vec<CoreSample> = busy.iter().map(|&b| CoreSample { busy_ns: b, elapsed_ns: 100 }).collect();
                let before = p.placements();
                let moves = p.end_period(&samples, &cores);
                check_invariants(&p)?;
                // Moves describe exactly the changes.
                let mut after = before.clone();
                for mv in &moves { prop_assert_eq!(after[mv.object.0], mv.from); after[mv.object.0] = mv.to; }
                prop_assert_eq!(after, p.placements());
            }
        }
    }
}
