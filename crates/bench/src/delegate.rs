//! `corehop bench delegate`: synchronous delegation against asynchronous, batched delegation,
//! next to a hand-written ring between the same two CPUs (the floor).
//!
//! A task on FROM has TO's worker run a small operation, many times, each way the runtime
//! offers: one `on` round trip per operation; `submit` then `wait` per operation; 64 `submit`s
//! in flight; and `submit_batch` of 1 to 256 operations per request. The floor is what a
//! request costs when nothing but a ring moves it: two threads pinned on the same CPUs, a
//! single-producer ring of requests each way with 64 in flight (no runtime, no closures, no
//! allocation). Every repetition measures every row once, in alternating order, with a fresh
//! runtime per row, and each row's figure is paired with the floor of its own repetition: the
//! host moves vCPUs between cache-distance bands from one moment to the next.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::{bail, Context};
use corehop_runtime::{on, submit, submit_batch, sys, CpuId, OsCpu, Pending, Runtime, Wake};
use crossbeam_utils::CachePadded;
use serde::Serialize;

use crate::pair::{MachineInfo, Pair, PairArgs};
use crate::report::{self, OutputArgs, Stats, Table};
use crate::switch::per_op;

/// Measure delegation (`on`, `submit`, batches of 1-256) against a raw ring between two CPUs.
///
/// Rows, each min/median/max over repetitions of ns per operation (within a repetition the
/// median of the means of 10 consecutive chunks), M operations/s at the median, and its ratio
/// to the ring floor taken in the same repetition (median over repetitions):
///
///   on            on(TO, op) from a task on FROM: a round trip per operation, 1 in flight
///   submit+wait   submit(TO, op) then wait: a request and a completion per operation
///   submit-64     64 submits in flight, then 64 waits
///   batch-N       submit_batch of N operations to TO, then wait (N = 1, 4, 16, 64, 256):
///                 one request and one completion per N operations
///   ring-64       the floor: a thread on FROM keeps 64 requests in flight through a padded
///                 single-producer ring to a thread on TO, which answers through another;
///                 the same operation, no runtime
///
/// The operation is the same everywhere (a multiply-add on its index); every row checks the
/// sum of its results. A waiting task yields its worker; the workers poll (Wake::Spin).
///
/// --json prints this stable shape:
///
///   { "machine": { "name", "source", "cpus", "from_cpu", "to_cpu", "from_os_cpu",
///                  "to_os_cpu", "clock" },
///     "ops_per_rep", "reps",
///     "results": [ { "name", "in_flight", "min_ns", "median_ns", "max_ns", "mops_per_s",
///                    "ring_median_ns", "ratio_to_ring" } ],
///     "best_batch": { "name", "mops_per_s", "ratio_to_ring" } }
///
/// --quick runs 2 048 operations per row and 2 repetitions; --plot draws M ops/s per row.
#[derive(clap::Args, Debug, Clone)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// --from (the CPU of the client task), --to (the CPU whose worker serves the operations).
    #[command(flatten)]
    pub pair: PairArgs,
    /// Operations per row per repetition (rounded up to whole batches). As many as `bench
    /// switch` makes round trips: on this development VM, long unbroken runs of round trips
    /// measure slower than short ones (docs/performance.md).
    #[arg(long, default_value_t = 20_000)]
    pub ops: u64,
    /// Repetitions: each measures every row once, with a fresh runtime per row.
    #[arg(long, default_value_t = 10)]
    pub reps: usize,
    /// --quick, --json, --plot.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// One row of the results, as printed by `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The row: `on`, `submit+wait`, `submit-64`, `batch-N` or `ring-64`.
    pub name: String,
    /// Operations in flight at once.
    pub in_flight: usize,
    /// Fewest ns per operation of any repetition.
    pub min_ns: f64,
    /// Median over repetitions of ns per operation.
    pub median_ns: f64,
    /// Most ns per operation of any repetition.
    pub max_ns: f64,
    /// Million operations per second at the median.
    pub mops_per_s: f64,
    /// The ring floor's median over the same repetitions.
    pub ring_median_ns: f64,
    /// Median over repetitions of (this row / the ring of the same repetition).
    pub ratio_to_ring: f64,
}

