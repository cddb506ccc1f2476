//! `corehop bench switch`: the fast-core-switching paper's gettid benchmark, done right.
//!
//! Every hop mechanism and wake-up is measured as round trips (there and back) between the
//! same two CPUs, side by side in one process, next to baselines taken in the same run:
//! - the **floor**, a raw cache-line round trip between two threads pinned on those CPUs (no
//!   mechanism can beat it: a hop has to move at least one line each way);
//! - the **floor with state**, the same with a second line behind the first, whose address
//!   the first carries: what any hand-off of state must pay (a message, then what it names);
//! - a plain **gettid** system call (what the paper's benchmark wrapped);
//! - a **yield** on one CPU: a hop's software cost (suspend, send, pick up, resume) with no
//!   line moving between CPUs.
//!
//! Each repetition rebuilds the runtimes and runs every variant once, and every variant's
//! figure is paired with a floor taken just before it, so the ratio holds even when the host
//! moves the CPUs around between repetitions (a VM's two vCPUs may share a core, a CCX, or
//! neither, and the floor with them varies 2-10x).

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use anyhow::{bail, Context};
use corehop_runtime::{on, sys, yield_now, CpuId, Mechanism, OsCpu, Runtime, Wake};
use serde::Serialize;

use crate::pair::{MachineInfo, Pair, PairArgs};
use crate::report::{self, OutputArgs, Stats, Table};

/// `hop`, inlined as `hop` is, so the measurement adds no frame.
///
/// # Safety
/// As for `corehop_runtime::hop`: the caller keeps nothing tied to its OS thread across it.
/// The measured tasks keep only numbers and timestamps.
#[inline(always)]
unsafe fn hop(cpu: CpuId) -> Result<(), corehop_runtime::Error> {
    // SAFETY: this function's contract.
    unsafe { corehop_runtime::hop(cpu) }
}

/// Measure hop round trips per mechanism and wake-up against the cache-line floor.
///
/// Rows (each: min/median/max over repetitions of the time per operation, and its ratio to
/// the floor: the median over repetitions of the figure divided by a floor taken just
/// before it; within a repetition, the time is the median of the means of 10 consecutive
/// chunks, so one interrupted vCPU does not inflate it):
///
///   floor                   cache-line round trip between two threads pinned on FROM and TO
///   floor-with-state        the same, but a message line each way, and each side then also
///                           takes a second line, elsewhere, whose address the message
///                           carries: what a hand-off of state costs with no software (a
///                           hop's bound)
///   gettid                  one plain gettid system call on FROM (no hop)
///   yield                   yield_now on FROM: a hop's software cost, no line moving
///   affinity                hop round trip, V1: the thread re-pins itself (sched_setaffinity)
///   handoff+spin            hop round trip, fiber handed over, idle worker polls (V4)
///   handoff+park            hop round trip, idle worker sleeps on a futex at once
///   handoff+spin-then-park  hop round trip, adaptive spin then futex; back-to-back round
///                           trips, so the target went idle moments ago
///   handoff+park-after-idle, handoff+spin-after-idle, handoff+spin-then-park-after-idle
///                           each round trip after the target sat idle for --idle-gap-us:
///                           the adaptive spin's two fixed arms (sleep at once: the CPU
///                           spends nothing; poll throughout: no wake-up to wait for) and
///                           the adaptive spin itself, which the park row bounds (it
///                           should not lose to sleeping at once)
///   hop-one-way             one Handoff+Spin hop, FROM to TO (TSC stamps on both sides)
///   on                      on(TO, f) delegation from a task on FROM; also calls per second
///
/// --json prints this stable shape:
///
///   { "machine": { "name", "source", "cpus", "from_cpu", "to_cpu", "from_os_cpu",
///                  "to_os_cpu", "clock" },
///     "results": [ { "name", "min_ns", "median_ns", "max_ns", "ratio_to_floor",
///                    "calls_per_s" (only for "on") } ] }
///
/// Times are ns per round trip (per call for gettid, yield and on, per hop for hop-one-way).
/// The slow variants (affinity, handoff+park, the after-idle rows) run a tenth of --iters per repetition.
///
/// --quick runs 300 round trips and 2 repetitions; --plot draws the medians as a bar chart.
/// --rows measures only the rows named (the floor is always measured: every ratio needs it).
#[derive(clap::Args, Debug, Clone)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// --from (the CPU the task starts on and returns to), --to (the CPU it hops to).
    #[command(flatten)]
    pub pair: PairArgs,
    /// Round trips per repetition for the fast variants (a tenth for the slow ones).
    #[arg(long, default_value_t = 20_000)]
    pub iters: u64,
    /// Repetitions: each rebuilds the runtimes and measures every variant once.
    #[arg(long, default_value_t = 10)]
    pub reps: usize,
    /// How long the target sits idle before each round trip of the after-idle rows, in µs (at
    /// most 100 000: those rows make a tenth of --iters round trips).
    #[arg(long, default_value_t = 20)]
    pub idle_gap_us: u64,
    /// Only these rows, comma-separated (e.g. `handoff+spin,yield`); all rows by default.
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(NAMES))]
    pub rows: Vec<String>,
    /// --quick, --json, --plot.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// One row of the results, as printed by `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The mechanism or baseline measured.
    pub name: String,
    /// Fastest repetition, ns per round trip (or per operation).
    pub min_ns: f64,
    /// Median repetition.
    pub median_ns: f64,
    /// Slowest repetition.
    pub max_ns: f64,
    /// Median over the same run's cache-line floor.
    pub ratio_to_floor: f64,
    /// Calls per second, for the rows that are calls (`on`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calls_per_s: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Report {
    machine: MachineInfo,
    results: Vec<Row>,
}

