//! `corehop bench modes`: SMT modes live — UP, SMP, AMP and the hybrid side by side on the
//! same SMT core, with "interrupts" (service work) arriving at a fixed rate.
//!
//! Two synthetic applications stand for the paper's two kinds: `fp` (independent
//! floating-point chains, which fill a core's FP units alone: pro-UNI on real SMT) and `chase`
//! (a pointer chase through 16 MiB, which leaves the core idle on every miss: pro-SMT). Each is
//! first classed by measurement (`corehop_policy::smt::Classifier`: alone vs co-running, both
//! instances' slowdown counted); the hybrid then runs each in the mode its class prefers.
//!
//! The same-run baseline is UP: the same work on one context per core (the siblings unused),
//! service work interleaved with it. Where the machine has no SMT this benchmark cannot
//! measure anything meaningful and says so, pointing to the simulator; `--machine FILE` runs
//! the live logic on a described layout (e.g. two separate cores declared siblings), which is
//! labelled emulated: its numbers show the mechanism, not SMT interference.
//!
//! `--json` shape, when measured: `{ "supported": true, "machine", "emulated", "classes":
//! [{app, class, weighted_speedup, own, partner}], "modes": [{mode, makespan_ms: {min, median,
//! max, samples}, vs_up, fp_ms, chase_ms, service_p50_us, service_p99_us, service_dropped}] }`; when not:
//! `{ "supported": false, "reason", "see" }`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use corehop_policy::smt::{
    Class, Classification, Classifier, CoRun, Hybrid, HybridConfig, Mode, Sample, SmtLayout,
};
use corehop_runtime::service::thread_cpu_ns;
use corehop_runtime::smt::{SmtRuntime, Step};
use corehop_runtime::sys;
use corehop_sim::{models, ScenarioDoc};
use corehop_topology::{CpuId, Machine};

use crate::report::{self, percentile, OutputArgs, Stats, Table};

/// Where to look instead on a machine without SMT.
pub const SIM_HINT: &str = "corehop sim scenarios/smt-modes.toml";

/// SMT modes live: UP vs SMP vs AMP vs the hybrid, where the machine has SMT.
///
/// Classes two synthetic applications by measurement (alone vs co-running), then runs each
/// mode side by side with UP (one application per core, sibling idle) as the same-run
/// baseline. On a machine without SMT siblings it says so and points to the simulator
/// (`corehop sim scenarios/smt-modes.toml`); `--machine` runs the live logic on a described
/// SMT layout instead, labelled emulated.
///
/// --quick runs one repetition of 8 ms of work per thread (a second or two) instead of the
/// default 5 × 60 ms (about ten seconds). --plot draws the median makespan per mode.
///
/// --json prints `{"supported": true, "machine", "emulated", "classes": [{app, class,
/// weighted_speedup, own, partner}], "modes": [{mode, makespan_ms: {min, median, max,
/// samples}, vs_up, fp_ms, chase_ms, service_p50_us, service_p99_us, service_dropped}]}`;
/// without SMT: `{"supported": false, "reason", "see"}`.
#[derive(clap::Args)]
pub struct Args {
    /// Run on this machine description (TOML, see machines/README.md) instead of the discovered
    /// topology. CPUs it declares siblings are treated as one SMT core even if they are separate
    /// cores here (the run is then labelled emulated); its kernel CPU ids must be usable by
    /// this process. Example: machines/smt-emulated.toml declares CPUs 0 and 1 siblings.
    #[arg(long, value_name = "FILE")]
    pub machine: Option<PathBuf>,
    /// Repetitions of every mode; min/median/max are over these.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Work per application thread, in ms of running alone on a context.
    #[arg(long, default_value_t = 60.0)]
    pub work_ms: f64,
    /// Service items ("interrupts": offloaded calls, bottom halves) per second; 0 = none.
    #[arg(long, default_value_t = 10_000.0)]
    pub irq_rate: f64,
    /// Work per service item, µs (a checksum over a 64 KiB buffer, which also pollutes the
    /// cache of the context it runs on).
    #[arg(long, default_value_t = 8.0)]
    pub service_us: f64,
    /// --quick, --json, --plot.
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Serialize)]
struct Unsupported {
    supported: bool,
    reason: String,
    see: &'static str,
}

