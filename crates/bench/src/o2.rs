//! `corehop bench o2`: the O² paper's directory lookups under three schedulers, side by side.
//!
//! Workload (o2-coretime §5): directories of 1 000 entries of 32 bytes; each worker looks up a
//! random name in a random directory (a linear scan under the directory's lock). Popularity is
//! uniform, or oscillates between all directories and a sixteenth of them (Figure 4(b)).
//! `--lookup hashed` finds the name through a hash index instead (as a file system's name
//! cache does): two dependent cache lines a lookup, where the scan streams 250 lines that
//! the prefetchers fetch ahead.
//! Schedulers, each on every CPU of the run, one after the other on the same data:
//!
//! - `threads`: one pinned thread per CPU, every lookup where the thread is (the baseline);
//! - `sharded`: one pinned thread per CPU owning the directories that hash to it; a lookup for
//!   another shard is sent to its owner's queue and the sender keeps going (up to 8 requests in
//!   flight) — static sharding as a Seastar user would write it;
//! - `o2`: corehop tasks (several per CPU) look up through the runtime's object registry, which
//!   measures every lookup, packs the directories that are expensive to fetch into the CPUs'
//!   cache budgets and hops each lookup to its directory's CPU (and back);
//! - `o2 batched`: the same tasks look up `--batch` names at a time through
//!   [`Objects::read_batch`]: the lookups for another CPU's directories go there as one
//!   request, the task runs its CPU's own lookups meanwhile and then yields to its CPU's other
//!   tasks until the request is served.
//!
//! Each O² scheduler has its own registry (and its own copy of the directories, as the
//! registry's values), so what one learned never steers the other.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::ValueEnum;
use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;
use serde::Serialize;

use corehop_policy::objects::Budgets;
use corehop_runtime::objects::{Census, Handle, Objects, ObjectsConfig, OpLock};
use corehop_runtime::{sys, Runtime};
use corehop_topology::{format_size, parse_cpu_list, parse_size, CpuId, Machine, OsCpu};

use crate::report::{self, OutputArgs, Scale, Series, Stats, Table};

/// Entries per directory and bytes per entry, as in the paper.
const ENTRIES: usize = 1000;
type Entry = [u64; 4];
const DIR_BYTES: u64 = (ENTRIES * std::mem::size_of::<Entry>()) as u64;
/// Slots of a directory's hash index (entry number + 1, 0 = empty), a power of two about
/// twice the entries.
const SLOTS: usize = 2048;
/// The warm-up run lasts at least this long: O² watches, tries and judges directories over
/// about ten 5 ms periods.
const MIN_WARMUP_MS: u64 = 150;
/// Requests a shard may have waiting at other shards.
const SHARD_DEPTH: u64 = 8;
/// A directory: its entries, and a hash index over them (used by `--lookup hashed`). A clone
/// shares them: every scheduler reads the same memory, so none is faster or slower for where
/// its copy happened to land in the caches (5-8 % apart at some sizes here).
#[derive(Clone)]
struct Dir {
    entries: Arc<[Entry]>,
    index: Arc<[u16]>,
}