/// The batch row with the highest throughput.
#[derive(Debug, Clone, Serialize)]
pub struct Best {
    /// The row, `batch-N`.
    pub name: String,
    /// Its million operations per second at the median.
    pub mops_per_s: f64,
    /// Its median ratio to the same repetition's ring.
    pub ratio_to_ring: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    machine: MachineInfo,
    ops_per_rep: u64,
    reps: usize,
    results: Vec<Row>,
    best_batch: Option<Best>,
}

/// How one row moves its operations.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Way {
    On,
    SubmitWait,
    SubmitInFlight(usize),
    Batch(usize),
    Ring,
}

const RING_IN_FLIGHT: usize = 64;
const SUBMITS_IN_FLIGHT: usize = 64;

const ROWS: [(&str, Way); 9] = [
    ("on", Way::On),
    ("submit+wait", Way::SubmitWait),
    ("submit-64", Way::SubmitInFlight(SUBMITS_IN_FLIGHT)),
    ("batch-1", Way::Batch(1)),
    ("batch-4", Way::Batch(4)),
    ("batch-16", Way::Batch(16)),
    ("batch-64", Way::Batch(64)),
    ("batch-256", Way::Batch(256)),
    ("ring-64", Way::Ring),
];

impl Way {
    fn in_flight(self) -> usize {
        match self {
            Way::On | Way::SubmitWait => 1,
            Way::SubmitInFlight(n) | Way::Batch(n) => n,
            Way::Ring => RING_IN_FLIGHT,
        }
    }
}

/// The delegated operation: cheap, so that the figures are the cost of moving it.
#[inline(always)]
fn op(i: u64) -> u64 {
    black_box(i).wrapping_mul(3).wrapping_add(1)
}

/// What the results of operations `0..n` sum to.
fn expected_sum(n: u64) -> u64 {
    (0..n).map(op).fold(0, u64::wrapping_add)
}

struct Plan {
    pair: Pair,
    ops: u64,
    reps: usize,
}

/// `corehop bench delegate`: measures every row and the ring, prints the table (or JSON).
pub fn run(args: Args) -> anyhow::Result<()> {
    let report = measure(&args)?;
    if args.output.json {
        report::print_json(&report)?;
    } else {
        print!("{}", table(&report));
        println!("{}", takeaway(&report));
    }
    if let Some(path) = &args.output.plot {
        let bars: Vec<(String, f64)> =
            report.results.iter().map(|r| (r.name.clone(), r.mops_per_s)).collect();
        report::plot_bars(
            path,
            "delegation throughput vs a raw ring (same CPUs)",
            "M ops/s (median)",
            &bars,
        )?;
        if !args.output.json {
            println!("plot written to {}", path.display());
        }
    }
    Ok(())
}

fn plan(args: &Args) -> anyhow::Result<Plan> {
    let pair = args.pair.check("delegation")?;
    let (ops, reps) = if args.output.quick { (2_048, 2) } else { (args.ops, args.reps) };
    // A row of MAX_OPS takes minutes.
    report::check_range("--ops", ops, 1..=MAX_OPS)?;
    report::check_range("--reps", reps, 1..=report::MAX_REPS)?;
    Ok(Plan { pair, ops, reps })
}

const MAX_OPS: u64 = 1 << 32;

