//! `corehop bench pipeline`: a driver → IP → TCP → application pipeline of components (see
//! `pipeline/stack.rs`) under several placements, emulated core speeds and idle modes, side by
//! side in one run, as in "When Slower is Faster".
//!
//! Every configuration runs once per repetition, interleaved, so a drift in machine load hits
//! them all alike; the first configuration is the same-run baseline of the `×base` column.
//! Per configuration: frames per second through the whole stack (min/median/max over
//! repetitions), payload Gbit/s, each component's utilisation (time in its work, duty-cycle
//! stalls included, over wall time: the paper's measure), and how often the hosts went to
//! sleep. The last row (unless `--no-controller`) starts all components on one CPU at full
//! speed and lets the reconfiguration controller move components and set speeds live; it
//! reports where the controller settled.
//!
//! Placements need CPUs: `dedicated` (one CPU per component) needs 4, `split` 2, `smt` a core
//! with SMT siblings plus another CPU. On a machine with fewer, they are skipped with a note;
//! with 2 CPUs `split` is the dedicated layout the paper would choose (TCP, its heaviest
//! component, on its own CPU next to only the application; driver and IP together).
mod stack;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use corehop_policy::components::{Controller, ControllerConfig, Idle};
use corehop_runtime::components::{Pipeline, Sample, MAX_CHANNEL_CAPACITY};
use corehop_runtime::sys;
use corehop_topology::{CpuId, Machine};
use serde::Serialize;

use crate::report::{self, OutputArgs, Stats, Table};
use stack::{App, Desc, Driver, Ip, Ring, Tcp, PAYLOAD};

const COMPONENTS: [&str; 4] = ["driver", "ip", "tcp", "app"];

/// The slowest emulated speed `--speeds` takes: slower, a stage moves no frame in a run.
const MIN_SPEED: f64 = 0.001;

/// A driver → IP → TCP (payload copy) → application pipeline under placements and speeds.
///
/// --quick runs 1 repetition of at most 100 ms per configuration and 1 head-to-head pair.
/// --plot draws throughput against emulated speed, one line per placement and idle mode.
///
/// --json prints `{machine, cpus, payload_bytes, duration_ms, reps, rate, rows: [{placement,
/// idle, speeds, layout, throughput_fps: {min, median, max, samples}, gbps, vs_baseline,
/// utilisation: {driver, ip, tcp, app}, sleeps_per_s, wakes_per_s, bad_frames}],
/// controller_vs_best_fixed, controller_paired_vs_best_fixed, controller_paired_interval,
/// controller_settled: [{layout, speeds}], head_to_head: null | {placement, idle, speed,
/// controller_fps: {min, median, max, samples}, fixed_fps: {...}, ratio, paired_ratio,
/// paired_interval, controller_settled: [{layout, speeds}]},
/// skipped: [{placement, reason}]}`. `speeds` are per used CPU, `layout` is the CPU
/// of each component (a row's: its last repetition's), utilisations are fractions of wall
/// time (medians over repetitions); `controller_vs_best_fixed` is the controller's median
/// throughput over the best fixed row's, `controller_paired_vs_best_fixed` the median over
/// repetitions of the controller's over that row's in the same repetition (both null without
/// a controller row); `controller_settled` is where the controller settled in each
/// repetition. `head_to_head` (null with --head-to-head 0 or no controller) is the
/// controller against the best fixed row measured again, in pairs of back-to-back runs:
/// `ratio` of the medians, `paired_ratio` the median of each pair's ratio. Each `*_interval`
/// is null | {low, high, coverage}: where that paired median's true value lies, with the chance
/// it does (`corehop bench run-suite --help` says how).
#[derive(clap::Args, Clone)]
pub struct Args {
    /// Placements to compare (comma-separated): one-core (all four components on one CPU),
    /// split (driver+IP on one CPU, TCP+app on another), dedicated (a CPU each; needs 4
    /// CPUs), smt (driver and IP on the two SMT threads of one core, TCP+app on another core;
    /// needs SMT). Placements this machine cannot host are skipped with a note.
    #[arg(long, value_delimiter = ',', default_values = ["one-core", "split", "dedicated", "smt"])]
    pub placements: Vec<String>,
    /// Emulated speeds to run every used CPU at (comma-separated fractions of full speed, in
    /// [0.001, 1]); duty-cycle throttling, as the paper emulated slow cores.
    #[arg(long, value_delimiter = ',', default_values_t = [1.0, 0.5, 0.25])]
    pub speeds: Vec<f64>,
    /// Idle modes to compare (comma-separated): poll-then-park (adaptive spin budget, then
    /// sleep), park (sleep at once), poll (never sleep).
    #[arg(long, value_delimiter = ',', default_values = ["poll-then-park", "park"])]
    pub idle: Vec<String>,
    /// Offered load in frames per second. Default: as fast as the stack takes them (the
    /// paper's iperf clients sending flat out).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Capacity of each channel between components, in messages.
    #[arg(long, default_value_t = 256)]
    pub capacity: usize,
    /// Measured time per run, ms (after a warm-up of a fifth of it).
    #[arg(long, default_value_t = 400)]
    pub duration_ms: u64,
    /// Repetitions of every configuration (min/median/max are over these): runs on a virtual
    /// or busy machine spread by several per cent, and a median of five is steadier than of three.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Skip the live-controller row.
    #[arg(long)]
    pub no_controller: bool,
    /// After the sweep, run the controller and the sweep's best fixed configuration this many
    /// more times each, back to back, alternating which goes first (0: skip). The row that won
    /// the sweep won it partly on luck (it is the best of several noisy rows); measured again
    /// beside the controller it is a fair baseline.
    #[arg(long, default_value_t = 5)]
    pub head_to_head: usize,
    /// Controller observation window, ms.
    #[arg(long, default_value_t = 50)]
    pub epoch_ms: u64,
    /// --quick, --json, --plot.
    #[command(flatten)]
    pub output: OutputArgs,
}