/// Directory lookups: plain threads vs static sharding vs O² object scheduling.
///
/// O² runs one lookup at a time and in batches. Throughput (lookups per second, all CPUs
/// together) against the total size of all directories, from well under one CPU's private cache
/// to well over all on-chip cache (sizes taken from this machine's caches). `threads` is the
/// same-run baseline: every other figure is also shown as a ratio to it. Each point is the
/// min/median/max of --reps runs of --ms milliseconds, after a warm-up run (as long, at least
/// 150 ms) that lets O² place directories. `o2` moves each lookup to its directory's CPU and back
/// (a round trip each); `o2 batched` sends the lookups of a batch (--batch) bound for another CPU
/// there as one request, served while the task's CPU runs its own lookups and its other tasks.
///
/// --quick measures two sizes, one rep, 40 ms each; --plot draws throughput against size.
///
/// JSON (--json), one object:
///   { "machine": { "name", "cpus", "private_cache_bytes", "private_cache_total_bytes",
///                  "on_chip_bytes" },
///     "settings": { "ms", "warmup_ms", "reps", "tasks_per_cpu", "batch", "lookup" },
///     "results": [ { "popularity": "uniform"|"oscillating", "size_bytes", "directories",
///                    "scheduler": "threads"|"sharded"|"o2"|"o2_batched", "min_lookups_per_s",
///                    "median_lookups_per_s", "max_lookups_per_s", "ratio_to_threads",
///                    "paired_ratio_to_threads",
///                    "paired_interval_to_threads": null | { "low", "high", "coverage" },
///                    "placement": null | { "local", "core", "domain", "replicated",
///                                        "following_routes" } } ] }
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Total directory sizes to measure, comma-separated ("256K,1M,1.5M,4M"). Default: from a
    /// quarter of one CPU's private cache to twice all on-chip cache, doubling, plus 1.5× one
    /// and 1.5× all private caches (where O²'s gain should appear). Each at most 4G and half
    /// the memory available.
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<String>,
    /// Which popularity patterns to run.
    #[arg(long, value_enum, default_value_t = PopularityArg::Both)]
    popularity: PopularityArg,
    /// Milliseconds per measured run.
    #[arg(long, default_value_t = 100)]
    ms: u64,
    /// Measured runs per point (min/median/max are over these): runs on a virtual or busy
    /// machine spread by several per cent, and a median of five is steadier than of three.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// corehop tasks per CPU under O² (a CPU keeps working while some of its tasks are away).
    #[arg(long, default_value_t = 4)]
    tasks_per_cpu: usize,
    /// Lookups per batch under `o2 batched` (1 to 4096).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// How a lookup finds a name: `scan` the directory (the paper's), or through its `hashed`
    /// index (two dependent cache lines a lookup instead of a prefetched stream).
    #[arg(long, value_enum, default_value_t = Lookup::Scan)]
    lookup: Lookup,
    /// Length of each popularity phase when oscillating, in ms.
    #[arg(long, default_value_t = 40)]
    phase_ms: u64,
    /// CPUs to use, as a kernel CPU list ("0-3,6"). Default: every CPU this process may use.
    #[arg(long)]
    cpus: Option<String>,
    #[command(flatten)]
    output: OutputArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum PopularityArg {
    Uniform,
    Oscillating,
    Both,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
enum Lookup {
    Scan,
    Hashed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Popularity {
    Uniform,
    Oscillating,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Scheduler {
    Threads,
    Sharded,
    O2,
    O2Batched,
}

const SCHEDULERS: [Scheduler; 4] =
    [Scheduler::Threads, Scheduler::Sharded, Scheduler::O2, Scheduler::O2Batched];

#[derive(Serialize)]
struct MachineInfo {
    name: String,
    cpus: usize,
    private_cache_bytes: u64,
    private_cache_total_bytes: u64,
    on_chip_bytes: u64,
}

#[derive(Serialize)]
struct Settings {
    ms: u64,
    warmup_ms: u64,
    reps: usize,
    tasks_per_cpu: usize,
    batch: usize,
    lookup: Lookup,
}

#[derive(Serialize, Clone, Copy)]
struct PlacementCounts {
    local: usize,
    core: usize,
    domain: usize,
    replicated: usize,
    /// Share of the monitoring periods of the measured runs in which operations followed the
    /// placer's routes (the payoff gate's choice; the rest ran every lookup where it was called).
    following_routes: f64,
}

impl PlacementCounts {
    fn of(c: Census, following_routes: f64) -> Self {
        PlacementCounts {
            local: c.local,
            core: c.core,
            domain: c.domain,
            replicated: c.replicated,
            following_routes,
        }
    }
}

#[derive(Serialize)]
struct Row {
    popularity: Popularity,
    size_bytes: u64,
    directories: usize,
    scheduler: Scheduler,
    min_lookups_per_s: f64,
    median_lookups_per_s: f64,
    max_lookups_per_s: f64,
    ratio_to_threads: f64,
    /// The median, over the repetitions, of each run over the threads' run of the same
    /// repetition (run beside it): what a drift of the host between repetitions does not move.
    paired_ratio_to_threads: f64,
    /// Where the paired ratio's true value lies, with the chance it does (see
    /// [`report::paired_interval`]); `None` with one repetition.
    paired_interval_to_threads: Option<report::Interval>,
    placement: Option<PlacementCounts>,
}

#[derive(Serialize)]
struct Output {
    machine: MachineInfo,
    settings: Settings,
    results: Vec<Row>,
}

/// The directories: read-only after creation, shared by every scheduler.
struct Dirs {
    dirs: Vec<Dir>,
}

fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser: distinct inputs give well-spread, distinct-looking names.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn name(dir: usize, file: usize) -> Entry {
    let base = mix(((dir as u64) << 20) | file as u64);
    [base, mix(base ^ 1), mix(base ^ 2), mix(base ^ 3)]
}

/// A name's first slot in a hash index (names are already well mixed).
fn slot(name: &Entry) -> usize {
    name[0] as usize & (SLOTS - 1)
}

/// Directory `d`: its entries and their hash index (open addressing, linear probing).
fn directory(d: usize) -> Dir {
    let entries: Arc<[Entry]> = (0..ENTRIES).map(|f| name(d, f)).collect();
    let mut index = vec![0u16; SLOTS].into_boxed_slice();
    for (f, e) in entries.iter().enumerate() {
        let mut at = slot(e);
        while index[at] != 0 {
            at = (at + 1) & (SLOTS - 1);
        }
        index[at] = f as u16 + 1;
    }
    Dir { entries, index: index.into() }
}

/// The paper's inner loop: scan the directory for the name.
#[inline(never)]
fn scan(dir: &[Entry], want: &Entry) -> Option<usize> {
    dir.iter().position(|e| e == want)
}

/// The same through the hash index: probe slots from the name's until it or an empty one.
#[inline(never)]
fn hashed(dir: &Dir, want: &Entry) -> Option<usize> {
    let mut at = slot(want);
    loop {
        let f = usize::from(dir.index[at]).checked_sub(1)?;
        if dir.entries[f] == *want {
            return Some(f);
        }
        at = (at + 1) & (SLOTS - 1);
    }
}

impl Dir {
    fn find(&self, want: &Entry, how: Lookup) -> Option<usize> {
        match how {
            Lookup::Scan => scan(&self.entries, want),
            Lookup::Hashed => hashed(self, want),
        }
    }
}

impl Dirs {
    fn new(count: usize) -> Dirs {
        Dirs { dirs: (0..count).map(directory).collect() }
    }

    fn lookup(&self, dir: usize, want: &Entry, how: Lookup) -> Option<usize> {
        self.dirs[dir].find(want, how)
    }
}

/// xorshift64*: per-worker, cheap, good enough to pick directories.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as usize * n) >> 32
    }
}

/// What every worker of one run shares.
struct Run {
    dirs: Arc<Dirs>,
    popularity: Popularity,
    lookup: Lookup,
    phase_ns: u64,
    start_ns: u64,
    /// Set when the clock of a run of tasks starts.
    started: AtomicBool,
    stop: AtomicBool,
}

impl Run {
    /// A random (directory, file) from the directories popular now.
    fn pick(&self, rng: &mut Rng) -> (usize, usize) {
        let all = self.dirs.dirs.len();
        let active = match self.popularity {
            Popularity::Uniform => all,
            Popularity::Oscillating => {
                let phase = sys::now_ns().saturating_sub(self.start_ns) / self.phase_ns.max(1);
                if phase.is_multiple_of(2) {
                    all
                } else {
                    (all / 16).max(1)
                }
            }
        };
        (rng.below(active), rng.below(ENTRIES))
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

struct Bench {
    machine: Machine,
    cpus: Vec<CpuId>,
    ms: u64,
    reps: usize,
    tasks_per_cpu: usize,
    batch: usize,
    lookup: Lookup,
    phase_ms: u64,
}

/// An O² scheduler's registry: the directories are its values.
struct Registry {
    objects: Arc<Objects<usize, Dir>>,
    handles: Arc<Vec<Handle<Dir>>>,
}

impl Registry {
    /// A registry of `dirs`, sharing their memory.
    fn new(bench: &Bench, dirs: &Dirs) -> anyhow::Result<Registry> {
        let config = ObjectsConfig { period: Duration::from_millis(5), ..ObjectsConfig::default() };
        // Where a lookup starts reading: the threads' loop finds that address apart from the
        // lock it takes, and so fetches both at once.
        let first_read: fn(&Dir) -> *const u8 = match bench.lookup {
            Lookup::Scan => |dir| dir.entries.as_ptr().cast(),
            Lookup::Hashed => |dir| dir.index.as_ptr().cast(),
        };
        let objects = Arc::new(
            Objects::new(&bench.machine, &bench.cpus, config)
                .context("starting the object registry")?
                .with_data_address(first_read),
        );
        let handles = dirs
            .dirs
            .iter()
            .enumerate()
            .map(|(d, dir)| objects.register(d, dir.clone(), bench.dir_bytes()))
            .collect::<Result<_, _>>()?;
        Ok(Registry { objects, handles: Arc::new(handles) })
    }

    /// End-of-period passes so far, and those after which routes were followed.
    fn gate_counts(&self) -> (u64, u64) {
        (self.objects.passes(), self.objects.passes_following_routes())
    }

    /// Where the directories are now, and how often routes were followed since `since`.
    fn placement(&self, since: (u64, u64)) -> PlacementCounts {
        let (passes, following) = self.gate_counts();
        let periods = passes.saturating_sub(since.0);
        let share =
            if periods == 0 { 0.0 } else { following.saturating_sub(since.1) as f64 / periods as f64 };
        PlacementCounts::of(self.objects.census(), share)
    }
}

impl Bench {
    /// Bytes a directory's lookups touch: its entries, and its index when they use it.
    fn dir_bytes(&self) -> u64 {
        match self.lookup {
            Lookup::Scan => DIR_BYTES,
            Lookup::Hashed => DIR_BYTES + (SLOTS * std::mem::size_of::<u16>()) as u64,
        }
    }

    fn warmup_ms(&self) -> u64 {
        self.ms.max(MIN_WARMUP_MS)
    }

    fn os_ids(&self) -> Vec<OsCpu> {
        self.cpus.iter().map(|c| self.machine.cpus()[c.0].os_id).collect()
    }

    /// Starts `n` pinned threads running `work(index, run)` for `ms`, returns lookups/s.
    fn timed_threads(
        &self,
        run: &Arc<Run>,
        ms: u64,
        work: impl Fn(usize, &Run) -> u64 + Sync,
    ) -> anyhow::Result<f64> {
        let os = self.os_ids();
        let barrier = Barrier::new(os.len() + 1);
        let total = std::thread::scope(|s| -> anyhow::Result<(u64, Duration)> {
            let workers: Vec<_> = os
                .iter()
                .enumerate()
                .map(|(i, &cpu)| {
                    let (barrier, work, run) = (&barrier, &work, Arc::clone(run));
                    s.spawn(move || -> anyhow::Result<u64> {
                        sys::pin_current_thread(cpu).with_context(|| format!("pinning to os cpu {cpu}"))?;
                        barrier.wait();
                        Ok(work(i, &run))
                    })
                })
                .collect();
            barrier.wait();
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_millis(ms));
            run.stop.store(true, Ordering::Relaxed);
            let mut sum = 0;
            for w in workers {
                sum += w.join().map_err(|_| anyhow::anyhow!("a worker thread panicked"))??;
            }
            Ok((sum, t0.elapsed()))
        })?;
        Ok(total.0 as f64 / total.1.as_secs_f64())
    }

    fn threads(&self, run: &Arc<Run>, ms: u64, locks: &[CachePadded<OpLock>]) -> anyhow::Result<f64> {
        self.timed_threads(run, ms, |i, run| {
            let mut rng = Rng(mix(i as u64 + 1) | 1);
            let mut done = 0;
            while !run.stopped() {
                let (d, f) = run.pick(&mut rng);
                let hit = locks[d].exclusive(|| run.dirs.lookup(d, &name(d, f), run.lookup));
                debug_assert_eq!(hit, Some(f));
                done += 1;
            }
            done
        })
    }

    fn sharded(&self, run: &Arc<Run>, ms: u64) -> anyhow::Result<f64> {
        let n = self.cpus.len();
        let queues: Vec<ArrayQueue<u64>> =
            (0..n).map(|_| ArrayQueue::new(n * SHARD_DEPTH as usize)).collect();
        let completions: Vec<CachePadded<AtomicU64>> =
            (0..n).map(|_| CachePadded::new(AtomicU64::new(0))).collect();
        self.timed_threads(run, ms, |me, run| {
            let mut rng = Rng(mix(me as u64 + 77) | 1);
            let (mut done, mut in_flight) = (0u64, 0u64);
            while !run.stopped() {
                // Serve requests for this shard's directories.
                while let Some(req) = queues[me].pop() {
                    let (d, f, from) =
                        ((req >> 32) as usize, ((req >> 16) & 0xffff) as usize, (req & 0xffff) as usize);
                    std::hint::black_box(run.dirs.lookup(d, &name(d, f), run.lookup));
                    completions[from].fetch_add(1, Ordering::Relaxed);
                }
                if completions[me].load(Ordering::Relaxed) > 0 {
                    let c = completions[me].swap(0, Ordering::Relaxed);
                    (in_flight, done) = (in_flight - c, done + c);
                }
                if in_flight < SHARD_DEPTH {
                    let (d, f) = run.pick(&mut rng);
                    let home = mix(d as u64) as usize % n;
                    if home == me {
                        std::hint::black_box(run.dirs.lookup(d, &name(d, f), run.lookup));
                        done += 1;
                    } else if queues[home].push(((d as u64) << 32) | ((f as u64) << 16) | me as u64).is_ok() {
                        in_flight += 1;
                    }
                }
            }
            done
        })
    }

    /// Runs `work(cpu, k, run, registry)` as `tasks_per_cpu` tasks per CPU for `ms`; each
    /// returns its lookups. Returns lookups/s.
    fn timed_tasks(
        &self,
        rt: &Runtime,
        run: &Arc<Run>,
        ms: u64,
        registry: &Registry,
        work: fn(&mut Rng, &Run, &Registry, usize) -> Result<u64, String>,
    ) -> anyhow::Result<f64> {
        let tasks: Vec<_> = self
            .cpus
            .iter()
            .flat_map(|&cpu| (0..self.tasks_per_cpu).map(move |k| (cpu, k)))
            .map(|(cpu, k)| {
                let run = Arc::clone(run);
                let registry = Registry {
                    objects: Arc::clone(&registry.objects),
                    handles: Arc::clone(&registry.handles),
                };
                let batch = self.batch;
                rt.spawn_on(cpu, move || -> Result<u64, String> {
                    let mut rng = Rng(mix(((cpu.0 as u64) << 8) + k as u64 + 991) | 1);
                    // Nothing counts before every task is there and the clock starts, as the
                    // threads' barrier does for them.
                    while !run.started.load(Ordering::Acquire) {
                        corehop_runtime::yield_now().map_err(|e| e.to_string())?;
                    }
                    let mut done = 0;
                    while !run.stopped() {
                        done += work(&mut rng, &run, &registry, batch)?;
                    }
                    Ok(done)
                })
            })
            .collect::<Result<_, _>>()
            .context("starting O² tasks")?;
        let t0 = Instant::now();
        run.started.store(true, Ordering::Release);
        std::thread::sleep(Duration::from_millis(ms));
        run.stop.store(true, Ordering::Relaxed);
        let mut sum = 0;
        for t in tasks {
            sum += t
                .join()
                .map_err(|e| anyhow::anyhow!("O² task failed: {e:?}"))?
                .map_err(|e| anyhow::anyhow!(e))?;
        }
        Ok(sum as f64 / t0.elapsed().as_secs_f64())
    }

    /// One lookup at a time, each where its directory lives.
    fn o2(&self, rt: &Runtime, run: &Arc<Run>, ms: u64, registry: &Registry) -> anyhow::Result<f64> {
        // Sixteen lookups a call, in a loop as the threads' own: a call through the harness
        // per lookup cost a hashed lookup (40 ns) several per cent.
        const PER_CALL: u64 = 16;
        self.timed_tasks(rt, run, ms, registry, |rng, run, registry, _| {
            for _ in 0..PER_CALL {
                let (d, f) = run.pick(rng);
                let want = name(d, f);
                let hit = registry
                    .objects
                    .read_handle(&registry.handles[d], |dir| dir.find(&want, run.lookup))
                    .map_err(|e| e.to_string())?;
                debug_assert_eq!(hit, Some(f));
            }
            Ok(PER_CALL)
        })
    }

    /// `batch` lookups at a time, those for another CPU's directories sent there together.
    fn o2_batched(&self, rt: &Runtime, run: &Arc<Run>, ms: u64, registry: &Registry) -> anyhow::Result<f64> {
        self.timed_tasks(rt, run, ms, registry, |rng, run, registry, batch| {
            let ops = (0..batch).map(|_| {
                let (d, f) = run.pick(rng);
                let want = name(d, f);
                let how = run.lookup;
                (&registry.handles[d], move |dir: &Dir| dir.find(&want, how))
            });
            let hits = registry.objects.read_batch(ops).map_err(|e| e.to_string())?;
            debug_assert!(hits.iter().all(Option::is_some));
            Ok(hits.len() as u64)
        })
    }

    fn new_run(&self, dirs: &Arc<Dirs>, popularity: Popularity) -> Arc<Run> {
        Arc::new(Run {
            dirs: Arc::clone(dirs),
            popularity,
            lookup: self.lookup,
            phase_ns: self.phase_ms * 1_000_000,
            start_ns: sys::now_ns(),
            started: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        })
    }

    /// One size, one popularity: a warm-up run then `reps` measured runs of each scheduler.
    fn point(
        &self,
        rt: &Runtime,
        size: u64,
        popularity: Popularity,
        bar: &indicatif::ProgressBar,
    ) -> anyhow::Result<Vec<Row>> {
        let count = (size / self.dir_bytes()).max(1) as usize;
        let dirs = Arc::new(Dirs::new(count));
        // A line per lock, as each O² object has: locks packed sixteen to a line would make
        // the baseline pay for false sharing that has nothing to do with placement.
        let locks: Vec<CachePadded<OpLock>> = (0..count).map(|_| CachePadded::default()).collect();
        let (single, batched) = (Registry::new(self, &dirs)?, Registry::new(self, &dirs)?);
        // (passes, passes following routes) of each registry when the measured runs began.
        let mut gate_start = [(0, 0); 2];
        // Schedulers take turns within each repetition (`report::turn`), so a drift of the
        // host (it moves the vCPUs) hits them alike.
        let mut samples: [Vec<f64>; SCHEDULERS.len()] = Default::default();
        for rep in 0..=self.reps {
            for turn in 0..SCHEDULERS.len() {
                let which = report::turn(rep, turn, SCHEDULERS.len());
                let run = self.new_run(&dirs, popularity);
                let ms = if rep == 0 { self.warmup_ms() } else { self.ms };
                let rate = match SCHEDULERS[which] {
                    Scheduler::Threads => self.threads(&run, ms, &locks)?,
                    Scheduler::Sharded => self.sharded(&run, ms)?,
                    Scheduler::O2 => self.o2(rt, &run, ms, &single)?,
                    Scheduler::O2Batched => self.o2_batched(rt, &run, ms, &batched)?,
                };
                if rep == 0 && turn + 1 == SCHEDULERS.len() {
                    gate_start = [&single, &batched].map(|r| r.gate_counts());
                }
                // Rep 0 warms the caches (and lets O² place directories); it is not reported.
                if rep > 0 {
                    samples[which].push(rate);
                }
                bar.inc(1);
            }
        }
        let mut rows = Vec::new();
        let threads_median = Stats::of(&samples[0]).context("no measurements")?.median;
        let threads = &samples[0];
        for (scheduler, samples) in SCHEDULERS.into_iter().zip(&samples) {
            let stats = Stats::of(samples).context("no measurements")?;
            rows.push(Row {
                popularity,
                size_bytes: size,
                directories: count,
                scheduler,
                min_lookups_per_s: stats.min,
                median_lookups_per_s: stats.median,
                max_lookups_per_s: stats.max,
                ratio_to_threads: if threads_median > 0.0 { stats.median / threads_median } else { 0.0 },
                paired_ratio_to_threads: report::paired_median(samples, threads).unwrap_or(0.0),
                paired_interval_to_threads: report::paired_interval(samples, threads),
                placement: match scheduler {
                    Scheduler::O2 => Some(single.placement(gate_start[0])),
                    Scheduler::O2Batched => Some(batched.placement(gate_start[1])),
                    Scheduler::Threads | Scheduler::Sharded => None,
                },
            });
        }
        Ok(rows)
    }
}

/// The largest total directory size a run measures.
const MAX_SIZE: u64 = 4 << 30;

/// `MemAvailable` of /proc/meminfo, in bytes, if it can be read.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Cache sizes of the CPUs of a run, in bytes.
#[derive(Clone, Copy)]
struct CacheSizes {
    /// One CPU's private caches (the smallest, if they differ).
    one: u64,
    /// All the CPUs' private caches together.
    all: u64,
    /// Every cache on chip (private and shared).
    on_chip: u64,
}

fn cache_sizes(machine: &Machine, cpus: &[CpuId]) -> anyhow::Result<CacheSizes> {
    let budgets = Budgets::from_machine(machine, cpus, 1.0).context("sizing this machine's caches")?;
    let one = budgets.cores.iter().map(|c| c.private_bytes).min().unwrap_or(0);
    let all: u64 = budgets.cores.iter().map(|c| c.private_bytes).sum();
    Ok(CacheSizes { one, all, on_chip: budgets.total_bytes() })
}

fn default_sizes(one: u64, all: u64, on_chip: u64, quick: bool) -> Vec<u64> {
    if quick {
        return vec![(one / 2).max(DIR_BYTES), (all * 3 / 2).max(2 * DIR_BYTES)];
    }
    let mut sizes = vec![one * 3 / 2, all * 3 / 2];
    let mut s = (one / 4).max(DIR_BYTES);
    while s <= 2 * on_chip.max(one) {
        sizes.push(s);
        s *= 2;
    }
    sizes.sort_unstable();
    sizes.dedup_by(|a, b| (*a as f64 / *b as f64) < 1.15);
    sizes
}

fn setup(args: &Args) -> anyhow::Result<(Bench, Vec<u64>, CacheSizes)> {
    let machine = corehop_topology::discover().context("discovering this machine")?;
    let cpus: Vec<CpuId> = match &args.cpus {
        None => machine.cpus().iter().map(|c| c.id).collect(),
        Some(list) => parse_cpu_list(list)
            .with_context(|| format!("--cpus {list:?}"))?
            .into_iter()
            .map(|os| {
                machine
                    .cpu_by_os_id(OsCpu(os))
                    .with_context(|| format!("--cpus: os cpu {os} is not one this process may use"))
            })
            .collect::<anyhow::Result<_>>()?,
    };
    anyhow::ensure!(!cpus.is_empty(), "--cpus: no CPUs given");
    report::check_range("--reps", args.reps, 1..=report::MAX_REPS)?;
    report::check_range("--ms", args.ms, 1..=report::MAX_RUN_MS)?;
    // Each task has a stack of its own (256 KiB).
    report::check_range("--tasks-per-cpu", args.tasks_per_cpu, 1..=256)?;
    report::check_range("--batch", args.batch, 1..=4096)?;
    let caches = cache_sizes(&machine, &cpus)?;
    let sizes = if args.sizes.is_empty() {
        default_sizes(caches.one, caches.all, caches.on_chip, args.output.quick)
    } else {
        args.sizes
            .iter()
            .map(|s| {
                parse_size(s).with_context(|| format!("--sizes: {s:?} is not a size like 256K, 1.5M or 64M"))
            })
            .collect::<anyhow::Result<_>>()?
    };
    if let Some(&bad) = sizes.iter().find(|&&s| s < DIR_BYTES) {
        anyhow::bail!("--sizes: {bad} bytes is less than one directory ({DIR_BYTES} bytes)");
    }
    // The directories are allocated whole: a size past the memory at hand is refused before
    // anything is, rather than ending in a failed allocation or the kernel's OOM killer.
    let limit = available_memory().map_or(MAX_SIZE, |bytes| (bytes / 2).min(MAX_SIZE)) >> 20 << 20;
    if let Some(&big) = sizes.iter().find(|&&s| s > limit) {
        anyhow::bail!(
            "--sizes: {} is more than this run may allocate, {} (at most {}, and half the memory \
             available now)",
            format_size(big),
            format_size(limit),
            format_size(MAX_SIZE)
        );
    }
    let (ms, reps) = if args.output.quick { (40, 1) } else { (args.ms, args.reps) };
    let bench = Bench {
        machine,
        cpus,
        ms,
        reps,
        tasks_per_cpu: args.tasks_per_cpu,
        batch: args.batch,
        lookup: args.lookup,
        phase_ms: args.phase_ms.max(1),
    };
    Ok((bench, sizes, caches))
}

fn measure(bench: &Bench, sizes: &[u64], popularities: &[Popularity]) -> anyhow::Result<Vec<Row>> {
    let rt = Runtime::builder()
        .machine(bench.machine.clone())
        .cpus(bench.cpus.iter().copied())
        .build()
        .context("starting the corehop runtime")?;
    let runs = (sizes.len() * popularities.len() * SCHEDULERS.len() * (bench.reps + 1)) as u64;
    let bar = report::progress(runs, "bench o2");
    let mut rows = Vec::new();
    for &popularity in popularities {
        for &size in sizes {
            bar.set_message(format!("{popularity:?} {}", format_size(size)));
            rows.extend(bench.point(&rt, size, popularity, &bar)?);
        }
    }
    bar.finish_and_clear();
    rt.shutdown();
    Ok(rows)
}

fn table(rows: &[Row], popularity: Popularity, title: String) -> Table {
    let header = [
        "size",
        "dirs",
        "threads k/s",
        "sharded k/s",
        "×thr paired",
        "o2 k/s",
        "×thr paired",
        "batched k/s",
        "×thr paired",
        "placed",
    ];
    let mut t = Table::new(header).title(title);
    let k = |x: f64| x / 1e3;
    let cell = |r: &Row| {
        let (lo, med, hi) = (k(r.min_lookups_per_s), k(r.median_lookups_per_s), k(r.max_lookups_per_s));
        if r.min_lookups_per_s == r.max_lookups_per_s {
            format!("{med:.0}")
        } else {
            format!("{med:.0} ({lo:.0}–{hi:.0})")
        }
    };
    let mut sizes: Vec<u64> =
        rows.iter().filter(|r| r.popularity == popularity).map(|r| r.size_bytes).collect();
    sizes.dedup();
    for size in sizes {
        let get = |s: Scheduler| {
            rows.iter().find(|r| r.popularity == popularity && r.size_bytes == size && r.scheduler == s)
        };
        let (Some(th), Some(sh), Some(o2), Some(ob)) =
            (get(Scheduler::Threads), get(Scheduler::Sharded), get(Scheduler::O2), get(Scheduler::O2Batched))
        else {
            continue;
        };
        let placed = |r: &Row| {
            r.placement.map_or(String::new(), |p| {
                format!("{} {:.0}%", p.core + p.domain + p.replicated, 100.0 * p.following_routes)
            })
        };
        let placed = format!("{}, {} of {}", placed(o2), placed(ob), th.directories);
        t.row([
            format_size(size),
            th.directories.to_string(),
            cell(th),
            cell(sh),
            format!("{:.2} {:.2}", sh.ratio_to_threads, sh.paired_ratio_to_threads),
            cell(o2),
            format!("{:.2} {:.2}", o2.ratio_to_threads, o2.paired_ratio_to_threads),
            cell(ob),
            format!("{:.2} {:.2}", ob.ratio_to_threads, ob.paired_ratio_to_threads),
            placed,
        ]);
    }
    t
}

/// Where O² (either form) ran below the threads beyond this host's noise: the interval of its
/// paired ratio wholly below 1.
fn beyond_noise(rows: &[Row], popularity: Popularity) -> String {
    let mut chance = None;
    let below: Vec<String> = rows
        .iter()
        .filter(|r| r.popularity == popularity && matches!(r.scheduler, Scheduler::O2 | Scheduler::O2Batched))
        .filter_map(|r| {
            let i = r.paired_interval_to_threads?;
            chance = Some(i.chance());
            let name = if r.scheduler == Scheduler::O2 { "o2" } else { "batched" };
            (i.high < 1.0).then(|| format!("{name} at {} ({})", format_size(r.size_bytes), i.range(2)))
        })
        .collect();
    match chance {
        None => "one repetition: no interval says where O² stands against the threads".into(),
        Some(chance) => format!(
            "below the threads beyond noise (the paired ratio's interval, {chance}, wholly under 1): {}",
            if below.is_empty() { "nowhere".into() } else { below.join(", ") }
        ),
    }
}

fn popularities(arg: PopularityArg) -> Vec<Popularity> {
    match arg {
        PopularityArg::Uniform => vec![Popularity::Uniform],
        PopularityArg::Oscillating => vec![Popularity::Oscillating],
        PopularityArg::Both => vec![Popularity::Uniform, Popularity::Oscillating],
    }
}

/// `corehop bench o2`: measures every size and popularity, prints the tables (or JSON, or a plot).
pub fn run(args: Args) -> anyhow::Result<()> {
    let (bench, sizes, CacheSizes { one, all, on_chip }) = setup(&args)?;
    let pops = popularities(args.popularity);
    let rows = measure(&bench, &sizes, &pops)?;
    if let Some(path) = &args.output.plot {
        let series: Vec<Series> = pops
            .iter()
            .flat_map(|&p| SCHEDULERS.iter().map(move |&s| (p, s)))
            .map(|(p, s)| Series {
                name: format!("{s:?} ({p:?})").to_lowercase(),
                points: rows
                    .iter()
                    .filter(|r| r.popularity == p && r.scheduler == s)
                    .map(|r| (r.size_bytes as f64 / (1 << 20) as f64, r.median_lookups_per_s / 1e6))
                    .collect(),
            })
            .collect();
        report::plot_lines(
            path,
            "Directory lookups: threads vs sharding vs O²",
            "total directory data (MiB)",
            "M lookups/s",
            Scale::Log10,
            &series,
        )?;
    }
    if args.output.json {
        return report::print_json(&Output {
            machine: MachineInfo {
                name: bench.machine.name.clone(),
                cpus: bench.cpus.len(),
                private_cache_bytes: one,
                private_cache_total_bytes: all,
                on_chip_bytes: on_chip,
            },
            settings: Settings {
                ms: bench.ms,
                warmup_ms: bench.warmup_ms(),
                reps: bench.reps,
                tasks_per_cpu: bench.tasks_per_cpu,
                batch: bench.batch,
                lookup: bench.lookup,
            },
            results: rows,
        });
    }
    for p in pops {
        let mut t = table(
            &rows,
            p,
            format!(
                "Directory lookups ({:?}), {p:?} popularity, {} CPUs: median (min–max) of {} runs",
                bench.lookup,
                bench.cpus.len(),
                bench.reps
            )
            .replace("Uniform", "uniform")
            .replace("(Scan)", "(scan)")
            .replace("(Hashed)", "(hashed)")
            .replace("Oscillating", "oscillating"),
        );
        t.note(format!(
            "caches: {} private per CPU, {} private in all, {} on chip; ×thr = median / threads' median in this run; paired = median over the repetitions of each run / the threads' run of the same repetition",
            format_size(one),
            format_size(all),
            format_size(on_chip)
        ));
        t.note(format!(
            "batched = O² with {} lookups per batch; placed = directories o2, batched scheduled to a CPU (the rest run where the caller is), and the share of periods whose lookups followed those routes",
            bench.batch
        ));
        t.note(beyond_noise(&rows, p));
        println!("{t}");
    }
    Ok(())
}

/// The tour's part: two sizes (half one CPU's private cache; 1.5× all private caches), uniform.
pub fn tour() -> anyhow::Result<()> {
    let args = Args {
        sizes: Vec::new(),
        popularity: PopularityArg::Uniform,
        ms: 40,
        reps: 1,
        tasks_per_cpu: 4,
        batch: 64,
        lookup: Lookup::Scan,
        phase_ms: 40,
        cpus: None,
        output: OutputArgs { quick: true, ..OutputArgs::default() },
    };
    let (bench, sizes, CacheSizes { one, all, .. }) = setup(&args)?;
    let rows = measure(&bench, &sizes, &[Popularity::Uniform])?;
    print!(
        "{}",
        table(
            &rows,
            Popularity::Uniform,
            "O² object scheduling: directory lookups (corehop bench o2)".into()
        )
    );
    let big = rows.iter().filter(|r| r.scheduler == Scheduler::O2Batched).max_by_key(|r| r.size_bytes);
    if let Some(r) = big {
        println!(
            "Takeaway: with {} of directories (one CPU's private cache is {}, all together {}), O² runs at {:.2}× plain threads{}.",
            format_size(r.size_bytes),
            format_size(one),
            format_size(all),
            r.ratio_to_threads,
            if r.ratio_to_threads > 1.05 { ": lookups go where the directory is cached" } else { " here: the gain needs more data than one cache but fewer hops than this machine makes cheap" }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_note_names_only_what_lost_to_the_threads_beyond_noise() {
        let row = |scheduler, size_bytes, interval: Option<(f64, f64)>| Row {
            popularity: Popularity::Uniform,
            size_bytes,
            directories: 1,
            scheduler,
            min_lookups_per_s: 1.0,
            median_lookups_per_s: 1.0,
            max_lookups_per_s: 1.0,
            ratio_to_threads: 1.0,
            paired_ratio_to_threads: 1.0,
            paired_interval_to_threads: interval.map(|(low, high)| report::Interval {
                low,
                high,
                coverage: 0.969,
            }),
            placement: None,
        };
        let mib = 1 << 20;
        let rows = [
            row(Scheduler::Threads, mib, Some((1.0, 1.0))),
            row(Scheduler::Sharded, mib, Some((0.8, 0.9))), // not O²: not named
            row(Scheduler::O2, mib, Some((0.97, 1.02))),    // holds 1: noise
            row(Scheduler::O2Batched, mib, Some((0.90, 0.99))),
            row(Scheduler::O2, 64 * mib, Some((0.87, 0.94))),
        ];
        let note = beyond_noise(&rows, Popularity::Uniform);
        assert!(note.contains("96.9 % chance"), "{note}");
        assert!(note.ends_with("batched at 1M (0.90–0.99), o2 at 64M (0.87–0.94)"), "{note}");
        assert!(!note.contains("nowhere") && !note.contains("0.80"), "{note}");
        let even = [row(Scheduler::O2, mib, Some((0.97, 1.02)))];
        assert!(beyond_noise(&even, Popularity::Uniform).ends_with("nowhere"));
        let once = [row(Scheduler::O2, mib, None)];
        assert!(beyond_noise(&once, Popularity::Uniform).starts_with("one repetition"));
        assert!(beyond_noise(&rows, Popularity::Oscillating).starts_with("one repetition"), "no such rows");
    }

    #[test]
    fn lookups_find_every_name() {
        let dirs = Dirs::new(3);
        for how in [Lookup::Scan, Lookup::Hashed] {
            for d in 0..3 {
                for f in 0..ENTRIES {
                    assert_eq!(dirs.lookup(d, &name(d, f), how), Some(f));
                }
            }
            assert_eq!(dirs.lookup(0, &name(1, 0), how), None);
        }
    }

    #[test]
    fn rng_stays_in_range() {
        let mut rng = Rng(12345);
        for n in [1, 2, 16, 1000, 1 << 20] {
            for _ in 0..1000 {
                assert!(rng.below(n) < n);
            }
        }
    }

    #[test]
    fn default_sizes_span_the_caches() {
        let sizes = default_sizes(1 << 20, 2 << 20, 34 << 20, false);
        assert_eq!(sizes[0], 256 << 10);
        assert!(*sizes.last().unwrap() >= 34 << 20);
        assert!(sizes.contains(&(3 << 19)) && sizes.contains(&(3 << 20)), "{sizes:?}");
        assert!(sizes.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(default_sizes(1 << 20, 2 << 20, 34 << 20, true), vec![512 << 10, 3 << 20]);
    }
}