fn measure(args: &Args) -> anyhow::Result<Report> {
    let plan = plan(args)?;
    let mut samples: HashMap<&str, Vec<f64>> = HashMap::new();
    let mut ring_of_rep = Vec::with_capacity(plan.reps);
    let mut per_rep: Vec<HashMap<&str, f64>> = Vec::with_capacity(plan.reps);
    let bar = report::progress((plan.reps * ROWS.len()) as u64, "delegate");
    for rep in 0..plan.reps {
        let mut this_rep = HashMap::new();
        // Alternate the order, so that no row always follows the same one.
        let order: Vec<_> = if rep % 2 == 0 { ROWS.to_vec() } else { ROWS.iter().rev().copied().collect() };
        for (name, way) in order {
            bar.set_message(name);
            let ns = measure_one(&plan, way).with_context(|| format!("measuring {name}"))?;
            samples.entry(name).or_default().push(ns);
            this_rep.insert(name, ns);
            bar.inc(1);
        }
        ring_of_rep.push(this_rep["ring-64"]);
        per_rep.push(this_rep);
    }
    bar.finish_and_clear();
    let ring = Stats::of(&ring_of_rep).context("no ring figures")?;
    let results: Vec<Row> = ROWS
        .iter()
        .filter_map(|&(name, way)| {
            let stats = Stats::of(samples.get(name)?)?;
            let ratios: Vec<f64> = per_rep.iter().map(|r| r[name] / r["ring-64"]).collect();
            Some(Row {
                name: name.into(),
                in_flight: way.in_flight(),
                min_ns: stats.min,
                median_ns: stats.median,
                max_ns: stats.max,
                mops_per_s: 1e3 / stats.median,
                ring_median_ns: ring.median,
                ratio_to_ring: Stats::of(&ratios)?.median,
            })
        })
        .collect();
    let best_batch = results
        .iter()
        .filter(|r| r.name.starts_with("batch-"))
        .max_by(|a, b| a.mops_per_s.total_cmp(&b.mops_per_s))
        .map(|r| Best { name: r.name.clone(), mops_per_s: r.mops_per_s, ratio_to_ring: r.ratio_to_ring });
    let machine = plan.pair.info();
    Ok(Report { machine, ops_per_rep: plan.ops, reps: plan.reps, results, best_batch })
}

/// One repetition of one row: ns per operation, after checking that every operation ran once
/// with its own result.
fn measure_one(plan: &Plan, way: Way) -> anyhow::Result<f64> {
    // Whole batches (or windows) of operations.
    let group = way.in_flight() as u64;
    let n = plan.ops.div_ceil(group) * group;
    let (ns, sum) = match way {
        Way::Ring => {
            let (from_os, to_os) = plan.pair.os_ids();
            ring(from_os, to_os, n)?
        }
        _ => {
            let rt = Runtime::builder()
                .machine(plan.pair.machine.clone())
                .cpus([plan.pair.from, plan.pair.to])
                .wake(Wake::Spin)
                .build()?;
            let to = plan.pair.to;
            // A short run first: the worker's inbox, the allocator and the caches warm up.
            rt.block_on(plan.pair.from, move || delegate(way, to, group * 16))??;
            rt.block_on(plan.pair.from, move || delegate(way, to, n))??
        }
    };
    if sum != expected_sum(n) {
        bail!(
            "the results of {n} operations sum to {sum}, not {}: an operation was lost or ran twice",
            expected_sum(n)
        );
    }
    Ok(ns)
}

