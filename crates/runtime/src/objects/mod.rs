//! O² object scheduling: an operation on an object runs on the core whose cache holds it.
//!
//! [`Objects`] is a registry of objects. [`Objects::run`] (a write) and [`Objects::read`] run an
//! operation where the object lives:
//!
//! ```text
//!  caller on cpu0            route (policy::objects::Placement)          runs on
//!  run(&dir7, lookup) ──►  Local / Replicated ─────────────────────────► cpu0 (here)
//!                          Core { owner: cpu1 } ── move to cpu1 ───────► cpu1, stays there
//!                          Domain { domain, home } ─ caller outside? ──► home, else here
//! ```
//!
//! **Moving.** Inside a corehop task the operation hops to the owner's CPU and, once it is
//! done, back to where the task came from (CoreTime's `ct_end` hands the thread back to its
//! core), so tasks stay spread over the CPUs as they were. The registry must then be built on
//! the runtime's machine: it hops with the machine's CPU ids. A plain thread moves itself with
//! `sched_setaffinity` (the paper's V1) and restores its previous affinity afterwards. If the
//! way back fails (the runtime is shutting down), the caller stays on the owner's CPU. The
//! operation itself runs in a [`no_hop_zone`](crate::no_hop_zone): it cannot hop while it
//! holds the object's lock. Its end is a scheduling point ([`yield_now`](crate::yield_now)):
//! tasks that hopped in to use this CPU's objects run before the caller's next operation.
//!
//! **Exclusion.** Each object has a lock taken on the core the operation runs on: two
//! operations on one object never run at the same time, on any cores, except reads of an
//! object the policy replicated (declared [`ObjectHints::replicable`]), which share the lock.
//!
//! **Monitoring.** Every operation is timed with the TSC clock ([`sys::now_ns`]): how long it ran,
//! where (locally or on the owner) and how long the move took; each core's busy time is the sum
//! of the operations it ran. Every [`ObjectsConfig::period`] the first operation to notice
//! hands these samples to the pure [`Placer`], which packs expensive objects into cache budgets,
//! judges trials and rebalances; its moves update the routes.
//!
//! # Examples
//! ```
//! use corehop_runtime::objects::{Objects, ObjectsConfig};
//! // Any machine description works; the runtime normally uses the discovered host.
//! let machine = corehop_topology::presets::by_name("switch-cc").unwrap();
//! let cpus: Vec<_> = machine.cpus().iter().map(|c| c.id).collect();
//! let objects = Objects::new(&machine, &cpus, ObjectsConfig::default()).unwrap();
//! objects.register("counter", 0u64, 8).unwrap();
//! objects.run(&"counter", |n| *n += 1).unwrap();
//! assert_eq!(objects.read(&"counter", |n| *n).unwrap(), 1);
//! ```
//!
//! An operation may run on another CPU's thread, and reads of a replicated object on several at
//! once, so the values must be `Send + Sync`: a registry of `Rc`s does not build.
//!
//! ```compile_fail,E0599
//! use corehop_runtime::objects::{Objects, ObjectsConfig};
//! let machine = corehop_topology::presets::by_name("switch-cc").unwrap();
//! let cpus: Vec<_> = machine.cpus().iter().map(|c| c.id).collect();
//! let objects = Objects::<&str, std::rc::Rc<u64>>::new(&machine, &cpus, ObjectsConfig::default());
//! ```
use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::panic;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use corehop_policy::objects::{CoreSample, Move, ObjectSample, Placer, PlacerConfig};
pub use corehop_policy::objects::{ObjectHints, ObjectId, Placement, PlacementError, Via};
use corehop_policy::payoff::{ArmSampler, PayoffConfig, STAY};
use corehop_topology::{CpuId, Machine, OsCpu};
use crossbeam_utils::CachePadded;

use crate::sys;

mod batch;
mod lock;
pub use batch::MAX_GROUP_OPS;
pub use lock::{LockedCell, OpLock};

/// Every object of a registry, by id.
type Table<T> = Arc<RwLock<Vec<Handle<T>>>>;

/// Errors of the object registry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectError {
    /// The placement policy refused (bad budgets, an unknown CPU, …).
    #[error(transparent)]
    Policy(#[from] PlacementError),
    /// The payoff gate's settings cannot work.
    #[error(transparent)]
    Payoff(#[from] corehop_policy::payoff::PayoffError),
    /// The key is taken, by this object.
    #[error("an object is already registered under this key (as {0:?})")]
    Duplicate(ObjectId),
    /// No object under this key.
    #[error("no object is registered under this key")]
    UnknownKey,
    /// A plain thread could not be moved to the object's CPU.
    #[error("cannot move the calling thread to {cpu} (os cpu {os_id}): {source}")]
    Migrate {
        /// Where the object lives.
        cpu: CpuId,
        /// Its kernel CPU number.
        os_id: OsCpu,
        /// What `sched_setaffinity` said.
        source: std::io::Error,
    },
    /// A task could not hop to the object's CPU.
    #[error("cannot hop the calling task to {cpu}: {source}")]
    Hop {
        /// Where the object lives.
        cpu: CpuId,
        /// Why the hop failed.
        source: crate::Error,
    },
}

/// Settings of an [`Objects`] registry.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectsConfig {
    /// The placement policy's knobs.
    pub placer: PlacerConfig,
    /// How often placement is revisited (default 10 ms).
    pub period: Duration,
    /// Whether the placer's routes are followed at all is itself a move that must pay: with
    /// `Some`, a [`corehop_policy::payoff`] sampler weighs "every operation where its caller
    /// is" against "the placer's routes" by the operations all CPUs complete per period, and
    /// follows the routes only while they win. `None`: always follow them. Objects pinned
    /// with [`Objects::pin`] always run on their CPU.
    pub payoff: Option<PayoffConfig>,
    /// A request of [`Objects::read_batch`] or [`Objects::run_batch`] that its CPU has not
    /// started this long after it was sent is taken back and run by its caller (default
    /// 200 µs): that CPU is not running (a host deschedules a vCPU for milliseconds at a
    /// time), and the caller would otherwise wait for it with nothing else to do. The
    /// object's lock still keeps the operations exclusive. `None`: always wait.
    pub take_back_after: Option<Duration>,
}

impl Default for ObjectsConfig {
    fn default() -> Self {
        ObjectsConfig {
            placer: PlacerConfig::default(),
            period: Duration::from_millis(10),
            payoff: Some(PayoffConfig::default()),
            take_back_after: Some(Duration::from_micros(200)),
        }
    }
}