fn parse_idle(name: &str) -> anyhow::Result<Idle> {
    match name.trim() {
        "poll-then-park" => Ok(Idle::PollThenPark),
        "park" => Ok(Idle::Park),
        "poll" => Ok(Idle::Poll),
        other => anyhow::bail!("unknown idle mode {other:?} in --idle (expected poll-then-park, park, poll)"),
    }
}

fn idle_name(idle: Idle) -> &'static str {
    match idle {
        Idle::PollThenPark => "poll-then-park",
        Idle::Park => "park",
        Idle::Poll => "poll",
    }
}

/// The CPU of each component (driver, ip, tcp, app) for `placement`, or why not here.
fn place(machine: &Machine, placement: &str) -> anyhow::Result<Result<[CpuId; 4], String>> {
    let n = machine.cpus().len();
    let cpu = CpuId;
    Ok(match placement.trim() {
        "one-core" => Ok([cpu(0); 4]),
        "split" if n >= 2 => Ok([cpu(0), cpu(0), cpu(1), cpu(1)]),
        "split" => Err(format!("needs 2 CPUs, this machine offers {n}")),
        "dedicated" if n >= 4 => {
            // Distinct physical cores first, so no two components share a core's pipeline.
            let mut cpus: Vec<CpuId> = machine.cpus().iter().map(|c| c.id).collect();
            cpus.sort_by_key(|c| machine.smt_siblings(*c).iter().position(|s| s == c).unwrap_or(0));
            Ok([cpus[0], cpus[1], cpus[2], cpus[3]])
        }
        "dedicated" => Err(format!(
            "needs 4 CPUs, this machine offers {n}; with 2, `split` is the dedicated layout (TCP beside only the app)"
        )),
        "smt" => {
            let pair = machine.cpus().iter().map(|c| machine.smt_siblings(c.id)).find(|s| s.len() >= 2);
            match pair {
                Some(pair) => match machine.cpus().iter().find(|c| !pair.contains(&c.id)) {
                    Some(other) => Ok([pair[0], pair[1], other.id, other.id]),
                    None => Err("needs a CPU outside the SMT core".into()),
                },
                None => Err("this machine has no SMT siblings".into()),
            }
        }
        other => anyhow::bail!(
            "unknown placement {other:?} in --placements (expected one-core, split, dedicated, smt)"
        ),
    })
}

#[derive(Clone)]
enum Kind {
    Fixed { placement: String, cpus: [CpuId; 4], speed: f64 },
    Controller,
}