/// The variants, in table order.
const FLOOR: &str = "floor";
const FLOOR_WITH_STATE: &str = "floor-with-state";
const GETTID: &str = "gettid";
const YIELD: &str = "yield";
const AFFINITY: &str = "affinity";
const SPIN: &str = "handoff+spin";
const PARK: &str = "handoff+park";
const SPIN_THEN_PARK: &str = "handoff+spin-then-park";
const PARK_AFTER_IDLE: &str = "handoff+park-after-idle";
const SPIN_AFTER_IDLE: &str = "handoff+spin-after-idle";
const AFTER_IDLE: &str = "handoff+spin-then-park-after-idle";
const ONE_WAY: &str = "hop-one-way";
const ON: &str = "on";
const NAMES: [&str; 13] = [
    FLOOR,
    FLOOR_WITH_STATE,
    GETTID,
    YIELD,
    AFFINITY,
    SPIN,
    PARK,
    SPIN_THEN_PARK,
    PARK_AFTER_IDLE,
    SPIN_AFTER_IDLE,
    AFTER_IDLE,
    ONE_WAY,
    ON,
];

/// Slow variants run this fraction of the iterations.
const SLOW_DIVISOR: u64 = 10;

struct Plan {
    pair: Pair,
    iters: u64,
    reps: usize,
    idle_gap_ns: u64,
    /// The rows to measure, in table order.
    rows: Vec<&'static str>,
}

/// `corehop bench switch`: measures every mechanism and the floor, prints the table.
pub fn run(args: Args) -> anyhow::Result<()> {
    let report = measure(&args)?;
    if args.output.json {
        report::print_json(&report)?;
    } else {
        print!("{}", table(&report));
        println!("{}", takeaway(&report.results));
        if let Some(line) = after_idle(&report.results, args.idle_gap_us) {
            println!("{line}");
        }
    }
    if let Some(path) = &args.output.plot {
        let bars: Vec<(String, f64)> = report.results.iter().map(|r| (r.name.clone(), r.median_ns)).collect();
        report::plot_bars(path, "hop round trips vs the cache-line floor", "median ns", &bars)?;
        if !args.output.json {
            println!("plot written to {}", path.display());
        }
    }
    Ok(())
}