/// One period's counters of an object, updated by the operation that holds its lock. A line of
/// their own: see [`Object`].
#[derive(Debug, Default)]
#[repr(align(64))]
struct Counters {
    local_ops: AtomicU64,
    local_ns: AtomicU64,
    owner_ops: AtomicU64,
    owner_ns: AtomicU64,
    hop_ns: AtomicU64,
    batch_ops: AtomicU64,
    batch_hop_ns: AtomicU64,
    writes: AtomicU64,
}

impl Counters {
    /// This period's counters, zeroed for the next. An object no sampled operation reached
    /// (most of them, with one operation in 128 sampled) is only read: a swap writes its line,
    /// which the next operation on another CPU then misses.
    fn take(&self) -> ObjectSample {
        let untouched = |a: &AtomicU64| a.load(Ordering::Relaxed) == 0;
        // Every other counter moves only together with one of these (`account`); an operation
        // counted between these loads and the return counts in the next period, as one
        // counted just after a swap would.
        if untouched(&self.local_ops) && untouched(&self.owner_ops) && untouched(&self.writes) {
            return ObjectSample::default();
        }
        let t = |a: &AtomicU64| a.swap(0, Ordering::Relaxed);
        ObjectSample {
            local_ops: t(&self.local_ops),
            local_ns: t(&self.local_ns),
            owner_ops: t(&self.owner_ops),
            owner_ns: t(&self.owner_ns),
            hop_ns: t(&self.hop_ns),
            batch_ops: t(&self.batch_ops),
            batch_hop_ns: t(&self.batch_hop_ns),
            writes: t(&self.writes),
        }
    }
}

/// A registered object: its value, route and counters. Reached through a [`Handle`].
///
/// Three cache lines after the `Arc`'s reference counts: the lock, which every operation
/// writes; then the value (for a value that is a pointer, as a buffer is), the route and the
/// rest, which operations only read; then the counters, written by one operation in 16 (in 128
/// while all stay). With the value and the route on the lock's line, an operation waited for
/// that line to come from the CPU that operated last before it could read them: O² ran at
/// 0.94-0.96 of plain threads over 3M of directories, against 0.96-0.98 apart, and as fast
/// past the caches (docs/performance.md, "Twenty-ninth session"). The lock's line and the
/// value's are one 128-byte pair, which the L2's adjacent-line prefetcher fetches together (as
/// `CachePadded` pads to 128 bytes on x86-64): aligned to 64 bytes, each shared its pair with
/// a line the operation does not read (the reference counts, the counters), and O² ran 1.5-2.5
/// % slower from 1M to 32M of directories (docs/performance.md, "Fifty-third session").
#[derive(Debug)]
#[repr(C, align(128))]
pub struct Object<T> {
    cell: LockedCell<T>,
    route: AtomicU64,
    id: ObjectId,
    /// Longer operations than this were preempted or blocked, not slowed by cache misses.
    preempted_ns: u64,
    counters: Counters,
}

/// A handle to a registered object: skips the key lookup on hot paths. Cheap to clone (an
/// [`Arc`]), and it derefs to the [`Object`].
///
/// It also carries where the object's data starts, when the registry was told how to find it
/// ([`Objects::with_data_address`]): an operation asks for that data, and for its object's lock
/// line, first, while the object's other lines are still on their way.
#[derive(Debug)]
pub struct Handle<T> {
    object: Arc<Object<T>>,
    /// The address of the value's data at registration, 0 if unknown: only ever prefetched,
    /// never read through, so a stale one costs a wasted fetch.
    data: usize,
}

impl<T> Clone for Handle<T> {
    fn clone(&self) -> Handle<T> {
        Handle { object: Arc::clone(&self.object), data: self.data }
    }
}

impl<T> std::ops::Deref for Handle<T> {
    type Target = Object<T>;

    fn deref(&self) -> &Object<T> {
        &self.object
    }
}

impl<T> Handle<T> {
    /// Where the object's data started at registration, if the registry was told how to find
    /// it ([`Objects::with_data_address`]): what each operation prefetches.
    pub fn data_address(&self) -> Option<*const u8> {
        (self.data != 0).then_some(self.data as *const u8)
    }

    /// Starts fetching the object's lock line, for the write that takes the lock, its value's
    /// line, and its data, if its address is known.
    #[inline(always)]
    pub(crate) fn prefetch(&self) {
        let cell = &self.object.cell;
        sys::prefetch_for_write(cell.lock() as *const OpLock as usize);
        // The value's line, read once the lock is taken.
        sys::prefetch_for_read(cell.value_address());
        if self.data != 0 {
            sys::prefetch_for_read(self.data);
        }
    }
}

impl<T> Object<T> {
    /// The registry's id of this object (dense, in registration order).
    pub fn id(&self) -> ObjectId {
        self.id
    }

    /// The object's lock, for operations whose data is not in the registry (the C API).
    pub fn lock(&self) -> &OpLock {
        self.cell.lock()
    }
}

/// Route codes: placement packed in a u64 so operations read it with one load.
mod route {
    use super::Placement;

    const LOCAL: u64 = 0;
    const REPLICATED: u64 = 1;
    const CORE: u64 = 2;
    const DOMAIN: u64 = 3;
    /// Set on the route of an object pinned by the caller: followed whatever the sampler says.
    pub const PINNED: u64 = 1 << 63;
    /// Set on the route of an object whose saving pays only for batched moves
    /// ([`Via::Batches`](super::Via::Batches)): an operation issued alone runs where it is.
    pub const BATCHES: u64 = 1 << 62;
    const FLAGS: u64 = PINNED | BATCHES;

    /// `index` maps a CPU to its index in the registry's CPU list; `at_home` routes every
    /// operation on a domain-placed object to its home.
    pub fn encode(
        p: Placement,
        via: super::Via,
        at_home: bool,
        index: impl Fn(corehop_topology::CpuId) -> usize,
    ) -> u64 {
        let flag = if via == super::Via::Batches && p.is_scheduled() { BATCHES } else { 0 };
        flag | match p {
            Placement::Local => LOCAL,
            Placement::Replicated => REPLICATED,
            Placement::Core { owner } => CORE | (index(owner) as u64) << 2,
            Placement::Domain { home, .. } if at_home => CORE | (index(home) as u64) << 2,
            Placement::Domain { domain, home } => DOMAIN | (index(home) as u64) << 2 | (domain as u64) << 32,
        }
    }