#[derive(Clone)]
struct Config {
    kind: Kind,
    idle: Idle,
}

/// What one run measured.
struct Measured {
    fps: f64,
    util: [f64; 4],
    sleeps_per_s: f64,
    wakes_per_s: f64,
    bad: u64,
    layout: [CpuId; 4],
    speeds: Vec<(CpuId, f64)>,
}

fn build(
    machine: &Machine,
    args: &Args,
    idle: Idle,
    cpus: [CpuId; 4],
    speed: f64,
    bad: &Arc<AtomicU64>,
) -> anyhow::Result<corehop_runtime::components::Pipeline> {
    let ring = Ring::new();
    let mut b = Pipeline::builder(machine)?;
    b.idle(idle);
    let mut used = cpus.to_vec();
    used.dedup();
    for c in used {
        b.speed(c, speed)?;
    }
    let (to_ip, ip_in) = b.spsc::<Desc>(args.capacity)?;
    let (to_tcp, tcp_in) = b.spsc::<Desc>(args.capacity)?;
    let (to_app, app_in) = b.spsc::<Desc>(args.capacity)?;
    let (r, bd, rate) = (ring.clone(), bad.clone(), args.rate);
    let start_ns = sys::now_ns();
    b.component("driver", cpus[0], move || Driver {
        ring: r.clone(),
        next: 0,
        rate,
        start_ns,
        bad: bd.clone(),
    })
    .output(to_ip)
    .add()?;
    let (r, bd) = (ring.clone(), bad.clone());
    b.component("ip", cpus[1], move || Ip { ring: r.clone(), bad: bd.clone() })
        .input(ip_in)
        .output(to_tcp)
        .add()?;
    let (r, bd) = (ring.clone(), bad.clone());
    b.component("tcp", cpus[2], move || Tcp::new(r.clone(), bd.clone()))
        .input(tcp_in)
        .output(to_app)
        .add()?;
    let bd = bad.clone();
    b.component("app", cpus[3], move || App { bytes: 0, last: None, bad: bd.clone() }).input(app_in).add()?;
    Ok(b.build()?)
}

fn measure(machine: &Machine, args: &Args, cfg: &Config) -> anyhow::Result<Measured> {
    let bad = Arc::new(AtomicU64::new(0));
    let duration = Duration::from_millis(args.duration_ms);
    let (cpus, speed) = match &cfg.kind {
        Kind::Fixed { cpus, speed, .. } => (*cpus, *speed),
        Kind::Controller => ([CpuId(0); 4], 1.0),
    };
    let pipeline = build(machine, args, cfg.idle, cpus, speed, &bad)?;
    if let Kind::Controller = cfg.kind {
        // Settle: let the controller observe and act for a while, then measure where it settled.
        let allowed: Vec<CpuId> = machine.cpus().iter().map(|c| c.id).collect();
        let mut ctl = Controller::new(ControllerConfig::default(), machine, allowed)?;
        let epoch = Duration::from_millis(args.epoch_ms.max(1));
        let epochs = (3 * duration.as_millis() / epoch.as_millis()).max(6) as usize;
        // A change still on trial when the settling time is up is judged before measuring (a
        // few windows more at most), so the row shows where the controller stays.
        let extra = ctl.longest_change_windows() as usize + 1;
        let mut prev = pipeline.sample();
        for i in 0..epochs + extra {
            if i >= epochs && !ctl.unsettled() {
                break;
            }
            std::thread::sleep(epoch);
            let now = pipeline.sample();
            let actions = ctl.observe(machine, &pipeline.layout(), &now.observations_since(&prev))?;
            pipeline.apply(&actions)?;
            prev = if actions.is_empty() { now } else { pipeline.sample() };
        }
    } else {
        std::thread::sleep(duration / 5);
    }
    let s0 = pipeline.sample();
    std::thread::sleep(duration);
    let s1 = pipeline.sample();
    let layout = pipeline.layout();
    pipeline.stop();
    Ok(summarise(&s0, &s1, &layout, bad.load(Ordering::Relaxed)))
}

/// The throughput of each run.
fn fps(runs: &[Measured]) -> Vec<f64> {
    runs.iter().map(|m| m.fps).collect()
}