#[derive(Serialize)]
struct ClassRow {
    app: &'static str,
    class: Class,
    weighted_speedup: f64,
    own: f64,
    partner: f64,
}

#[derive(Serialize)]
struct ModeRow {
    mode: &'static str,
    makespan_ms: Stats,
    vs_up: f64,
    fp_ms: f64,
    chase_ms: f64,
    service_p50_us: f64,
    service_p99_us: f64,
    /// Service items dropped (backlog full), summed over repetitions.
    service_dropped: u64,
}

#[derive(Serialize)]
struct Measured {
    supported: bool,
    machine: String,
    emulated: bool,
    classes: Vec<ClassRow>,
    modes: Vec<ModeRow>,
}

/// `corehop bench modes`: measures, prints the tables (or JSON, or a plot).
pub fn run(args: Args) -> anyhow::Result<()> {
    report::check_range("--reps", args.reps, 1..=report::MAX_REPS)?;
    anyhow::ensure!(
        args.work_ms > 0.0 && args.work_ms <= report::MAX_RUN_MS as f64,
        "--work-ms must be > 0 and at most {}, got {}",
        report::MAX_RUN_MS,
        args.work_ms
    );
    anyhow::ensure!(
        args.irq_rate >= 0.0 && args.irq_rate.is_finite(),
        "--irq-rate must be >= 0, got {}",
        args.irq_rate
    );
    anyhow::ensure!(
        args.service_us > 0.0 && args.service_us.is_finite(),
        "--service-us must be > 0, got {}",
        args.service_us
    );
    let (machine, emulated) = match &args.machine {
        Some(path) => {
            let m = Machine::from_toml_file(path).with_context(|| format!("--machine {}", path.display()))?;
            (m, true)
        }
        None => (corehop_topology::discover().context("discovering this machine")?, false),
    };
    let layout = SmtLayout::from_machine(&machine);
    if !layout.has_smt() {
        let reason = format!(
            "{} has no SMT core (no two CPUs share a physical core{}), so AMP and SMP modes cannot be \
             measured live here",
            machine.name,
            if emulated { " in the description" } else { "" }
        );
        if let Some(path) = &args.output.plot {
            // Said on stderr, so that `--json` output stays one JSON document.
            eprintln!("corehop bench modes: no plot written to {}: nothing was measured", path.display());
        }
        if args.output.json {
            return report::print_json(&Unsupported { supported: false, reason, see: SIM_HINT });
        }
        println!("corehop bench modes: {reason}.");
        println!("Run the simulated experiment instead:  {SIM_HINT}");
        println!("Or exercise the live logic on a described SMT layout:  corehop bench modes --machine machines/smt-emulated.toml");
        return Ok(());
    }
    let plan = Plan::new(&args);
    let measured = measure(&machine, emulated, &plan, !args.output.json)?;
    if let Some(path) = &args.output.plot {
        let bars: Vec<(String, f64)> =
            measured.modes.iter().map(|m| (m.mode.to_string(), m.makespan_ms.median)).collect();
        report::plot_bars(path, "SMT modes: makespan (median)", "ms", &bars)?;
    }
    if args.output.json {
        return report::print_json(&measured);
    }
    print!("{}", render(&measured, &plan));
    Ok(())
}

/// What one run does, derived from the arguments.
struct Plan {
    reps: usize,
    work_ms: f64,
    irq_rate: f64,
    service_us: f64,
    /// Length of one task step, µs (mode switches and service work interleave at steps).
    step_us: f64,
    threads_per_app: usize,
}

impl Plan {
    fn new(args: &Args) -> Plan {
        let (reps, work_ms) =
            if args.output.quick { (1, args.work_ms.min(8.0)) } else { (args.reps, args.work_ms) };
        Plan {
            reps,
            work_ms,
            irq_rate: args.irq_rate,
            service_us: args.service_us,
            step_us: 100.0,
            threads_per_app: 2,
        }
    }
}