    /// Where an operation from a caller (CPU index, domain) runs: `None` = where it is.
    pub fn target(code: u64, caller_domain: Option<usize>) -> Option<usize> {
        let at = ((code >> 2) & 0x3FFF_FFFF) as usize;
        match code & 3 {
            CORE => Some(at),
            DOMAIN if caller_domain != Some(((code & !FLAGS) >> 32) as usize) => Some(at),
            _ => None,
        }
    }

    pub fn is_replicated(code: u64) -> bool {
        code == REPLICATED
    }

    /// Whether every caller runs the operation where it is (local or replicated objects).
    pub fn runs_anywhere(code: u64) -> bool {
        code == LOCAL || code == REPLICATED
    }

    /// The route an operation follows (`batched`: one of a batch): the object's own, or
    /// local while the sampler finds that following routes does not pay (unless the caller
    /// pinned the object), and for an operation issued alone on an object routed for
    /// batches only.
    pub fn followed(code: u64, moving: bool, batched: bool) -> u64 {
        if code & BATCHES != 0 && !batched {
            LOCAL
        } else if moving || code & PINNED != 0 || code == REPLICATED {
            code
        } else {
            LOCAL
        }
    }
}

/// One operation in this many is timed and counted (with this weight) for the placer. Timing
/// every operation costs two clock reads and a few atomic adds on lines that every CPU's
/// operations on the object share: more than an operation that stays where it is can afford
/// (docs/performance.md, "O² monitoring").
const SAMPLE_EVERY: u32 = 16;
/// While no route is followed (nothing is placed, or the gate keeps every object where its
/// caller is), one operation in this many: the samples only watch for a saving worth moving
/// for, and timing one in 16 cost lookups of 0.3–0.6 µs several percent against plain threads.
const SAMPLE_EVERY_STAYING: u32 = 128;