fn summarise(s0: &Sample, s1: &Sample, layout: &corehop_policy::components::Layout, bad: u64) -> Measured {
    let wall = s1.at_ns.saturating_sub(s0.at_ns).max(1) as f64;
    let app = 3;
    let fps = (s1.components[app].handled - s0.components[app].handled) as f64 * 1e9 / wall;
    let mut util = [0.0; 4];
    for (i, u) in util.iter_mut().enumerate() {
        *u = (s1.components[i].busy_ns - s0.components[i].busy_ns) as f64 / wall;
    }
    let sum = |f: fn(&corehop_runtime::components::HostSample) -> u64| -> f64 {
        s1.hosts.iter().zip(&s0.hosts).map(|(a, b)| (f(a) - f(b)) as f64).sum::<f64>() * 1e9 / wall
    };
    let mut used = layout.cpus_in_use();
    used.dedup();
    Measured {
        fps,
        util,
        sleeps_per_s: sum(|h| h.parks),
        wakes_per_s: sum(|h| h.wakes),
        bad,
        layout: [layout.cpu_of[0], layout.cpu_of[1], layout.cpu_of[2], layout.cpu_of[3]],
        speeds: used.iter().map(|c| (*c, layout.speed[c.0])).collect(),
    }
}

#[derive(Serialize)]
struct Row {
    placement: String,
    idle: &'static str,
    speeds: Vec<f64>,
    layout: Vec<usize>,
    throughput_fps: Stats,
    gbps: f64,
    vs_baseline: f64,
    utilisation: Util,
    sleeps_per_s: f64,
    wakes_per_s: f64,
    bad_frames: u64,
}

#[derive(Serialize)]
struct Util {
    driver: f64,
    ip: f64,
    tcp: f64,
    app: f64,
}

#[derive(Serialize, PartialEq)]
struct Settled {
    layout: Vec<usize>,
    speeds: Vec<f64>,
}

impl Settled {
    fn of(m: &Measured) -> Settled {
        Settled {
            layout: m.layout.iter().map(|c| c.0).collect(),
            speeds: m.speeds.iter().map(|(_, s)| *s).collect(),
        }
    }
}

#[derive(Serialize)]
struct Skipped {
    placement: String,
    reason: String,
}

#[derive(Serialize)]
struct Report {
    machine: String,
    cpus: usize,
    payload_bytes: usize,
    duration_ms: u64,
    reps: usize,
    rate: Option<f64>,
    rows: Vec<Row>,
    /// The controller's median over the best fixed placement's, same run.
    controller_vs_best_fixed: Option<f64>,
    /// The median over repetitions of the controller's run over the best fixed placement's.
    controller_paired_vs_best_fixed: Option<f64>,
    /// Where that paired median's true value lies (`None` with one repetition).
    controller_paired_interval: Option<report::Interval>,
    /// Where the controller settled, each repetition.
    controller_settled: Vec<Settled>,
    head_to_head: Option<HeadToHead>,
    skipped: Vec<Skipped>,
}

/// The controller against the sweep's best fixed configuration, measured again beside it.
#[derive(Serialize)]
struct HeadToHead {
    placement: String,
    idle: &'static str,
    speed: f64,
    controller_fps: Stats,
    fixed_fps: Stats,
    /// The controller's median over the fixed configuration's.
    ratio: f64,
    /// The median over pairs of the controller's run over the fixed configuration's.
    paired_ratio: f64,
    /// Where that median's true value lies (`None` with one pair).
    paired_interval: Option<report::Interval>,
    controller_settled: Vec<Settled>,
}

/// The fixed placement (any idle mode and speed) with the highest median throughput.
fn best_fixed(rows: &[Row]) -> Option<&Row> {
    best_fixed_index(rows).map(|i| &rows[i])
}

/// [`best_fixed`]'s row number.
fn best_fixed_index(rows: &[Row]) -> Option<usize> {
    (0..rows.len())
        .filter(|&i| rows[i].placement != "controller")
        .max_by(|&a, &b| rows[a].throughput_fps.median.total_cmp(&rows[b].throughput_fps.median))
}

fn median(v: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = v.collect();
    Stats::of(&v).map_or(0.0, |s| s.median)
}