/// Runs operations `0..n` on `to` the way `way` says, from the task calling it; returns ns
/// per operation and the sum of the results.
fn delegate(way: Way, to: CpuId, n: u64) -> Result<(f64, u64), corehop_runtime::Error> {
    let mut sum = 0u64;
    let group = way.in_flight() as u64;
    let mut add = |v: u64| sum = sum.wrapping_add(v);
    let ns = match way {
        Way::On => per_op(n, |i| on(to, move || op(i)).map(&mut add))?,
        Way::SubmitWait => per_op(n, |i| submit(to, move || op(i))?.wait().map(&mut add))?,
        Way::SubmitInFlight(k) => {
            let mut window: Vec<Pending<u64>> = Vec::with_capacity(k);
            per_op(n / group, |g| {
                for i in g * group..(g + 1) * group {
                    window.push(submit(to, move || op(i))?);
                }
                for pending in window.drain(..) {
                    add(pending.wait()?);
                }
                Ok::<_, corehop_runtime::Error>(())
            })? / group as f64
        }
        Way::Batch(_) => {
            per_op(n / group, |g| {
                let batch = submit_batch((g * group..(g + 1) * group).map(|i| (to, move || op(i))))?;
                batch.wait()?.into_iter().for_each(&mut add);
                Ok::<_, corehop_runtime::Error>(())
            })? / group as f64
        }
        Way::Ring => unreachable!("the ring runs without a runtime"),
    };
    Ok((ns, sum))
}

/// A single-producer, single-consumer ring of non-zero words (zero marks a free slot), each
/// slot on a line of its own: the producer waits for its next slot to be free and fills it,
/// the consumer takes it and frees it. Two of them carry requests and answers.
struct Ring {
    slots: Box<[CachePadded<AtomicU64>]>,
}

impl Ring {
    fn new(slots: usize) -> Ring {
        Ring { slots: (0..slots).map(|_| CachePadded::new(AtomicU64::new(0))).collect() }
    }

    /// Puts `word` (non-zero) in slot `at`, once its reader has freed it.
    fn put(&self, at: u64, word: u64, stop: &AtomicBool) -> bool {
        let slot = &self.slots[at as usize % self.slots.len()];
        while slot.load(Ordering::Acquire) != 0 {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            sys::cpu_relax();
        }
        slot.store(word, Ordering::Release);
        true
    }

    /// Takes the word in slot `at`, if it has arrived, and frees the slot.
    fn take(&self, at: u64) -> Option<u64> {
        let slot = &self.slots[at as usize % self.slots.len()];
        let word = slot.load(Ordering::Acquire);
        (word != 0).then(|| {
            slot.store(0, Ordering::Release);
            word
        })
    }

    /// Takes answer number `*taken` if it has arrived: adds its value (the word less one) to
    /// `sum` and counts it.
    fn take_into(&self, taken: &mut u64, sum: &mut u64) -> bool {
        match self.take(*taken) {
            Some(word) => {
                *sum = sum.wrapping_add(word - 1);
                *taken += 1;
                true
            }
            None => false,
        }
    }
}

/// The floor: a thread on `from_os` sends operations `0..n` to a thread on `to_os` through
/// a ring with up to [`RING_IN_FLIGHT`] in flight, and takes the answers from another; ns
/// per operation (timed by [`per_op`]) and the sum of the answers.
fn ring(from_os: OsCpu, to_os: OsCpu, n: u64) -> anyhow::Result<(f64, u64)> {
    let (requests, answers) = (Ring::new(RING_IN_FLIGHT), Ring::new(RING_IN_FLIGHT));
    let (ready, stop) = (AtomicBool::new(false), AtomicBool::new(false));
    std::thread::scope(|s| {
        let server = s.spawn(|| -> std::io::Result<()> {
            let pinned = sys::pin_current_thread(to_os);
            if pinned.is_err() {
                stop.store(true, Ordering::Relaxed);
            }
            ready.store(true, Ordering::Release);
            pinned?;
            for at in 0..n {
                let request = loop {
                    if let Some(word) = requests.take(at) {
                        break word;
                    }
                    if stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    sys::cpu_relax();
                };
                // Requests carry i + 1 and answers op(i) + 1: zero marks a free slot.
                if !answers.put(at, op(request - 1).wrapping_add(1), &stop) {
                    return Ok(());
                }
            }
            Ok(())
        });
        let client = s.spawn(|| -> anyhow::Result<(f64, u64)> {
            let pinned = sys::pin_current_thread(from_os);
            while !ready.load(Ordering::Acquire) {
                sys::cpu_relax();
            }
            if let Err(e) = pinned {
                stop.store(true, Ordering::Relaxed);
                return Err(e.into());
            }
            let (mut answered, mut sum) = (0u64, 0u64);
            let ns = per_op(n, |i| {
                // Keep at most RING_IN_FLIGHT unanswered; take what has come meanwhile.
                while i - answered >= RING_IN_FLIGHT as u64 {
                    if !answers.take_into(&mut answered, &mut sum) {
                        sys::cpu_relax();
                    }
                }
                while answers.take_into(&mut answered, &mut sum) {}
                requests.put(i, i + 1, &stop).then_some(()).ok_or(())
            });
            while answered < n && !stop.load(Ordering::Relaxed) {
                if !answers.take_into(&mut answered, &mut sum) {
                    sys::cpu_relax();
                }
            }
            stop.store(true, Ordering::Relaxed);
            let ns = ns.map_err(|()| anyhow::anyhow!("the ring's server stopped"))?;
            Ok((ns, sum))
        });
        let result = client.join().map_err(|_| anyhow::anyhow!("ring client panicked"))?;
        server.join().map_err(|_| anyhow::anyhow!("ring server panicked"))??;
        result
    })
}