thread_local! {
    /// Operations until this thread's next sampled one.
    static UNTIL_SAMPLE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether the caller's next operation is sampled: a task counts in its own context, which
/// the operation looks up anyway for its no-hop zone, and a plain thread in a thread-local.
/// Read once per operation, before it can hop (a thread-local's address must not be reused
/// after a hop). A second thread-local look-up per operation cost 40 ns lookups a few per cent
/// (docs/performance.md, "Twenty-ninth session").
#[inline(always)]
fn sample_now(task: Option<&crate::context::TaskCtx>, every: u32) -> bool {
    match task {
        Some(task) => count_down(&task.until_sample, every),
        None => sample_now_on_thread(every),
    }
}

#[inline(never)]
fn sample_now_on_thread(every: u32) -> bool {
    UNTIL_SAMPLE.with(|left| count_down(left, every))
}

/// Counts `left` down; at 0 it starts again from `every - 1` and says so.
#[inline(always)]
fn count_down(left: &std::cell::Cell<u32>, every: u32) -> bool {
    match left.get() {
        0 => {
            left.set(every - 1);
            true
        }
        n => {
            left.set(n - 1);
            false
        }
    }
}

/// The calling thread's sampling countdown, taken out for a batch of operations (one
/// thread-local access for the batch instead of one per operation) and put back after it.
/// Taken and put back on the same thread: a batch never hops.
struct Countdown {
    left: u32,
    every: u32,
}

impl Countdown {
    /// The countdown, sampling one operation in `every` from now on.
    fn take(every: u32) -> Countdown {
        Countdown { left: UNTIL_SAMPLE.with(|left| left.get()), every }
    }

    /// What a sampled operation stands for: the operations one sample is taken of.
    fn weight(&self) -> u64 {
        u64::from(self.every)
    }

    /// Whether the next operation is sampled.
    fn next(&mut self) -> bool {
        count_down(std::cell::Cell::from_mut(&mut self.left), self.every)
    }

    fn put_back(self) {
        UNTIL_SAMPLE.with(|left| left.set(self.left));
    }
}

#[derive(Debug, Clone)]
struct CpuSlot {
    id: CpuId,
    os_id: OsCpu,
    domain: usize,
}

/// A registry of objects whose operations run where the objects live. Share it with `Arc`.
#[derive(Debug)]
pub struct Objects<K, T> {
    cpus: Vec<CpuSlot>,
    /// Kernel CPU number → index into `cpus`.
    by_os_id: HashMap<OsCpu, usize>,
    keys: RwLock<HashMap<K, Handle<T>>>,
    /// Every object, by id; shared with the batches sent to other CPUs ([`batch`]).
    all: Table<T>,
    placer: Mutex<Placer>,
    busy_ns: Vec<CachePadded<AtomicU64>>,
    /// The cheapest move seen (ns): a move that took much longer waited for its target, which
    /// costs the target no work, so the placer is told at most a few times this.
    cheapest_move_ns: AtomicU64,
    /// [`PlacerConfig::domain_ops_at_home`].
    domain_ops_at_home: bool,
    /// Objects routed to an owner now: while there are none, no task can be waiting to run an
    /// operation here, and operations skip their scheduling point.
    scheduled: AtomicU64,
    /// Objects the placer replicated: while there are none, an operation need not read its
    /// object's route to know whether to read it under a shared hold.
    replicated: AtomicU64,
    /// Objects pinned with [`Objects::pin`]: their routes are followed whatever the gate says.
    pinned: AtomicU64,
    /// [`Objects::all_stay`] and nothing replicated, in one word for the operations that
    /// stay (see [`Objects::operate`]); set under the placer's lock by [`Objects::set_all_here`].
    all_here: AtomicBool,
    /// The period the payoff sampler asks for (an epoch; its trials are shorter).
    period_ns: AtomicU64,
    /// The configured period.
    base_period_ns: u64,
    /// The period in force: `period_ns`, or [`PASS_SHARE`] times the last end-of-period pass
    /// if that is longer (the pass is O(objects)).
    period_now_ns: AtomicU64,
    period_start: AtomicU64,
    /// End-of-period passes run so far.
    passes: AtomicU64,
    /// Of those, the ones after which operations followed the placer's routes.
    passes_following: AtomicU64,
    /// Whether operations follow the placer's routes now (the sampler's arm 1).
    moving: AtomicBool,
    /// Weighs following the routes against running everything where it is called.
    gate: Mutex<Option<ArmSampler>>,
    /// [`ObjectsConfig::take_back_after`], in ns.
    take_back_ns: Option<u64>,
    /// Where a value's data starts ([`Objects::with_data_address`]).
    data_address: Option<fn(&T) -> *const u8>,
}

/// An end-of-period pass takes at most about 1/PASS_SHARE of the time: the next period lasts
/// at least PASS_SHARE times as long as the last pass did. The pass visits every object, so
/// without this an operation's cost grew with the object count once a pass outlasted the
/// period (every operation then ended a period). The pass runs on a CPU that then does no
/// operations, and a tenth of one CPU was most of what O² lost to plain threads over many
/// objects: a hundredth keeps monitoring within the margin a policy may lose to not moving.
/// Over many objects each gets few samples a period, so a longer one loses little.
const PASS_SHARE: u64 = 100;

/// What an operation did, to account for it, and how its caller gets back.
struct Ran {
    index: Option<usize>,
    routed: bool,
    /// Moved in a batch: `hop_ns` is its share of the batch's cost.
    batched: bool,
    hop_ns: u64,
    back: Back,
}

/// Where the caller returns after an operation that ran elsewhere.
#[derive(Debug)]
enum Back {
    Stay,
    /// A task hops back to this worker (the one it came from: the same OS thread).
    Hop(usize),
    /// A plain thread restores this affinity (kernel CPU numbers).
    Affinity(Vec<OsCpu>),
}

/// An operation started with [`Objects::start`] and not yet ended (the C API's `ct_start`).
#[derive(Debug)]
#[must_use = "an operation holds its object's lock until it is ended"]
pub struct Operation<T> {
    object: Handle<T>,
    index: Option<usize>,
    routed: bool,
    hop_ns: u64,
    back: Back,
    started_ns: u64,
}

// `T: Send` because an operation may take `&mut T` on another CPU's thread, `T: Sync` because
// the reads of a replicated object take `&T` on several at once.
impl<K: Hash + Eq, T: Send + Sync> Objects<K, T> {
    /// A registry placing objects on `cpus` of `machine` (budgets from its caches).
    pub fn new(
        machine: &Machine,
        cpus: &[CpuId],
        config: ObjectsConfig,
    ) -> Result<Objects<K, T>, ObjectError> {
        let domain_ops_at_home = config.placer.domain_ops_at_home;
        let placer = Placer::for_machine(machine, cpus, config.placer)?;
        let slots: Vec<CpuSlot> = placer
            .budgets()
            .cores
            .iter()
            .map(|c| CpuSlot { id: c.cpu, os_id: machine.cpus[c.cpu.0].os_id, domain: c.domain })
            .collect();
        let by_os_id = slots.iter().enumerate().map(|(i, s)| (s.os_id, i)).collect();
        Ok(Objects {
            busy_ns: slots.iter().map(|_| CachePadded::new(AtomicU64::new(0))).collect(),
            cpus: slots,
            by_os_id,
            keys: RwLock::new(HashMap::new()),
            all: Arc::new(RwLock::new(Vec::new())),
            placer: Mutex::new(placer),
            cheapest_move_ns: AtomicU64::new(u64::MAX),
            domain_ops_at_home,
            scheduled: AtomicU64::new(0),
            replicated: AtomicU64::new(0),
            pinned: AtomicU64::new(0),
            all_here: AtomicBool::new(true),
            period_ns: AtomicU64::new(config.period.as_nanos() as u64),
            base_period_ns: config.period.as_nanos() as u64,
            period_now_ns: AtomicU64::new(config.period.as_nanos() as u64),
            period_start: AtomicU64::new(sys::now_ns()),
            passes: AtomicU64::new(0),
            passes_following: AtomicU64::new(0),
            moving: AtomicBool::new(config.payoff.is_none()),
            gate: Mutex::new(config.payoff.map(|c| ArmSampler::new(2, c)).transpose()?),
            take_back_ns: config.take_back_after.map(|d| d.as_nanos().min(u128::from(u64::MAX)) as u64),
            data_address: None,
        })
    }

    /// Tells the registry where a value's data starts, for values that point to it (a buffer,
    /// a table behind a `Box` or `Vec`): objects registered from now on have handles that
    /// carry that address, and each operation requests the data's first line before anything
    /// else. Otherwise the data's address is known only once the object's own line has come
    /// (often from the CPU that used the object last), and the two fetches, which plain
    /// threads overlap, follow one another (docs/performance.md, "Twenty-seventh session").
    ///
    /// `address` runs once per object, at registration, on the value as stored: a write that
    /// moves the data later leaves a stale address, which costs a wasted fetch, nothing else.
    pub fn with_data_address(mut self, address: fn(&T) -> *const u8) -> Objects<K, T> {
        self.data_address = Some(address);
        self
    }

    /// Registers `value` under `key`; `bytes` is how much its operations touch.
    pub fn register(&self, key: K, value: T, bytes: u64) -> Result<Handle<T>, ObjectError> {
        self.register_with(key, value, ObjectHints { bytes, ..ObjectHints::default() })
    }

    /// Registers `value` under `key` with full hints (group, replicable).
    pub fn register_with(&self, key: K, value: T, hints: ObjectHints) -> Result<Handle<T>, ObjectError> {
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        if let Some(existing) = keys.get(&key) {
            return Err(ObjectError::Duplicate(existing.id()));
        }
        let bytes_of = hints.bytes;
        let id = self.placer.lock().unwrap_or_else(|e| e.into_inner()).register(hints);
        let object = Arc::new(Object {
            route: AtomicU64::new(0),
            cell: LockedCell::new(value),
            id,
            preempted_ns: preempted_after(bytes_of),
            counters: Counters::default(),
        });
        // Not shared yet: no operation can hold the lock.
        let data = self.data_address.map_or(0, |address| object.cell.exclusive(|v| address(v) as usize));
        let handle = Handle { object, data };
        self.all.write().unwrap_or_else(|e| e.into_inner()).push(handle.clone());
        keys.insert(key, handle.clone());
        Ok(handle)
    }

    /// The handle of the object under `key`.
    pub fn handle<Q>(&self, key: &Q) -> Option<Handle<T>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).get(key).cloned()
    }

    /// Runs a (writing) operation on the object under `key`, where it lives.
    pub fn run<Q, R: Send>(&self, key: &Q, op: impl FnOnce(&mut T) -> R + Send) -> Result<R, ObjectError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let object = self.handle(key).ok_or(ObjectError::UnknownKey)?;
        self.run_handle(&object, op)
    }

    /// Runs a read-only operation on the object under `key`, where it lives (on every core, if
    /// the object is replicated).
    pub fn read<Q, R: Send>(&self, key: &Q, op: impl FnOnce(&T) -> R + Send) -> Result<R, ObjectError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let object = self.handle(key).ok_or(ObjectError::UnknownKey)?;
        self.read_handle(&object, op)
    }

    /// [`Objects::run`] through a handle.
    pub fn run_handle<R: Send>(
        &self,
        object: &Handle<T>,
        op: impl FnOnce(&mut T) -> R + Send,
    ) -> Result<R, ObjectError> {
        self.operate(object, true, |cell, _| cell.exclusive(op))
    }

    /// [`Objects::read`] through a handle.
    pub fn read_handle<R: Send>(
        &self,
        object: &Handle<T>,
        op: impl FnOnce(&T) -> R + Send,
    ) -> Result<R, ObjectError> {
        self.operate(
            object,
            false,
            |cell, replicated| {
                if replicated {
                    cell.shared(op)
                } else {
                    cell.exclusive(|v| op(v))
                }
            },
        )
    }

    /// Runs `op` where `object` lives and comes back, telling it whether the object is
    /// replicated. The way back is taken before the panic of a failed `op` resumes: the
    /// caller's frames never run or unwind on another thread.
    #[inline(always)]
    fn operate<R: Send>(
        &self,
        object: &Handle<T>,
        write: bool,
        op: impl FnOnce(&LockedCell<T>, bool) -> R + Send,
    ) -> Result<R, ObjectError> {
        // Before anything reads the object's lines (see `Handle`).
        object.prefetch();
        let here = self.all_here.load(Ordering::Relaxed);
        let every = if here { SAMPLE_EVERY_STAYING } else { self.sample_every() };
        // The task's context lives on its stack and goes where it goes: valid after a hop.
        let task = crate::context::task();
        let sampled = sample_now(task, every);
        if !sampled && here {
            // No route is followed and nothing is replicated: the operation runs here, reads
            // no route (the lock's line is the first of the object it waits for), and is no
            // scheduling point, since no task follows a route here (one that moved before
            // the routes stopped gets in at the next sampled operation). This path is kept
            // apart from the rest, which is not inlined: in one function with it, hashed
            // lookups through it ran at 0.7 of plain threads (docs/performance.md).
            let _zone = OpZone::enter_in(task);
            return Ok(op(&object.cell, false));
        }
        self.operate_routed(object, write, task, sampled.then_some(every), op)
    }

    /// [`Objects::operate`] for an operation that is sampled (`weight`: the operations it
    /// stands for), or may follow a route, or may read a replica.
    #[inline(never)]
    fn operate_routed<R: Send>(
        &self,
        object: &Handle<T>,
        write: bool,
        task: Option<&crate::context::TaskCtx>,
        weight: Option<u32>,
        op: impl FnOnce(&LockedCell<T>, bool) -> R + Send,
    ) -> Result<R, ObjectError> {
        let code = object.route.load(Ordering::Acquire);
        let replicated = route::is_replicated(code);
        if weight.is_none()
            && route::runs_anywhere(route::followed(code, self.moving.load(Ordering::Relaxed), false))
        {
            // Stays where it is and is not sampled: nothing to measure, nothing to undo.
            let _zone = OpZone::enter_in(task);
            let out = op(&object.cell, replicated);
            self.let_others_run();
            return Ok(out);
        }
        let mut ran = self.go(object, true)?;
        let t0 = sys::now_ns();
        let out = {
            let _zone = crate::no_hop_zone();
            panic::catch_unwind(panic::AssertUnwindSafe(|| op(&object.cell, replicated)))
        };
        let t1 = sys::now_ns();
        ran.hop_ns += self.come_back(std::mem::replace(&mut ran.back, Back::Stay));
        let out = out.unwrap_or_else(|payload| panic::resume_unwind(payload));
        self.account(object, &ran, t0, t1, write, weight.map_or(0, u64::from));
        self.let_others_run();
        Ok(out)
    }

    /// Starts an operation whose code runs outside a closure (the C API): moves the calling
    /// thread where the object lives and takes its lock exclusively. End it with
    /// [`Objects::end`] on the same thread.
    ///
    /// Inside a corehop task the operation runs where the task is: moving it would return to
    /// the caller on another OS thread (see `corehop_runtime::hop`). Tasks use
    /// [`Objects::run`], which comes back before the caller continues.
    pub fn start(&self, object: &Handle<T>) -> Result<Operation<T>, ObjectError> {
        let ran = self.go(object, false)?;
        object.lock().lock_exclusive();
        Ok(Operation {
            object: object.clone(),
            index: ran.index,
            routed: ran.routed,
            hop_ns: ran.hop_ns,
            back: ran.back,
            started_ns: sys::now_ns(),
        })
    }

    /// Ends an operation: releases the lock, moves the caller back and accounts for it.
    pub fn end(&self, op: Operation<T>) {
        let end = sys::now_ns();
        // SAFETY: an `Operation` is made only by `start`, which took this object's lock
        // exclusively, and is consumed here, so the hold is given back once, by its taker. It
        // gives no access to the value, so no reference reached under the hold outlives it.
        unsafe { op.object.lock().unlock_exclusive() };
        let hop_ns = op.hop_ns + self.come_back(op.back);
        let ran = Ran { index: op.index, routed: op.routed, batched: false, hop_ns, back: Back::Stay };
        self.account(&op.object, &ran, op.started_ns, end, true, 1);
    }

    /// Where the object under `key` lives now.
    pub fn placement<Q>(&self, key: &Q) -> Option<Placement>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let object = self.handle(key)?;
        Some(self.placer.lock().unwrap_or_else(|e| e.into_inner()).placement(object.id))
    }

    /// Pins the object under `key` to `cpu` for good (`None`: give it back to the policy).
    pub fn pin<Q>(&self, key: &Q, cpu: Option<CpuId>) -> Result<(), ObjectError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.pin_via(key, cpu, Via::Any)
    }

    /// [`Objects::pin`], for the operations `via` says: with [`Via::Batches`], only those of
    /// [`Objects::read_batch`] and [`Objects::run_batch`] go to `cpu`, and an operation
    /// issued alone runs where it is called.
    pub fn pin_via<Q>(&self, key: &Q, cpu: Option<CpuId>, via: Via) -> Result<(), ObjectError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let object = self.handle(key).ok_or(ObjectError::UnknownKey)?;
        let mut placer = self.placer.lock().unwrap_or_else(|e| e.into_inner());
        placer.pin(object.id, cpu)?;
        self.count_scheduled(&placer);
        let placement = placer.placement(object.id);
        let pinned = if cpu.is_some() { route::PINNED } else { 0 };
        let was = object.route.load(Ordering::Relaxed) & route::PINNED;
        match (was, pinned) {
            (0, route::PINNED) => self.pinned.fetch_add(1, Ordering::Relaxed),
            (route::PINNED, 0) => self.pinned.fetch_sub(1, Ordering::Relaxed),
            _ => 0,
        };
        self.set_all_here();
        object.route.store(
            route::encode(placement, via, self.domain_ops_at_home, |c| self.index_of(c)) | pinned,
            Ordering::Release,
        );
        Ok(())
    }

    /// The CPUs objects are placed on.
    pub fn cpus(&self) -> Vec<CpuId> {
        self.cpus.iter().map(|c| c.id).collect()
    }

    /// Number of registered objects.
    pub fn len(&self) -> usize {
        self.all.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no object is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many objects are placed each way: (local, on a core, in a domain, replicated).
    pub fn census(&self) -> Census {
        let placer = self.placer.lock().unwrap_or_else(|e| e.into_inner());
        let mut c = Census::default();
        for p in placer.placements() {
            match p {
                Placement::Local => c.local += 1,
                Placement::Core { .. } => c.core += 1,
                Placement::Domain { .. } => c.domain += 1,
                Placement::Replicated => c.replicated += 1,
            }
        }
        c
    }

    /// Ends the current monitoring period now and applies the policy's moves.
    pub fn end_period(&self) -> Vec<Move> {
        let mut placer = self.placer.lock().unwrap_or_else(|e| e.into_inner());
        self.end_period_locked(&mut placer, sys::now_ns())
    }

    fn count_scheduled(&self, placer: &Placer) {
        let placements = placer.placements();
        let n = placements.iter().filter(|p| p.is_scheduled()).count();
        self.scheduled.store(n as u64, Ordering::Relaxed);
        let replicated = placements.iter().filter(|p| matches!(p, Placement::Replicated)).count();
        self.replicated.store(replicated as u64, Ordering::Relaxed);
        self.set_all_here();
    }

    /// Sets [`Objects::all_here`] from what it sums up. Called, with the placer locked, after
    /// every change to those: the placer's counts, the gate's arm, a pin.
    fn set_all_here(&self) {
        let here = self.all_stay() && self.replicated.load(Ordering::Relaxed) == 0;
        self.all_here.store(here, Ordering::Relaxed);
    }

    fn index_of(&self, cpu: CpuId) -> usize {
        self.cpus.iter().position(|c| c.id == cpu).expect("the placer only places on the registry's CPUs")
    }

    /// The calling thread's CPU index, if it is one of the registry's CPUs.
    fn here(&self) -> Option<usize> {
        sys::current_os_cpu().ok().and_then(|os| self.by_os_id.get(&os).copied())
    }

    /// Moves the caller to where `object`'s operations run. A task moves only if `may_hop`:
    /// then its caller must come back before its own frames run again.
    fn go(&self, object: &Object<T>, may_hop: bool) -> Result<Ran, ObjectError> {
        let here = self.here();
        let code =
            route::followed(object.route.load(Ordering::Acquire), self.moving.load(Ordering::Relaxed), false);
        let Some(target) = route::target(code, here.map(|i| self.cpus[i].domain)) else {
            return Ok(Ran { index: here, routed: false, batched: false, hop_ns: 0, back: Back::Stay });
        };
        if here == Some(target) {
            return Ok(Ran { index: here, routed: true, batched: false, hop_ns: 0, back: Back::Stay });
        }
        let t0 = sys::now_ns();
        let slot = &self.cpus[target];
        let back = match crate::try_current_cpu().filter(|_| crate::in_task()) {
            Some(_) if !may_hop => {
                return Ok(Ran { index: here, routed: false, batched: false, hop_ns: 0, back: Back::Stay })
            }
            Some(_) => {
                let back =
                    crate::task::go(slot.id).map_err(|source| ObjectError::Hop { cpu: slot.id, source })?;
                Back::Hop(back)
            }
            None => {
                let migrate = |source| ObjectError::Migrate { cpu: slot.id, os_id: slot.os_id, source };
                let saved = sys::affinity().map_err(migrate)?;
                sys::pin_current_thread(slot.os_id).map_err(migrate)?;
                Back::Affinity(saved)
            }
        };
        let hop_ns = self.move_cost(sys::now_ns() - t0);
        Ok(Ran { index: Some(target), routed: true, batched: false, hop_ns, back })
    }

    /// One operation in how many is sampled: fewer while every operation stays where it is
    /// called (no object routed, or the gate keeps them all here), when samples only watch
    /// for a saving worth moving for.
    fn sample_every(&self) -> u32 {
        if self.all_stay() {
            SAMPLE_EVERY_STAYING
        } else {
            SAMPLE_EVERY
        }
    }

    /// Whether every operation runs where it is called now: no object is routed anywhere, or
    /// the gate keeps them all where they are called and none is pinned.
    fn all_stay(&self) -> bool {
        self.scheduled.load(Ordering::Relaxed) == 0
            || (!self.moving.load(Ordering::Relaxed) && self.pinned.load(Ordering::Relaxed) == 0)
    }

    /// An operation's end is a scheduling point while objects are placed: a task that hopped
    /// here to operate on this CPU's objects, or one of this CPU's coming back from such a
    /// move, runs before the caller's next operation (a plain thread: nothing to do). Only
    /// for them: yielding to this worker's other tasks after every operation, as this did
    /// while routes were followed, cost a task switch per operation for nothing
    /// (docs/performance.md, "Twenty-seventh session").
    #[inline]
    fn let_others_run(&self) {
        if self.scheduled.load(Ordering::Relaxed) > 0 && crate::task::visitors_waiting() {
            // Refused only inside a no-hop zone or while shutting down: then simply go on.
            let _ = crate::yield_now();
        }
    }

    /// Moves the caller back after an operation; returns what the move cost.
    fn come_back(&self, back: Back) -> u64 {
        let t0 = sys::now_ns();
        let moved = match back {
            Back::Stay => return 0,
            Back::Hop(worker) => crate::task::come_back(worker).is_ok(),
            Back::Affinity(saved) => sys::set_affinity(&saved).is_ok(),
        };
        if moved {
            self.move_cost(sys::now_ns() - t0)
        } else {
            0
        }
    }

    /// A move's cost as the placer should weigh it: at most four times the cheapest move seen.
    fn move_cost(&self, ns: u64) -> u64 {
        let cheapest = self.cheapest_move_ns.fetch_min(ns.max(1), Ordering::Relaxed).min(ns.max(1));
        ns.min(cheapest.saturating_mul(4))
    }

    /// Counts an operation that ran from `start` to `end` as `weight` operations (it stands
    /// for the unsampled ones around it; 0: only check whether the period ended).
    fn account(&self, object: &Object<T>, ran: &Ran, start: u64, end: u64, write: bool, weight: u64) {
        let ns = end.saturating_sub(start);
        let c = &object.counters;
        if weight == 0 || ns > object.preempted_ns {
            // Not sampled, or not a cache signal: the thread lost its CPU mid-operation.
        } else if ran.routed {
            c.owner_ops.fetch_add(weight, Ordering::Relaxed);
            c.owner_ns.fetch_add(ns * weight, Ordering::Relaxed);
            if ran.batched {
                c.batch_ops.fetch_add(weight, Ordering::Relaxed);
                c.batch_hop_ns.fetch_add(ran.hop_ns * weight, Ordering::Relaxed);
            } else {
                c.hop_ns.fetch_add(ran.hop_ns * weight, Ordering::Relaxed);
            }
        } else {
            c.local_ops.fetch_add(weight, Ordering::Relaxed);
            c.local_ns.fetch_add(ns * weight, Ordering::Relaxed);
        }
        if write && weight > 0 {
            c.writes.fetch_add(weight, Ordering::Relaxed);
        }
        if let (Some(i), true) = (ran.index, weight > 0) {
            self.busy_ns[i].fetch_add(ns * weight, Ordering::Relaxed);
        }
        if end.saturating_sub(self.period_start.load(Ordering::Relaxed))
            >= self.period_now_ns.load(Ordering::Relaxed)
        {
            if let Ok(mut placer) = self.placer.try_lock() {
                self.end_period_locked(&mut placer, end);
            }
        }
    }

    /// Tells the sampler how many operations the period got done (all CPUs together), and
    /// sets whether the next one follows the routes, and how long it lasts.
    fn weigh_routes(&self, samples: &[ObjectSample], elapsed_ns: u64) {
        let mut gate = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        let Some(sampler) = gate.as_mut() else { return };
        if elapsed_ns > 3 * self.period_now_ns.load(Ordering::Relaxed) {
            // Operations stopped for a while inside this period (the program paused): its
            // rate says nothing about either arm. The arm runs on for another period.
            return;
        }
        let ops: u64 = samples.iter().map(ObjectSample::ops).sum();
        sampler.epoch_end(ops as f64, elapsed_ns);
        let next = sampler.next_epoch();
        self.moving.store(next.arm != STAY, Ordering::Relaxed);
        self.set_all_here();
        self.period_ns.store(next.length(self.base_period_ns), Ordering::Relaxed);
    }

    fn end_period_locked(&self, placer: &mut Placer, now: u64) -> Vec<Move> {
        let start = self.period_start.swap(now, Ordering::Relaxed);
        let elapsed_ns = now.saturating_sub(start);
        // Read under the lock, not from a clone of the list: cloning bumps every object's
        // reference count, a locked write to a line the other CPUs' operations read.
        let samples: Vec<ObjectSample> =
            self.all.read().unwrap_or_else(|e| e.into_inner()).iter().map(|o| o.counters.take()).collect();
        let cores: Vec<CoreSample> = self
            .busy_ns
            .iter()
            .map(|b| CoreSample { busy_ns: b.swap(0, Ordering::Relaxed).min(elapsed_ns), elapsed_ns })
            .collect();
        self.weigh_routes(&samples, elapsed_ns);
        let moves = placer.end_period(&samples, &cores);
        self.count_scheduled(placer);
        if !moves.is_empty() {
            let all = self.all.read().unwrap_or_else(|e| e.into_inner());
            for m in &moves {
                all[m.object.0].route.store(
                    route::encode(m.to, m.via, self.domain_ops_at_home, |c| self.index_of(c)),
                    Ordering::Release,
                );
            }
        }
        // The next period starts after this pass and lasts long enough to pay for it.
        let done = sys::now_ns();
        let pass_ns = done.saturating_sub(now);
        self.period_now_ns.store(
            self.period_ns.load(Ordering::Relaxed).max(pass_ns.saturating_mul(PASS_SHARE)),
            Ordering::Relaxed,
        );
        self.period_start.store(done, Ordering::Relaxed);
        self.passes.fetch_add(1, Ordering::Relaxed);
        if self.moving.load(Ordering::Relaxed) {
            self.passes_following.fetch_add(1, Ordering::Relaxed);
        }
        moves
    }

    /// End-of-period passes run so far (explicit [`Self::end_period`] calls included).
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// End-of-period passes after which operations followed the placer's routes (the rest
    /// ran every operation where it was called, as the payoff gate chose).
    pub fn passes_following_routes(&self) -> u64 {
        self.passes_following.load(Ordering::Relaxed)
    }

    /// The monitoring period in force (ns): the configured one, or longer while the
    /// end-of-period pass over many objects takes more than a hundredth of it.
    pub fn period_ns(&self) -> u64 {
        self.period_now_ns.load(Ordering::Relaxed)
    }
}