/// The synthetic applications.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum App {
    Fp,
    Chase,
}

impl App {
    const ALL: [App; 2] = [App::Fp, App::Chase];

    fn name(self) -> &'static str {
        match self {
            App::Fp => "fp",
            App::Chase => "chase",
        }
    }
}

/// Kernels calibrated so that one call of `units` runs about `step_us` alone.
struct Kernels {
    chase: Arc<Vec<u32>>,
    service_buf: Vec<u64>,
    fp_units: u64,
    chase_units: u64,
    service_units: u64,
}

fn fp_kernel(units: u64) -> f64 {
    // Eight independent chains: enough parallelism to keep FP units busy from one context.
    let mut acc = [1.0f64, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7];
    for _ in 0..units {
        for a in acc.iter_mut() {
            *a = *a * 0.999_999_9 + 1e-7;
        }
    }
    std::hint::black_box(acc.iter().sum())
}

fn chase_kernel(next: &[u32], units: u64, start: u32) -> u32 {
    let mut i = start;
    for _ in 0..units {
        i = next[i as usize];
    }
    std::hint::black_box(i)
}

/// Bytes of the buffer service work sums: enough to evict part of a core's L1 and L2.
const SERVICE_BUFFER: usize = 64 * 1024;

/// A checksum over `units` 1 KiB blocks of a 64 KiB buffer (wrapping): service work that
/// touches cache lines like a network bottom half copying packets.
fn service_kernel(buf: &[u64], units: u64) -> u64 {
    let blocks = buf.len() / 128;
    let mut sum = 0u64;
    for u in 0..units as usize {
        let block = &buf[(u % blocks) * 128..][..128];
        for &w in std::hint::black_box(block) {
            sum = sum.rotate_left(5) ^ w;
        }
    }
    std::hint::black_box(sum)
}

/// A single random cycle over `n` slots (Sattolo), so the chase visits every slot.
fn random_cycle(n: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x % i as u64) as usize;
        order.swap(i, j);
    }
    let mut next = vec![0u32; n];
    for w in 0..n {
        next[order[w] as usize] = order[(w + 1) % n];
    }
    next
}

/// Units of `kernel` that take about `target_us` of CPU time (not wall time: on a loaded
/// machine the thread is preempted, and the work must not shrink with the load).
fn calibrate(target_us: f64, kernel: impl Fn(u64)) -> u64 {
    let tid = sys::gettid();
    // Wall time where /proc has no schedstat.
    let start = Instant::now();
    let cpu_us = || match thread_cpu_ns(tid) {
        Some(ns) => ns as f64 / 1e3,
        None => start.elapsed().as_secs_f64() * 1e6,
    };
    let mut units = 1u64;
    loop {
        let t = cpu_us();
        kernel(units);
        let us = cpu_us() - t;
        if us >= 2_000.0 || units >= 1 << 40 {
            return ((units as f64) * target_us / us.max(1e-3)).max(1.0) as u64;
        }
        units *= 2;
    }
}

impl Kernels {
    fn new(plan: &Plan) -> Kernels {
        let chase = Arc::new(random_cycle(4 << 20));
        let fp_units = calibrate(plan.step_us, |u| {
            fp_kernel(u);
        });
        let chase_units = calibrate(plan.step_us, |u| {
            chase_kernel(&chase, u, 0);
        });
        let service_buf: Vec<u64> = (0..SERVICE_BUFFER as u64 / 8).collect();
        let service_units = calibrate(plan.service_us, |u| {
            service_kernel(&service_buf, u);
        });
        Kernels { chase, service_buf, fp_units, chase_units, service_units }
    }

    /// One step of `app`, from chase position `pos` (returned updated).
    fn step(&self, app: App, pos: u32) -> u32 {
        match app {
            App::Fp => {
                fp_kernel(self.fp_units);
                pos
            }
            App::Chase => chase_kernel(&self.chase, self.chase_units, pos),
        }
    }
}