fn layout_text(layout: &[usize], speeds: &[f64]) -> String {
    let mut by_cpu: Vec<(usize, Vec<&str>)> = Vec::new();
    for (i, &c) in layout.iter().enumerate() {
        match by_cpu.iter_mut().find(|(cpu, _)| *cpu == c) {
            Some((_, names)) => names.push(COMPONENTS[i]),
            None => by_cpu.push((c, vec![COMPONENTS[i]])),
        }
    }
    by_cpu.sort();
    by_cpu
        .iter()
        .zip(speeds)
        .map(|((cpu, names), s)| format!("{}@cpu{cpu}×{s}", names.join("+")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs the benchmark and prints its table (or JSON); returns the rows for the tour.
fn bench(args: &Args) -> anyhow::Result<Report> {
    let mut args = args.clone();
    if args.output.quick {
        args.reps = 1;
        args.duration_ms = args.duration_ms.min(100);
        args.head_to_head = args.head_to_head.min(1);
    }
    report::check_range("--reps", args.reps, 1..=report::MAX_REPS)?;
    report::check_range("--head-to-head", args.head_to_head, 0..=report::MAX_REPS)?;
    report::check_range("--duration-ms", args.duration_ms, 1..=report::MAX_RUN_MS)?;
    report::check_range("--capacity", args.capacity, 1..=MAX_CHANNEL_CAPACITY)?;
    anyhow::ensure!(!args.speeds.is_empty(), "--speeds needs at least one speed");
    if let Some(&bad) = args.speeds.iter().find(|s| !(**s >= MIN_SPEED && **s <= 1.0)) {
        anyhow::bail!("speed {bad} in --speeds is outside [{MIN_SPEED}, 1]");
    }
    if let Some(rate) = args.rate {
        anyhow::ensure!(rate > 0.0 && rate.is_finite(), "--rate must be a positive number of frames/s");
    }
    let idles =
        report::each_once(args.idle.iter().map(|s| parse_idle(s)).collect::<anyhow::Result<Vec<_>>>()?);
    anyhow::ensure!(!idles.is_empty(), "--idle needs at least one mode");
    let speeds = report::each_once(args.speeds.iter().copied());
    let placements = report::each_once(args.placements.iter().map(|p| p.trim()));
    let machine = corehop_topology::discover().context("discovering this machine")?;
    if machine.cpus().len() > 64 {
        anyhow::bail!("this machine offers {} CPUs; the pipeline runtime handles 64", machine.cpus().len());
    }

    let mut configs = Vec::new();
    let mut skipped = Vec::new();
    for &placement in &placements {
        match place(&machine, placement)? {
            Ok(cpus) => {
                for &speed in &speeds {
                    for &idle in &idles {
                        let kind = Kind::Fixed { placement: placement.to_string(), cpus, speed };
                        configs.push(Config { kind, idle });
                    }
                }
            }
            Err(reason) => skipped.push(Skipped { placement: placement.to_string(), reason }),
        }
    }
    anyhow::ensure!(!configs.is_empty(), "no placement in --placements fits this machine");
    if !args.no_controller {
        configs.push(Config { kind: Kind::Controller, idle: idles[0] });
    }

    let pairs = if args.no_controller { 0 } else { args.head_to_head };
    let total = (configs.len() * args.reps + 2 * pairs) as u64;
    let bar = report::progress(total, "pipeline");
    let mut runs: Vec<Vec<Measured>> = configs.iter().map(|_| Vec::new()).collect();
    for rep in 0..args.reps {
        // What one leaves behind (a host that moved the vCPUs, parked cores) hits them alike:
        // see `report::turn`.
        for k in 0..configs.len() {
            let i = report::turn(rep, k, configs.len());
            runs[i].push(measure(&machine, &args, &configs[i])?);
            bar.inc(1);
        }
    }

    let mut rows: Vec<Row> = Vec::new();
    for (cfg, runs) in configs.iter().zip(&runs) {
        let stats = Stats::of(&fps(runs)).context("a configuration produced no measurement")?;
        let last = runs.last().expect("reps >= 1");
        let placement = match &cfg.kind {
            Kind::Fixed { placement, .. } => placement.clone(),
            Kind::Controller => "controller".to_string(),
        };
        rows.push(Row {
            placement,
            idle: idle_name(cfg.idle),
            speeds: last.speeds.iter().map(|(_, s)| *s).collect(),
            layout: last.layout.iter().map(|c| c.0).collect(),
            gbps: stats.median * (PAYLOAD * 8) as f64 / 1e9,
            throughput_fps: stats,
            vs_baseline: 0.0,
            utilisation: Util {
                driver: median(runs.iter().map(|m| m.util[0])),
                ip: median(runs.iter().map(|m| m.util[1])),
                tcp: median(runs.iter().map(|m| m.util[2])),
                app: median(runs.iter().map(|m| m.util[3])),
            },
            sleeps_per_s: median(runs.iter().map(|m| m.sleeps_per_s)),
            wakes_per_s: median(runs.iter().map(|m| m.wakes_per_s)),
            bad_frames: runs.iter().map(|m| m.bad).sum(),
        });
    }
    let base = rows[0].throughput_fps.median.max(f64::MIN_POSITIVE);
    for row in &mut rows {
        row.vs_baseline = row.throughput_fps.median / base;
    }
    let best = best_fixed_index(&rows);
    let controller_vs_best_fixed =
        match (rows.iter().find(|r| r.placement == "controller"), best.map(|i| &rows[i])) {
            (Some(ctl), Some(best)) if best.throughput_fps.median > 0.0 => {
                Some(ctl.throughput_fps.median / best.throughput_fps.median)
            }
            _ => None,
        };
    // Rows and runs are in the same order; the controller's is the last, if any.
    let controller_runs = (!args.no_controller).then(|| runs.last()).flatten();
    let (controller_paired_vs_best_fixed, controller_paired_interval) = match (controller_runs, best) {
        (Some(ctl), Some(best)) => (
            report::paired_median(&fps(ctl), &fps(&runs[best])),
            report::paired_interval(&fps(ctl), &fps(&runs[best])),
        ),
        _ => (None, None),
    };
    let controller_settled = controller_runs.map(|r| r.iter().map(Settled::of).collect()).unwrap_or_default();
    let head_to_head = match best {
        Some(best) if pairs > 0 => {
            let controller = configs.last().expect("the controller's config is the last");
            Some(head_to_head(&machine, &args, pairs, &configs[best], controller, &rows[best], &bar)?)
        }
        _ => None,
    };
    bar.finish_and_clear();
    Ok(Report {
        machine: machine.name.clone(),
        cpus: machine.cpus().len(),
        payload_bytes: PAYLOAD,
        duration_ms: args.duration_ms,
        reps: args.reps,
        rate: args.rate,
        rows,
        controller_vs_best_fixed,
        controller_paired_vs_best_fixed,
        controller_paired_interval,
        controller_settled,
        head_to_head,
        skipped,
    })
}

/// ", 0.95–1.03 with 96.9 % chance" for an interval, nothing without one.
fn interval_text(interval: Option<report::Interval>) -> String {
    interval.map_or(String::new(), |i| format!(", {} {}", i.range(2), i.chance()))
}

/// Runs the controller and `fixed` (the sweep's best, `row`) `pairs` times each, back to
/// back ([`report::back_to_back`]).
fn head_to_head(
    machine: &Machine,
    args: &Args,
    pairs: usize,
    fixed: &Config,
    controller: &Config,
    row: &Row,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<HeadToHead> {
    let (ctl, base) = report::back_to_back(
        pairs,
        || measure(machine, args, controller),
        || measure(machine, args, fixed),
        || bar.inc(1),
    )?;
    let (controller_fps, fixed_fps) = (Stats::of(&fps(&ctl)), Stats::of(&fps(&base)));
    let (controller_fps, fixed_fps) = controller_fps.zip(fixed_fps).context("pairs >= 1")?;
    Ok(HeadToHead {
        placement: row.placement.clone(),
        idle: row.idle,
        speed: row.speeds.first().copied().unwrap_or(1.0),
        ratio: controller_fps.median / fixed_fps.median.max(f64::MIN_POSITIVE),
        paired_ratio: report::paired_median(&fps(&ctl), &fps(&base)).unwrap_or(0.0),
        paired_interval: report::paired_interval(&fps(&ctl), &fps(&base)),
        controller_fps,
        fixed_fps,
        controller_settled: ctl.iter().map(Settled::of).collect(),
    })
}

fn table(report: &Report) -> Table {
    let pct = |u: f64| format!("{:.0}%", 100.0 * u);
    let mut t = Table::new([
        "placement",
        "idle",
        "speed",
        "frames/s",
        "min",
        "max",
        "Gbit/s",
        "×base",
        "driver",
        "ip",
        "tcp",
        "app",
        "sleeps/s",
    ])
    .title(format!(
        "corehop bench pipeline: driver → IP → TCP (copy+checksum) → app, {} CPUs, {} ms × {} reps{}",
        report.cpus,
        report.duration_ms,
        report.reps,
        report.rate.map(|r| format!(", offered {}", report::fmt_rate(r))).unwrap_or_default()
    ))
    .align(1, report::Align::Left)
    .align(2, report::Align::Left);
    for r in &report.rows {
        let speed = if r.placement == "controller" {
            layout_text(&r.layout, &r.speeds)
        } else {
            format!("{}", r.speeds.first().copied().unwrap_or(1.0))
        };
        t.row([
            r.placement.clone(),
            r.idle.to_string(),
            speed,
            report::fmt_rate(r.throughput_fps.median),
            report::fmt_rate(r.throughput_fps.min),
            report::fmt_rate(r.throughput_fps.max),
            format!("{:.2}", r.gbps),
            format!("{:.2}", r.vs_baseline),
            pct(r.utilisation.driver),
            pct(r.utilisation.ip),
            pct(r.utilisation.tcp),
            pct(r.utilisation.app),
            format!("{:.0}", r.sleeps_per_s),
        ]);
    }
    t.note(
        "×base: median throughput over the first row's, same run. driver..app: share of wall time in each",
    );
    t.note("component's work (duty-cycle stalls of a slowed CPU included; time the OS took the CPU away");
    t.note("mid-batch counts too, so a loaded machine can show over 100%). sleeps/s: host parks, all CPUs.");
    if let (Some(ratio), Some(best)) = (report.controller_vs_best_fixed, best_fixed(&report.rows)) {
        t.note(format!(
            "The controller ran at {ratio:.2}× the best fixed placement of this run ({} / {} at speed {}); paired (each repetition over that row's): {:.2}{}.",
            best.placement,
            best.idle,
            best.speeds.first().copied().unwrap_or(1.0),
            report.controller_paired_vs_best_fixed.unwrap_or(0.0),
            interval_text(report.controller_paired_interval),
        ));
        t.note(format!("It settled on {}.", settled_text(&report.controller_settled, "repetitions")));
    }
    if let Some(h) = &report.head_to_head {
        t.note(format!(
            "Head to head, {} pairs of back-to-back runs: the controller {} (min {}), {} / {} at speed {} {} (min {}):",
            h.fixed_fps.samples,
            report::fmt_rate(h.controller_fps.median),
            report::fmt_rate(h.controller_fps.min),
            h.placement,
            h.idle,
            h.speed,
            report::fmt_rate(h.fixed_fps.median),
            report::fmt_rate(h.fixed_fps.min),
        ));
        t.note(format!(
            "{:.2}× (paired {:.2}{}); it settled on {}.",
            h.ratio,
            h.paired_ratio,
            interval_text(h.paired_interval),
            settled_text(&h.controller_settled, "runs")
        ));
    }
    let bad: u64 = report.rows.iter().map(|r| r.bad_frames).sum();
    t.note(format!("Frames refused by a checksum or order check: {bad}."));
    for s in &report.skipped {
        t.note(format!("skipped {}: {}", s.placement, s.reason));
    }
    t
}

/// Each layout the controller settled on, with how many of `what` it settled there.
fn settled_text(settled: &[Settled], what: &str) -> String {
    let mut counted: Vec<(&Settled, usize)> = Vec::new();
    for s in settled {
        match counted.iter_mut().find(|(x, _)| *x == s) {
            Some((_, n)) => *n += 1,
            None => counted.push((s, 1)),
        }
    }
    counted
        .iter()
        .map(|(s, n)| format!("{} in {n} of {} {what}", layout_text(&s.layout, &s.speeds), settled.len()))
        .collect::<Vec<_>>()
        .join("; ")
}

/// `corehop bench pipeline`: measures every placement and the controller, prints the table.
pub fn run(args: Args) -> anyhow::Result<()> {
    let report = bench(&args)?;
    if args.output.json {
        report::print_json(&report)?;
    } else {
        print!("{}", table(&report));
    }
    if let Some(path) = &args.output.plot {
        let mut series: Vec<report::Series> = Vec::new();
        for r in report.rows.iter().filter(|r| r.placement != "controller") {
            let name = format!("{} / {}", r.placement, r.idle);
            let x = r.speeds.first().copied().unwrap_or(1.0);
            match series.iter_mut().find(|s| s.name == name) {
                Some(s) => s.points.push((x, r.throughput_fps.median)),
                None => series.push(report::Series { name, points: vec![(x, r.throughput_fps.median)] }),
            }
        }
        report::plot_lines(
            path,
            "Pipeline throughput vs emulated core speed",
            "speed (fraction of full)",
            "frames/s",
            report::Scale::Linear,
            &series,
        )?;
    }
    Ok(())
}

/// The tour's part: all-on-one-core vs split at three speeds plus the live controller.
pub fn tour() -> anyhow::Result<()> {
    let args = Args {
        placements: vec!["one-core".into(), "split".into()],
        speeds: vec![1.0, 0.5, 0.25],
        idle: vec!["poll-then-park".into()],
        rate: None,
        capacity: 256,
        duration_ms: 100,
        reps: 1,
        no_controller: false,
        head_to_head: 0,
        epoch_ms: 30,
        output: OutputArgs { quick: true, ..OutputArgs::default() },
    };
    let report = bench(&args)?;
    print!("{}", table(&report));
    let best = best_fixed(&report.rows).context("no rows")?;
    let ctl = report.rows.iter().find(|r| r.placement == "controller");
    println!(
        "Takeaway: best here is {} at speed {} ({:.2}× all-on-one-core){}.",
        best.placement,
        best.speeds.first().copied().unwrap_or(1.0),
        best.vs_baseline,
        ctl.map(|c| format!("; the controller settled on {}", layout_text(&c.layout, &c.speeds)))
            .unwrap_or_default()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use corehop_topology::OsCpu;

    fn machine(n: usize, smt: bool) -> Machine {
        Machine::uniform("test", &(0..n).map(OsCpu).collect::<Vec<_>>(), if smt { 2 } else { 1 })
    }

    #[test]
    fn placements_map_to_cpus_or_say_why_not() {
        let two = machine(2, false);
        assert_eq!(place(&two, "one-core").unwrap().unwrap(), [CpuId(0); 4]);
        assert_eq!(place(&two, "split").unwrap().unwrap(), [CpuId(0), CpuId(0), CpuId(1), CpuId(1)]);
        assert!(place(&two, "dedicated").unwrap().unwrap_err().contains("needs 4 CPUs"));
        assert!(place(&two, "smt").unwrap().unwrap_err().contains("no SMT"));
        assert!(place(&machine(1, false), "split").unwrap().is_err());
        let ht = machine(4, true);
        assert_eq!(place(&ht, "smt").unwrap().unwrap(), [CpuId(0), CpuId(1), CpuId(2), CpuId(2)]);
        let d = place(&ht, "dedicated").unwrap().unwrap();
        let mut cores: Vec<usize> = d.iter().map(|c| c.0).collect();
        cores.dedup();
        assert_eq!(cores.len(), 4);
        assert!(place(&two, "everywhere").is_err());
    }

    #[test]
    fn layout_text_groups_components_by_cpu() {
        assert_eq!(layout_text(&[0, 0, 1, 1], &[0.5, 1.0]), "driver+ip@cpu0×0.5 tcp+app@cpu1×1");
    }

    #[test]
    fn idle_names_round_trip() {
        for idle in [Idle::Poll, Idle::Park, Idle::PollThenPark] {
            assert_eq!(parse_idle(idle_name(idle)).unwrap(), idle);
        }
        assert!(parse_idle("nap").is_err());
    }
}