/// The duration beyond which an operation on `bytes` was surely preempted or blocked: reading
/// them from memory at a pessimistic 0.5 byte/ns, and never less than 50 µs.
fn preempted_after(bytes: u64) -> u64 {
    bytes.saturating_mul(2).max(50_000)
}

/// [`crate::no_hop_zone`] for the operation of one frame, with one look at the running task
/// instead of two (on entering and on leaving): a tenth of what a short operation costs. The
/// guard never leaves the frame that made it, so the task it saw is the one it leaves.
struct OpZone<'a>(Option<&'a crate::context::TaskCtx>);

impl<'a> OpZone<'a> {
    #[inline]
    fn enter() -> Self {
        OpZone::enter_in(crate::context::task())
    }

    /// The zone of `task`, the caller's context as [`crate::context::task`] gave it.
    #[inline]
    fn enter_in(task: Option<&'a crate::context::TaskCtx>) -> Self {
        if let Some(ctx) = task {
            ctx.no_hop.set(ctx.no_hop.get() + 1);
        }
        OpZone(task)
    }
}

impl Drop for OpZone<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(ctx) = self.0 {
            ctx.no_hop.set(ctx.no_hop.get().saturating_sub(1));
        }
    }
}

/// How many objects are placed each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Census {
    /// Run wherever their caller is.
    pub local: usize,
    /// Scheduled to one core.
    pub core: usize,
    /// Scheduled to a cache domain (any core sharing the cache).
    pub domain: usize,
    /// Read on every core from a replica.
    pub replicated: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_hands_over_every_counter_once() {
        let c = Counters::default();
        assert_eq!(c.take(), ObjectSample::default(), "untouched");
        // A preempted write counts its write alone.
        c.writes.fetch_add(16, Ordering::Relaxed);
        assert_eq!(c.take(), ObjectSample { writes: 16, ..ObjectSample::default() });
        c.owner_ops.fetch_add(16, Ordering::Relaxed);
        c.owner_ns.fetch_add(1600, Ordering::Relaxed);
        c.hop_ns.fetch_add(320, Ordering::Relaxed);
        let owner = ObjectSample { owner_ops: 16, owner_ns: 1600, hop_ns: 320, ..ObjectSample::default() };
        assert_eq!(c.take(), owner);
        assert_eq!(c.take(), ObjectSample::default(), "zeroed by the first take");
    }

    #[test]
    fn routes_round_trip() {
        let index = |c: CpuId| c.0;
        let core = route::encode(Placement::Core { owner: CpuId(3) }, Via::Any, false, index);
        assert_eq!(route::target(core, Some(0)), Some(3));
        assert_eq!(route::target(core, None), Some(3));
        let dom = route::encode(Placement::Domain { domain: 2, home: CpuId(5) }, Via::Any, false, index);
        assert_eq!(route::target(dom, Some(2)), None);
        assert_eq!(route::target(dom, Some(1)), Some(5));
        assert_eq!(route::target(dom, None), Some(5));
        let home = route::encode(Placement::Domain { domain: 2, home: CpuId(5) }, Via::Any, true, index);
        assert_eq!(route::target(home, Some(2)), Some(5));
        assert_eq!(route::target(route::encode(Placement::Local, Via::Batches, false, index), Some(0)), None);
        let rep = route::encode(Placement::Replicated, Via::Any, false, index);
        assert!(route::is_replicated(rep));
        assert_eq!(route::target(rep, Some(0)), None);
    }

    #[test]
    fn routes_for_batches_only_are_followed_by_batches_only() {
        let index = |c: CpuId| c.0;
        for placement in
            [Placement::Core { owner: CpuId(3) }, Placement::Domain { domain: 2, home: CpuId(3) }]
        {
            let code = route::encode(placement, Via::Batches, false, index);
            assert_eq!(route::target(route::followed(code, true, true), Some(1)), Some(3), "{placement:?}");
            assert_eq!(route::target(route::followed(code, true, false), Some(1)), None);
            // The gate's "stay" holds for batches too.
            assert_eq!(route::target(route::followed(code, false, true), Some(1)), None);
            let pinned = route::encode(placement, Via::Any, false, index) | route::PINNED;
            assert_eq!(route::target(route::followed(pinned, false, false), Some(1)), Some(3));
        }
    }

    #[test]
    fn a_countdown_says_yes_once_in_every() {
        let left = std::cell::Cell::new(0);
        let said: Vec<bool> = (0..9).map(|_| count_down(&left, 4)).collect();
        assert_eq!(said, [true, false, false, false, true, false, false, false, true]);
    }

    #[test]
    fn an_objects_lock_has_its_cache_line_to_itself_and_pairs_with_its_values() {
        let object = Box::new(Object {
            cell: LockedCell::new([0u64; 4]),
            route: AtomicU64::new(0),
            id: ObjectId(0),
            preempted_ns: 0,
            counters: Counters::default(),
        });
        let start = &*object as *const Object<[u64; 4]> as usize;
        let line = |field: usize| (field - start) / 64;
        // The lock's line and the value's are one pair of lines.
        assert_eq!(start % 128, 0);
        assert_eq!(object.cell.lock() as *const OpLock as usize, start);
        // What operations only read sits on the next line; the counters on the one after.
        let value = object.cell.exclusive(|v| v as *const [u64; 4] as usize);
        for read in [value, &object.route as *const _ as usize, &object.preempted_ns as *const _ as usize] {
            assert_eq!(line(read), 1);
        }
        assert_eq!(line(&object.counters as *const _ as usize), 2);
    }

    /// The most readers of object 0 that were inside a read at once, two threads reading it
    /// once each (a reader waits up to `wait` inside for the other).
    fn readers_inside_at_once(objects: &Objects<u32, u64>, wait: Duration) -> usize {
        use std::sync::atomic::AtomicUsize;
        let (arrived, inside, most) = (AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0));
        let handle = objects.handle(&0).unwrap();
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    // A thread's first operation is sampled: the read below is not.
                    objects.read_handle(&handle, |_| ()).unwrap();
                    objects
                        .read_handle(&handle, |_| {
                            most.fetch_max(inside.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                            arrived.fetch_add(1, Ordering::SeqCst);
                            let deadline = std::time::Instant::now() + wait;
                            while arrived.load(Ordering::SeqCst) < 2 && std::time::Instant::now() < deadline {
                                std::hint::spin_loop();
                            }
                            inside.fetch_sub(1, Ordering::SeqCst);
                        })
                        .unwrap();
                });
            }
        });
        most.load(Ordering::SeqCst)
    }

    #[test]
    fn reads_of_a_replicated_object_share_it_while_every_operation_stays() {
        let mut machine = Machine::uniform("test", &sys::affinity().unwrap(), 1);
        let cpus: Vec<CpuId> = machine.cpus().iter().map(|c| c.id).collect();
        let l2 = |cpu| corehop_topology::Cache {
            level: 2,
            kind: corehop_topology::CacheKind::Unified,
            size_bytes: 1 << 20,
            line_bytes: 64,
            cpus: vec![cpu],
        };
        machine.caches = cpus.iter().map(|&cpu| l2(cpu)).collect();
        let config = ObjectsConfig { period: Duration::from_secs(3600), ..ObjectsConfig::default() };
        let objects = Objects::<u32, u64>::new(&machine, &cpus, config).unwrap();
        objects.register(0, 7, 64).unwrap();
        assert!(objects.all_stay());
        // Local: one reader at a time.
        assert_eq!(readers_inside_at_once(&objects, Duration::from_millis(50)), 1);
        // As the end of a period leaves an object the placer replicated.
        let object = objects.handle(&0).unwrap();
        object.route.store(route::encode(Placement::Replicated, Via::Any, false, |c| c.0), Ordering::Release);
        objects.replicated.store(1, Ordering::Relaxed);
        objects.set_all_here();
        assert!(objects.all_stay());
        assert_eq!(readers_inside_at_once(&objects, Duration::from_secs(5)), 2);
    }
}