/// `machine` with only the first context of every core: the UP baseline (siblings disabled).
fn first_contexts(machine: &Machine) -> Machine {
    let layout = SmtLayout::from_machine(machine);
    let mut m = machine.clone();
    let keep: Vec<CpuId> = layout.groups().iter().map(|g| g.cpus[0]).collect();
    m.cpus = keep
        .iter()
        .enumerate()
        .filter_map(|(i, &c)| machine.cpu(c).map(|cpu| corehop_topology::Cpu { id: CpuId(i), ..cpu.clone() }))
        .collect();
    m.caches.clear();
    m.name = format!("{} (one context per core)", machine.name);
    m
}

/// Steps per second of `tasks` copies of `app` running for `window` in `mode`.
fn rate(
    machine: &Machine,
    mode: Mode,
    kernels: &Arc<Kernels>,
    app: App,
    tasks: usize,
    window: Duration,
) -> anyhow::Result<f64> {
    let rt = SmtRuntime::builder().machine(machine.clone()).mode(mode).build()?;
    let steps = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    for t in 0..tasks {
        let (k, steps, stop) = (kernels.clone(), steps.clone(), stop.clone());
        let mut pos = (t as u32) * 7919;
        rt.spawn(None, move |_| {
            pos = k.step(app, pos);
            steps.fetch_add(1, SeqCst);
            if stop.load(SeqCst) {
                Step::Done
            } else {
                Step::Continue
            }
        });
    }
    // Let both contexts start before counting.
    std::thread::sleep(window / 10);
    let s0 = steps.load(SeqCst);
    let t0 = Instant::now();
    std::thread::sleep(window);
    let done = steps.load(SeqCst) - s0;
    let per_task = done as f64 / t0.elapsed().as_secs_f64() / tasks as f64;
    stop.store(true, SeqCst);
    rt.wait_idle();
    Ok(per_task)
}

/// Classes `app` by measurement: one task alone on the application context (AMP, sibling
/// asleep) vs two tasks sharing the core (SMP); the partner is the second instance.
fn classify(
    machine: &Machine,
    kernels: &Arc<Kernels>,
    app: App,
    window: Duration,
) -> anyhow::Result<Classification> {
    let alone = rate(machine, Mode::Amp, kernels, app, 1, window)?;
    let shared = rate(
        machine,
        Mode::Smp,
        kernels,
        app,
        2 * SmtLayout::from_machine(machine).reserved().len(),
        window,
    )?;
    let corun = CoRun { alone, shared };
    Ok(Classifier::default().classify(&[Sample { app: corun, partner: corun }])?)
}

/// How one run is scheduled.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Scheme {
    Up,
    Static(Mode),
    Hybrid,
}

impl Scheme {
    const ALL: [Scheme; 4] =
        [Scheme::Up, Scheme::Static(Mode::Smp), Scheme::Static(Mode::Amp), Scheme::Hybrid];

    fn name(self) -> &'static str {
        match self {
            Scheme::Up => "UP",
            Scheme::Static(Mode::Smp) => "SMP",
            Scheme::Static(Mode::Amp) => "AMP",
            Scheme::Hybrid => "hybrid",
        }
    }
}

struct RunResult {
    makespan_ms: f64,
    app_ms: [f64; 2],
    service_delays_us: Vec<f64>,
    /// Service items dropped because the backlog was full.
    dropped: u64,
}

/// Service items waiting or running at most; beyond this new ones are dropped.
const MAX_BACKLOG: u64 = 64;