fn table(report: &Report) -> Table {
    let m = &report.machine;
    let mut t = Table::new(["row", "in flight", "min", "median", "max", "M ops/s", "ring floor", "x ring"])
        .title(format!(
        "delegation from cpu{} (kernel {}) to cpu{} (kernel {}) on {}: {} operations per row, {} repetitions",
        m.from_cpu, m.from_os_cpu, m.to_cpu, m.to_os_cpu, m.name, report.ops_per_rep, report.reps
    ));
    for r in &report.results {
        t.row([
            r.name.clone(),
            r.in_flight.to_string(),
            report::fmt_ns(r.min_ns),
            report::fmt_ns(r.median_ns),
            report::fmt_ns(r.max_ns),
            format!("{:.2}", r.mops_per_s),
            report::fmt_ns(r.ring_median_ns),
            format!("{:.2}", r.ratio_to_ring),
        ]);
    }
    t.note("min/median/max over repetitions of ns per operation; M ops/s at the median");
    t.note(format!(
        "ring floor: ring-64's median; x ring: median over repetitions of (row / ring-64 of the same repetition); \
         clock: {}",
        m.clock
    ));
    t
}

fn takeaway(report: &Report) -> String {
    let on = report.results.iter().find(|r| r.name == "on");
    match (&report.best_batch, on) {
        (Some(best), Some(on)) => format!(
            "takeaway: the best batch size ({}) moves {:.1} M ops/s, {:.2}x the ring floor's time per operation \
             and {:.1}x the throughput of synchronous on ({:.2} M ops/s)",
            best.name,
            best.mops_per_s,
            best.ratio_to_ring,
            best.mops_per_s / on.mops_per_s,
            on.mops_per_s
        ),
        _ => "takeaway: needs the batch and on rows".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_way_delivers_each_operation_once() {
        let rt = Runtime::builder().wake(Wake::Spin).build().unwrap();
        let (from, to) = (rt.cpus()[0], *rt.cpus().last().unwrap());
        for (name, way) in ROWS.into_iter().filter(|(_, w)| *w != Way::Ring) {
            let n = way.in_flight() as u64 * 5;
            let (ns, sum) = rt.block_on(from, move || delegate(way, to, n)).unwrap().unwrap();
            assert_eq!(sum, expected_sum(n), "{name}");
            assert!(ns > 0.0, "{name}");
        }
    }

    #[test]
    fn the_ring_answers_every_request_once() {
        let os = sys::affinity().unwrap();
        let (a, b) = (os[0], *os.last().unwrap());
        for n in [1, 63, 64, 65, 1000] {
            let (_, sum) = ring(a, b, n).unwrap();
            assert_eq!(sum, expected_sum(n), "n = {n}");
        }
    }
}