/// A quick run for `corehop tour`: compact table and a one-line takeaway.
pub fn tour() -> anyhow::Result<()> {
    let args = Args {
        pair: PairArgs::default(),
        iters: 2_000,
        reps: 3,
        idle_gap_us: 20,
        rows: vec![],
        output: OutputArgs::default(),
    };
    let report = measure(&args)?;
    let mut t = Table::new(["hop mechanism", "median", "x floor"]);
    for r in &report.results {
        t.row([r.name.clone(), report::fmt_ns(r.median_ns), format!("{:.1}", r.ratio_to_floor)]);
    }
    print!("{t}");
    println!("{}", takeaway(&report.results));
    if let Some(line) = after_idle(&report.results, args.idle_gap_us) {
        println!("{line}");
    }
    Ok(())
}

/// Round trips per repetition at most.
const MAX_ITERS: u64 = 10_000_000;
/// The after-idle rows' idle gap at most, in µs.
const MAX_IDLE_GAP_US: u64 = 100_000;

fn plan(args: &Args) -> anyhow::Result<Plan> {
    let pair = args.pair.check("a hop")?;
    let (iters, reps) = if args.output.quick { (300, 2) } else { (args.iters, args.reps) };
    // Every round trip's time is kept while a repetition runs: 8 bytes each.
    report::check_range("--iters", iters, 1..=MAX_ITERS)?;
    report::check_range("--reps", reps, 1..=report::MAX_REPS)?;
    report::check_range("--idle-gap-us", args.idle_gap_us, 0..=MAX_IDLE_GAP_US)?;
    Ok(Plan {
        pair,
        iters,
        reps,
        idle_gap_ns: args.idle_gap_us * 1_000,
        rows: NAMES
            .into_iter()
            .filter(|&name| name == FLOOR || args.rows.is_empty() || args.rows.iter().any(|r| r == name))
            .collect(),
    })
}