/// Runs both applications (`threads_per_app` tasks each) to completion under `scheme`, with
/// service work submitted at `irq_rate`.
fn run_once(
    machine: &Machine,
    scheme: Scheme,
    classes: [Class; 2],
    kernels: &Arc<Kernels>,
    plan: &Plan,
) -> anyhow::Result<RunResult> {
    let (m, mode) = match scheme {
        Scheme::Up => (first_contexts(machine), Mode::Smp),
        Scheme::Static(mode) => (machine.clone(), mode),
        Scheme::Hybrid => (machine.clone(), Mode::Amp),
    };
    let rt = Arc::new(SmtRuntime::builder().machine(m).mode(mode).build()?);
    let mut hybrid = match scheme {
        Scheme::Hybrid => {
            let mut h = Hybrid::new(HybridConfig { slice_ns: 2_000_000, switch_ns: 0, start: Mode::Amp })?;
            for (i, class) in classes.iter().enumerate() {
                h.admit(i as u64, *class)?;
            }
            Some(h)
        }
        _ => None,
    };
    let steps = (plan.work_ms * 1000.0 / plan.step_us).ceil() as u64;
    let left: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let finished: Arc<Mutex<[Option<Instant>; 2]>> = Arc::default();
    let t0 = Instant::now();
    for (a, app) in App::ALL.into_iter().enumerate() {
        let home = hybrid.as_ref().and_then(|h| h.mode_of(a as u64)).filter(|_| classes[a] != Class::Any);
        for t in 0..plan.threads_per_app {
            left[a].fetch_add(1, SeqCst);
            let (k, left, finished) = (kernels.clone(), left.clone(), finished.clone());
            let mut pos = (t as u32) * 104_729;
            let mut todo = steps;
            rt.spawn(home, move |_| {
                pos = k.step(app, pos);
                todo -= 1;
                if todo > 0 {
                    return Step::Continue;
                }
                if left[a].fetch_sub(1, SeqCst) == 1 {
                    finished.lock().unwrap_or_else(|e| e.into_inner())[a] = Some(Instant::now());
                }
                Step::Done
            });
        }
    }
    // Service work at a steady rate, as interrupts would arrive.
    let delays: Arc<Mutex<Vec<f64>>> = Arc::default();
    let backlog = Arc::new(AtomicU64::new(0));
    let mut dropped = 0u64;
    let all_done = || left.iter().all(|l| l.load(SeqCst) == 0);
    let gap = (plan.irq_rate > 0.0).then(|| Duration::from_secs_f64(1.0 / plan.irq_rate));
    let mut next_irq = Instant::now();
    let origin = rt.layout().cpus_for(corehop_policy::smt::Work::App, Mode::Amp)[0];
    while !all_done() {
        let now = Instant::now();
        if let Some(gap) = gap {
            while next_irq <= now {
                next_irq += gap;
                // A full backlog drops the item, as a NIC ring drops packets: an overloaded
                // service path must not starve the applications forever.
                if backlog.load(SeqCst) >= MAX_BACKLOG {
                    dropped += 1;
                    continue;
                }
                backlog.fetch_add(1, SeqCst);
                let (k, delays, backlog, submitted) =
                    (kernels.clone(), delays.clone(), backlog.clone(), Instant::now());
                rt.submit_service(origin, move || {
                    let waited = submitted.elapsed().as_secs_f64() * 1e6;
                    service_kernel(&k.service_buf, k.service_units);
                    delays.lock().unwrap_or_else(|e| e.into_inner()).push(waited);
                    backlog.fetch_sub(1, SeqCst);
                });
            }
        }
        if let Some(h) = &mut hybrid {
            for (a, l) in left.iter().enumerate() {
                if l.load(SeqCst) == 0 && h.class_of(a as u64).is_some() {
                    h.retire(a as u64)?;
                }
            }
            if let Some(switch) = h.tick(t0.elapsed().as_nanos() as u64) {
                rt.set_mode(switch.to)?;
            }
        }
        std::thread::sleep(gap.map_or(Duration::from_micros(500), |g| g.min(Duration::from_micros(500))));
    }
    rt.wait_idle();
    let fin = *finished.lock().unwrap_or_else(|e| e.into_inner());
    let ms = |i: Option<Instant>| i.map_or(f64::NAN, |i| (i - t0).as_secs_f64() * 1e3);
    let app_ms = [ms(fin[0]), ms(fin[1])];
    let delays = std::mem::take(&mut *delays.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(RunResult { makespan_ms: app_ms[0].max(app_ms[1]), app_ms, service_delays_us: delays, dropped })
}

fn measure(machine: &Machine, emulated: bool, plan: &Plan, show_progress: bool) -> anyhow::Result<Measured> {
    let kernels = Arc::new(Kernels::new(plan));
    let window = Duration::from_millis(if plan.reps == 1 { 30 } else { 150 });
    let bar =
        show_progress.then(|| report::progress((2 + plan.reps * Scheme::ALL.len()) as u64, "SMT modes"));
    let mut classes = Vec::new();
    for app in App::ALL {
        let c = classify(machine, &kernels, app, window)?;
        classes.push(ClassRow {
            app: app.name(),
            class: c.class,
            weighted_speedup: c.weighted_speedup,
            own: c.own,
            partner: c.partners,
        });
        if let Some(b) = &bar {
            b.inc(1);
        }
    }
    let class_of = [classes[0].class, classes[1].class];
    let mut runs: Vec<Vec<RunResult>> = Scheme::ALL.iter().map(|_| Vec::new()).collect();
    for _ in 0..plan.reps {
        // Modes interleaved within each repetition, so drift in the machine's load hits all alike.
        for (s, scheme) in Scheme::ALL.into_iter().enumerate() {
            runs[s].push(run_once(machine, scheme, class_of, &kernels, plan)?);
            if let Some(b) = &bar {
                b.inc(1);
            }
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let median = |v: Vec<f64>| Stats::of(&v).map_or(f64::NAN, |s| s.median);
    let up = median(runs[0].iter().map(|r| r.makespan_ms).collect());
    let modes = Scheme::ALL
        .iter()
        .zip(&runs)
        .map(|(scheme, rs)| {
            let makespan: Vec<f64> = rs.iter().map(|r| r.makespan_ms).collect();
            let delays: Vec<f64> = rs.iter().flat_map(|r| r.service_delays_us.iter().copied()).collect();
            let stats = Stats::of(&makespan).expect("at least one repetition");
            ModeRow {
                mode: scheme.name(),
                vs_up: stats.median / up,
                makespan_ms: stats,
                fp_ms: median(rs.iter().map(|r| r.app_ms[0]).collect()),
                chase_ms: median(rs.iter().map(|r| r.app_ms[1]).collect()),
                service_p50_us: percentile(&delays, 50.0).unwrap_or(f64::NAN),
                service_p99_us: percentile(&delays, 99.0).unwrap_or(f64::NAN),
                service_dropped: rs.iter().map(|r| r.dropped).sum(),
            }
        })
        .collect();
    Ok(Measured { supported: true, machine: machine.name.clone(), emulated, classes, modes })
}

fn render(m: &Measured, plan: &Plan) -> String {
    let mut out = String::new();
    if m.emulated {
        out.push_str(&format!(
            "EMULATED SMT on {}: the CPUs declared siblings may be separate cores here, so these numbers\n\
             show the mechanism (placement, sleeping, switching), not SMT interference.\n\n",
            m.machine
        ));
    }
    let mut classes = Table::new(["app", "class", "weighted speedup", "own (shared/alone)", "partner"])
        .title("Classes by measurement (alone vs co-running on one core)");
    for c in &m.classes {
        classes.row([
            c.app.to_string(),
            c.class.to_string(),
            format!("{:.2}", c.weighted_speedup),
            format!("{:.2}", c.own),
            format!("{:.2}", c.partner),
        ]);
    }
    classes.note("weighted speedup > 1.05: SMT-class; < 0.95: UNI-class; between: ANY");
    out.push_str(&classes.render());
    out.push('\n');
    let mut t = Table::new(["mode", "makespan min", "median", "max", "vs UP", "fp", "chase", "service p50", "p99", "dropped"])
        .title(format!(
            "Both apps ({} threads each, {:.0} ms of work per thread), service work {:.0}/s × {:.0} µs; {} repetition(s)",
            plan.threads_per_app, plan.work_ms, plan.irq_rate, plan.service_us, plan.reps
        ));
    for r in &m.modes {
        t.row([
            r.mode.to_string(),
            format!("{:.1} ms", r.makespan_ms.min),
            format!("{:.1} ms", r.makespan_ms.median),
            format!("{:.1} ms", r.makespan_ms.max),
            format!("{:.2}×", r.vs_up),
            format!("{:.1} ms", r.fp_ms),
            format!("{:.1} ms", r.chase_ms),
            report::fmt_ns(r.service_p50_us * 1e3),
            report::fmt_ns(r.service_p99_us * 1e3),
            r.service_dropped.to_string(),
        ]);
    }
    t.note(
        "baseline UP: the same work on one context per core, measured in the same run; vs UP < 1 is faster",
    );
    t.note(
        "service p50/p99: delay from submitting service work to it starting (AMP: on the reserved sibling)",
    );
    out.push_str(&t.render());
    out
}

/// The paper scenarios, shipped inside the binary so the tour runs from anywhere.
const SMT_MODES: &str = include_str!("../../../scenarios/smt-modes.toml");
const SMT_HYBRID: &str = include_str!("../../../scenarios/smt-hybrid.toml");
const SMT_VARIANCE: &str = include_str!("../../../scenarios/smt-variance.toml");

/// One simulated run: the scenario text with `sets` applied, its model metrics by name.
fn simulate(file: &str, text: &str, sets: &[String]) -> anyhow::Result<Vec<(String, f64)>> {
    let mut doc = ScenarioDoc::parse(file, text)?;
    for set in sets {
        doc.set(set)?;
    }
    // The tour picks single points itself; drop the file's sweeps.
    doc.set("sweep=[]")?;
    let report = models::run_scenario(&doc.validate()?, &mut |_| {})?;
    Ok(report.model.metrics.into_iter().map(|m| (m.name, m.value)).collect())
}

fn metric(metrics: &[(String, f64)], name: &str) -> anyhow::Result<f64> {
    metrics
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| *v)
        .with_context(|| format!("no {name} in the report"))
}

/// % change of completion time against UP for [SMP, AMP, hybrid]; `None` where not run.
type VsUp = [Option<f64>; 3];

/// The simulated paper experiments, as % change of completion time against UP.
struct Simulated {
    /// (experiment, ours, the paper's).
    rows: Vec<(&'static str, VsUp, VsUp)>,
    /// Mean iteration CV (%) over seeds: [AMP quiet, AMP irq, SMP quiet, SMP irq].
    cv: [f64; 4],
}

fn simulated() -> anyhow::Result<Simulated> {
    let pct = |x: f64, base: f64| 100.0 * (x / base - 1.0);
    let modes = |only: &str, rate: u32| -> anyhow::Result<VsUp> {
        let at = |mode: &str| -> anyhow::Result<f64> {
            let sets = [
                format!("workload.only={only}"),
                format!("workload.interrupt_rate_per_s={rate}"),
                format!("workload.mode={mode}"),
            ];
            metric(&simulate("smt-modes.toml", SMT_MODES, &sets)?, "makespan")
        };
        let up = at("up")?;
        Ok([Some(pct(at("smp")?, up)), Some(pct(at("amp")?, up)), None])
    };
    let hybrid_at = |mode: &str| -> anyhow::Result<f64> {
        metric(&simulate("smt-hybrid.toml", SMT_HYBRID, &[format!("workload.mode={mode}")])?, "makespan")
    };
    let up = hybrid_at("up")?;
    let hybrid = [
        Some(pct(hybrid_at("smp")?, up)),
        Some(pct(hybrid_at("amp")?, up)),
        Some(pct(hybrid_at("hybrid")?, up)),
    ];
    // Paper: Tables 1 and 2 (4 threads), Table 5 (Art then Mesa, with network), computed from
    // the completion times printed there (some printed percentages use another base).
    let rows = vec![
        ("art (pro-UNI), no interrupts", modes("art", 0)?, [Some(1.96), Some(0.19), None]),
        ("art (pro-UNI), interrupts", modes("art", 10_000)?, [Some(8.16), Some(-8.16), None]),
        ("mesa (pro-SMT), no interrupts", modes("mesa", 0)?, [Some(-21.04), Some(6.57), None]),
        ("mesa (pro-SMT), interrupts", modes("mesa", 10_000)?, [Some(-26.07), Some(-4.33), None]),
        ("art then mesa, interrupts", hybrid, [Some(-19.29), Some(-5.09), Some(-22.52)]),
    ];
    let mut cv = [0.0; 4];
    for (i, (mode, rate)) in
        [("amp", 0), ("amp", 10_000), ("smp", 0), ("smp", 10_000)].into_iter().enumerate()
    {
        let seeds = 1..=3;
        for seed in seeds.clone() {
            let sets = [
                format!("workload.mode={mode}"),
                format!("workload.interrupt_rate_per_s={rate}"),
                format!("seed={seed}"),
            ];
            cv[i] += metric(&simulate("smt-variance.toml", SMT_VARIANCE, &sets)?, "iteration_cv")?
                / seeds.clone().count() as f64;
        }
    }
    Ok(Simulated { rows, cv })
}

fn tour_table(s: &Simulated) -> Table {
    let cell = |ours: Option<f64>, paper: Option<f64>| match (ours, paper) {
        (Some(o), Some(p)) => format!("{o:+.1}% [{p:+.1}%]"),
        (Some(o), None) => format!("{o:+.1}%"),
        _ => "-".to_string(),
    };
    let mut t = Table::new(["experiment", "SMP", "AMP", "hybrid"]).title(
        "SMT modes, simulated on one hyper-threaded core: completion time vs UP [paper]; corehop sim scenarios/smt-*.toml",
    );
    for (name, ours, paper) in &s.rows {
        t.row([name.to_string(), cell(ours[0], paper[0]), cell(ours[1], paper[1]), cell(ours[2], paper[2])]);
    }
    let [amp_quiet, amp_irq, smp_quiet, smp_irq] = s.cv;
    t.row([
        "iteration CV, quiet → interrupts".to_string(),
        format!("{smp_quiet:.1}% → {smp_irq:.1}%"),
        format!("{amp_quiet:.1}% → {amp_irq:.1}%"),
        "-".to_string(),
    ]);
    let art_quiet_amp = s.rows[0].1[1].unwrap_or(f64::NAN);
    let art_irq_amp = s.rows[1].1[1].unwrap_or(f64::NAN);
    let hybrid = s.rows[4].1;
    let best_single = hybrid[0].unwrap_or(f64::NAN).min(hybrid[1].unwrap_or(f64::NAN));
    t.note(format!(
        "Takeaway: AMP runs like UP without interrupts ({art_quiet_amp:+.1}%) and beats it with them \
         ({art_irq_amp:+.1}%); the hybrid ({:+.1}%) beats the best single mode ({best_single:+.1}%) when the two \
         applications prefer opposite modes; under interrupts SMP's iteration-time spread is {:.0}x AMP's.",
        hybrid[2].unwrap_or(f64::NAN),
        smp_irq / amp_irq
    ));
    t.note("Live measurement needs an SMT core: `corehop bench modes` (or --machine machines/smt-emulated.toml to exercise it).");
    t
}

/// A quick run for `corehop tour`: the simulated AMP/SMP/hybrid table and a one-line takeaway.
pub fn tour() -> anyhow::Result<()> {
    print!("{}", tour_table(&simulated()?));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tour_reproduces_the_papers_orderings() {
        let s = simulated().unwrap();
        let out = tour_table(&s).render();
        println!("{out}");
        assert!(!out.contains("NaN"), "{out}");
        let [smp, amp, hybrid] = s.rows[4].1.map(Option::unwrap);
        assert!(hybrid < smp && hybrid < amp, "{out}");
        assert!(s.rows[0].1[1].unwrap().abs() < 1.0 && s.rows[1].1[1].unwrap() < -5.0, "{out}");
        assert!(s.cv[3] > 5.0 * s.cv[1], "{out}");
        assert!(out.contains("Takeaway: AMP runs like UP"), "{out}");
    }

    #[test]
    fn classes_map_to_the_modes_the_runtime_uses() {
        assert_eq!(Class::Uni.preferred_mode(), Some(Mode::Amp));
        assert_eq!(
            first_contexts(&corehop_topology::presets::by_name("hybrid-laptop").unwrap()).cpus.len(),
            6
        );
    }
}