fn measure(args: &Args) -> anyhow::Result<Report> {
    let plan = plan(args)?;
    let mut samples: HashMap<&str, Vec<f64>> = HashMap::new();
    let mut ratios: HashMap<&str, Vec<f64>> = HashMap::new();
    let paired_floor_iters = (plan.iters / 4).max(100);
    let (from_os, to_os) = plan.pair.os_ids();
    let bar = report::progress(plan.reps as u64, "switch");
    for _ in 0..plan.reps {
        for &name in &plan.rows {
            bar.set_message(name);
            let floor_ns = match name {
                FLOOR => None,
                _ => Some(floor(from_os, to_os, paired_floor_iters).context("measuring the floor")?),
            };
            let ns = measure_one(&plan, name).with_context(|| format!("measuring {name}"))?;
            samples.entry(name).or_default().push(ns);
            ratios.entry(name).or_default().push(floor_ns.map_or(1.0, |f| ns / f));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let results = plan
        .rows
        .iter()
        .filter_map(|name| {
            let stats = Stats::of(samples.get(name)?)?;
            Some(Row {
                name: name.to_string(),
                min_ns: stats.min,
                median_ns: stats.median,
                max_ns: stats.max,
                ratio_to_floor: Stats::of(ratios.get(name)?)?.median,
                calls_per_s: (*name == ON).then(|| 1e9 / stats.median),
            })
        })
        .collect();
    let machine = plan.pair.info();
    Ok(Report { machine, results })
}

/// One repetition of one variant: ns per operation. Every runtime variant gets a fresh
/// runtime, so none inherits another's scheduler history.
fn measure_one(plan: &Plan, name: &str) -> anyhow::Result<f64> {
    let slow = (plan.iters / SLOW_DIVISOR).max(1);
    let spin = || runtime(plan, Mechanism::Handoff, Wake::Spin);
    let (from_os, to_os) = plan.pair.os_ids();
    match name {
        FLOOR => floor(from_os, to_os, plan.iters),
        FLOOR_WITH_STATE => floor_with_state(from_os, to_os, plan.iters),
        GETTID => gettid(from_os, plan.iters),
        YIELD => yields(&spin()?, plan),
        AFFINITY => round_trips(plan, Mechanism::Affinity, Wake::Park, slow, 0),
        SPIN => round_trips_on(&spin()?, plan, plan.iters, 0),
        PARK => round_trips(plan, Mechanism::Handoff, Wake::Park, slow, 0),
        SPIN_THEN_PARK => round_trips(plan, Mechanism::Handoff, Wake::SpinThenPark, plan.iters, 0),
        // Slow too: each round trip first waits out the idle gap.
        PARK_AFTER_IDLE => round_trips(plan, Mechanism::Handoff, Wake::Park, slow, plan.idle_gap_ns),
        SPIN_AFTER_IDLE => round_trips(plan, Mechanism::Handoff, Wake::Spin, slow, plan.idle_gap_ns),
        AFTER_IDLE => round_trips(plan, Mechanism::Handoff, Wake::SpinThenPark, slow, plan.idle_gap_ns),
        ONE_WAY => one_way_hops(&spin()?, plan),
        ON => on_calls(&spin()?, plan),
        other => bail!("unknown variant {other}"),
    }
}

fn runtime(plan: &Plan, mechanism: Mechanism, wake: Wake) -> anyhow::Result<Runtime> {
    Ok(Runtime::builder()
        .machine(plan.pair.machine.clone())
        .cpus([plan.pair.from, plan.pair.to])
        .mechanism(mechanism)
        .wake(wake)
        .build()?)
}

fn round_trips(
    plan: &Plan,
    mechanism: Mechanism,
    wake: Wake,
    iters: u64,
    gap_ns: u64,
) -> anyhow::Result<f64> {
    let rt = runtime(plan, mechanism, wake)?;
    round_trips_on(&rt, plan, iters, gap_ns)
}

/// Mean ns per hop there and back, after a warm-up (which also trains the spin budget). With
/// a gap, the task waits `gap_ns` on FROM before each round trip, so TO has been idle that
/// long, and only the round trips are timed.
fn round_trips_on(rt: &Runtime, plan: &Plan, iters: u64, gap_ns: u64) -> anyhow::Result<f64> {
    let (from, to) = (plan.pair.from, plan.pair.to);
    let warmup = (iters / 10).max(1);
    // SAFETY, for every hop below: the task keeps only numbers and timestamps across them.
    let ns = rt.block_on(from, move || -> Result<f64, corehop_runtime::Error> {
        for _ in 0..warmup {
            wait_ns(gap_ns);
            unsafe { hop(to) }?;
            unsafe { hop(from) }?;
        }
        if gap_ns == 0 {
            return per_op(iters, |_| {
                unsafe { hop(to) }?;
                unsafe { hop(from) }
            });
        }
        let mut ns = Vec::with_capacity(iters as usize);
        for _ in 0..iters {
            wait_ns(gap_ns);
            let t0 = sys::now_ns();
            unsafe { hop(to) }?;
            unsafe { hop(from) }?;
            ns.push(sys::now_ns() - t0);
        }
        Ok(median_of_chunk_means(&ns))
    })??;
    Ok(ns)
}

fn wait_ns(ns: u64) {
    if ns > 0 {
        let start = sys::now_ns();
        while sys::now_ns() - start < ns {
            sys::cpu_relax();
        }
    }
}

/// Mean ns of one hop FROM -> TO, stamped with the TSC on both sides.
fn one_way_hops(rt: &Runtime, plan: &Plan) -> anyhow::Result<f64> {
    let (from, to, iters) = (plan.pair.from, plan.pair.to, plan.iters);
    // SAFETY, for both hops below: the task keeps only numbers and timestamps across them.
    let ns = rt.block_on(from, move || -> Result<f64, corehop_runtime::Error> {
        let mut ns = Vec::with_capacity(iters as usize);
        for _ in 0..iters {
            let t0 = sys::now_ns();
            unsafe { hop(to) }?;
            ns.push(sys::now_ns().saturating_sub(t0));
            unsafe { hop(from) }?;
        }
        Ok(median_of_chunk_means(&ns))
    })??;
    Ok(ns)
}

/// Mean ns per `yield_now` of a task alone on FROM: everything a hop does but move lines.
fn yields(rt: &Runtime, plan: &Plan) -> anyhow::Result<f64> {
    let (from, iters) = (plan.pair.from, plan.iters);
    let ns = rt.block_on(from, move || -> Result<f64, corehop_runtime::Error> {
        per_op(iters, |_| yield_now())
    })??;
    Ok(ns)
}

/// Mean ns per `on(TO, f)` call from a task on FROM.
fn on_calls(rt: &Runtime, plan: &Plan) -> anyhow::Result<f64> {
    let (from, to, iters) = (plan.pair.from, plan.pair.to, plan.iters);
    let ns = rt.block_on(from, move || -> Result<f64, corehop_runtime::Error> {
        per_op(iters, |i| {
            black_box(on(to, || black_box(i))?);
            Ok(())
        })
    })??;
    Ok(ns)
}

/// Chunks a repetition's operations are split into (see [`per_op`]).
const CHUNKS: u64 = 10;

/// Ns per operation of `iters` operations (`op(i)` runs the i-th), as the median of the
/// means of [`CHUNKS`] consecutive chunks, timed at chunk boundaries only: one interruption
/// of a vCPU (the host can take it away for milliseconds) would otherwise inflate a short
/// run a hundredfold, and with it every ratio it takes part in. An error stops the run.
pub(crate) fn per_op<E>(iters: u64, mut op: impl FnMut(u64) -> Result<(), E>) -> Result<f64, E> {
    let size = iters.div_ceil(CHUNKS).max(1);
    let mut means = Vec::with_capacity(CHUNKS as usize);
    let (mut t0, mut in_chunk) = (sys::now_ns(), 0);
    for i in 0..iters {
        op(i)?;
        in_chunk += 1;
        if in_chunk == size || i + 1 == iters {
            let now = sys::now_ns();
            means.push((now - t0) as f64 / in_chunk as f64);
            (t0, in_chunk) = (now, 0);
        }
    }
    Ok(report::percentile(&means, 50.0).unwrap_or(f64::NAN))
}

/// The same for operations that time themselves: the median of the means of [`CHUNKS`]
/// consecutive chunks of `ns` (one entry per operation).
fn median_of_chunk_means(ns: &[u64]) -> f64 {
    let size = (ns.len() as u64).div_ceil(CHUNKS).max(1) as usize;
    let means: Vec<f64> = ns.chunks(size).map(|c| c.iter().sum::<u64>() as f64 / c.len() as f64).collect();
    report::percentile(&means, 50.0).unwrap_or(f64::NAN)
}

/// Ns per cache-line round trip between two threads pinned on the two CPUs: one line, which
/// carries the message both ways.
pub fn floor(from_os: OsCpu, to_os: OsCpu, iters: u64) -> anyhow::Result<f64> {
    #[repr(align(128))]
    struct Line(AtomicU64);
    let line = Line(AtomicU64::new(0));
    ping_pong(from_os, to_os, iters, &|_| &line.0, &|_| {}, &|seq| line.0.store(seq, Ordering::Release))
}

/// Ns per round trip between a thread on `from_os` and one on `to_os` that take turns.
/// Message `n` (odd ones go to `to_os`, even ones back, from 1 on) travels in the line
/// `line(n)`, which holds 0 at first: each side waits until its line shows its turn, runs
/// `take(n)` (what receiving costs beyond the message), then `send(n + 1)`, which must end
/// by storing that number into `line(n + 1)`. Timed by [`per_op`].
fn ping_pong<'a>(
    from_os: OsCpu,
    to_os: OsCpu,
    iters: u64,
    line: &(dyn Fn(u64) -> &'a AtomicU64 + Sync),
    take: &(dyn Fn(u64) + Sync),
    send: &(dyn Fn(u64) + Sync),
) -> anyhow::Result<f64> {
    // Either side that fails to pin says so, and the other stops waiting for it.
    let (ready, failed) = (AtomicBool::new(false), AtomicBool::new(false));
    let wait_for = |n: u64| -> bool {
        let seq = line(n);
        while seq.load(Ordering::Acquire) != n {
            if failed.load(Ordering::Relaxed) {
                return false;
            }
            sys::cpu_relax();
        }
        take(n);
        true
    };
    let pin = |os_cpu| sys::pin_current_thread(os_cpu).inspect_err(|_| failed.store(true, Ordering::Relaxed));
    std::thread::scope(|s| {
        let responder = s.spawn(|| -> std::io::Result<()> {
            let pinned = pin(to_os);
            ready.store(true, Ordering::Release);
            pinned?;
            for i in 0..iters {
                if !wait_for(2 * i + 1) {
                    break;
                }
                send(2 * i + 2);
            }
            Ok(())
        });
        let initiator = s.spawn(|| -> std::io::Result<f64> {
            pin(from_os)?;
            while !ready.load(Ordering::Acquire) {
                sys::cpu_relax();
            }
            // A failed responder stops the run; its error is the one reported.
            Ok(per_op(iters, |i| {
                send(2 * i + 1);
                wait_for(2 * i + 2).then_some(()).ok_or(())
            })
            .unwrap_or(f64::NAN))
        });
        let ns = initiator.join().map_err(|_| anyhow::anyhow!("floor thread panicked"))?;
        responder.join().map_err(|_| anyhow::anyhow!("floor thread panicked"))??;
        Ok(ns?)
    })
}

/// Mean ns per round trip of a message that names a state line, which the receiver then
/// reads and writes before answering, and names in turn: a hand-off of state (the message,
/// then what it names; the state travels like a task's stack, written where it is and taken
/// where it goes), with no software around it. Each direction has a message line of its own,
/// as a runtime's lanes do, and the state lives apart from them (on the heap), as a task's
/// stack lives apart from a mailbox.
///
/// Where the state lies matters more than how the messages travel. On the development VM,
/// near band: 2.2x the floor as here, the same with one message line for both directions,
/// but 1.3x with the state line on the stack right next to the message lines, where the
/// hardware prefetchers bring it along with them (a hop cannot arrange that for its stack).
fn floor_with_state(from_os: OsCpu, to_os: OsCpu, iters: u64) -> anyhow::Result<f64> {
    #[repr(align(128))]
    struct Message {
        seq: AtomicU64,
        /// Which line the state is in: an address the receiver learns only from the message.
        state: AtomicUsize,
    }
    #[repr(align(128))]
    struct State(AtomicU64);
    let states: Box<[State]> = Box::new([State(AtomicU64::new(0))]);
    let new = || Message { seq: AtomicU64::new(0), state: AtomicUsize::new(0) };
    let (there, back) = (new(), new());
    let message = |n: u64| if n % 2 == 1 { &there } else { &back };
    // Receiving: read and write the named line, as a resumed task does its stack.
    let take = |n: u64| {
        let line = &states[message(n).state.load(Ordering::Relaxed)].0;
        line.store(line.load(Ordering::Relaxed) ^ n, Ordering::Relaxed);
    };
    // Sending: name the line just taken (it is here now, as a task's stack is).
    let send = |n: u64| {
        message(n).state.store(0, Ordering::Relaxed);
        message(n).seq.store(n, Ordering::Release);
    };
    ping_pong(from_os, to_os, iters, &|n| &message(n).seq, &take, &send)
}

/// Mean ns per plain gettid system call on a thread pinned on `os_cpu`.
fn gettid(os_cpu: OsCpu, iters: u64) -> anyhow::Result<f64> {
    std::thread::scope(|s| {
        s.spawn(|| -> anyhow::Result<f64> {
            sys::pin_current_thread(os_cpu)?;
            let ns = per_op(iters, |_| {
                black_box(sys::gettid());
                Ok::<_, std::convert::Infallible>(())
            });
            Ok(ns?)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("gettid thread panicked"))?
    })
}

fn table(report: &Report) -> Table {
    let m = &report.machine;
    let mut t = Table::new(["variant", "min", "median", "max", "x floor", "calls/s"]).title(format!(
        "hop round trips between cpu{} (kernel {}) and cpu{} (kernel {}) on {}",
        m.from_cpu, m.from_os_cpu, m.to_cpu, m.to_os_cpu, m.name
    ));
    for r in &report.results {
        t.row([
            r.name.clone(),
            report::fmt_ns(r.min_ns),
            report::fmt_ns(r.median_ns),
            report::fmt_ns(r.max_ns),
            format!("{:.2}", r.ratio_to_floor),
            r.calls_per_s.map(report::fmt_rate).unwrap_or_default(),
        ]);
    }
    t.note("min/median/max over repetitions of the mean per round trip (per call: gettid, yield, on; per hop: hop-one-way)");
    t.note(format!(
        "x floor = median over repetitions of (figure / a cache-line floor taken just before it); clock: {}",
        m.clock
    ));
    if let Some(floor) = report.results.iter().find(|r| r.name == FLOOR) {
        if floor.max_ns > NOISY_SPREAD * floor.min_ns {
            t.note(format!(
                "note: the floor varied {:.0}x between repetitions: other work shared these CPUs or the host \
                 moved them (a VM's vCPUs may share a core, a CCX, or neither); x floor pairs each figure \
                 with its own floor",
                floor.max_ns / floor.min_ns
            ));
        }
    }
    t
}

/// A floor whose max is this many times its min means the CPUs were shared during the run.
const NOISY_SPREAD: f64 = 3.0;

fn median_of(rows: &[Row], name: &str) -> Option<f64> {
    rows.iter().find(|r| r.name == name).map(|r| r.median_ns)
}

fn takeaway(rows: &[Row]) -> String {
    let ratio = |name| rows.iter().find(|r| r.name == name).map(|r| r.ratio_to_floor);
    let median = |name| median_of(rows, name);
    match (
        ratio(SPIN),
        ratio(FLOOR_WITH_STATE),
        ratio(YIELD),
        median(AFFINITY),
        median(SPIN),
        ratio(SPIN_THEN_PARK),
    ) {
        (Some(spin), Some(bound), Some(software), Some(affinity), Some(spin_ns), Some(stp)) => format!(
            "takeaway: a Handoff+Spin hop round trip costs {spin:.1}x the cache-line floor (moving a task's \
             state at all costs {bound:.1}x, the software of two hops {:.1}x) and is {:.0}x faster than \
             sched_setaffinity (V1); spin-then-park right after idle costs {stp:.1}x the floor",
            2.0 * software,
            affinity / spin_ns,
        ),
        _ => "takeaway: needs every row (this run measured only some, see --rows)".into(),
    }
}

/// How the adaptive spin did after an idle gap against its two fixed arms, if all three ran.
fn after_idle(rows: &[Row], gap_us: u64) -> Option<String> {
    let (park, spin, adaptive) =
        (median_of(rows, PARK_AFTER_IDLE)?, median_of(rows, SPIN_AFTER_IDLE)?, median_of(rows, AFTER_IDLE)?);
    Some(format!(
        "after {gap_us} µs idle: spin-then-park {} a round trip, {:.2}x sleeping at once ({}; the arm that \
         spends no CPU) and {:.1}x polling throughout ({}; the arm that never waits for a wake-up)",
        report::fmt_ns(adaptive),
        adaptive / park,
        report::fmt_ns(park),
        adaptive / spin,
        report::fmt_ns(spin),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_interrupted_chunk_does_not_move_the_figure() {
        let mut ns = vec![100u64; 1000];
        ns[500] = 5_000_000; // a vCPU taken away for 5 ms during one operation
        assert_eq!(median_of_chunk_means(&ns), 100.0);
        // Uneven chunks still cover every operation.
        assert_eq!(median_of_chunk_means(&[7; 13]), 7.0);
        assert!(median_of_chunk_means(&[]).is_nan());
    }

    #[test]
    fn per_op_runs_every_operation_and_stops_at_an_error() {
        let mut ran = vec![];
        let ns = per_op(25, |i| {
            ran.push(i);
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(ran, (0..25).collect::<Vec<_>>());
        assert!(ns >= 0.0);
        let mut count = 0;
        assert_eq!(
            per_op(25, |i| {
                count += 1;
                if i == 3 {
                    Err("stop")
                } else {
                    Ok(())
                }
            }),
            Err("stop")
        );
        assert_eq!(count, 4);
    }
}
