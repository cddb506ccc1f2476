//! `corehop sim SCENARIO.toml`: run a simulation scenario (or a sweep of them) and report.
//!
//! Output: a table with one row per run (swept settings, the model's headline metric,
//! throughput, hops, queueing delay, per-CPU busy share), plus a pivot of the headline when two
//! keys are swept (rows: the first, columns: the last, like the papers' tables).
//!
//! `--json` prints, instead of the tables:
//!
//! ```text
//! { "scenario": "<file>",
//!   "runs": [ { "settings": [ { "key": "machine.preset", "value": "switch-cc" }, ... ],
//!               "report": <corehop_sim::Report> }, ... ] }
//! ```
//!
//! where a report has `scenario, kind, machine, seed, stop, elapsed_ns, events, ops,
//! throughput_per_s, op_latency {count, mean_ns, p50_ns, p99_ns, max_ns} | null, queue_delay
//! (same) | null, hops, hop_cost_ns | null, cpus [{cpu, class, speed, busy_ns, idle_ns,
//! busy_fraction}], model {op_name, metrics [{name, value, unit}]}`; the first metric is the
//! headline.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use corehop_sim::{models, Point, Report, ScenarioDoc, Stop, Sweep, DEFAULT_MAX_EVENTS};

use corehop_bench::report::{self, Scale, Series, Table};

/// Run a simulation scenario on a modelled machine.
///
/// Scenarios are TOML files (see scenarios/README.md); each names a machine preset, cost
/// overrides, a workload model and optional sweeps. Same scenario + same seed → identical
/// output.
#[derive(clap::Args)]
pub struct Args {
    /// The scenario file (TOML), e.g. scenarios/switch-micro.toml. Not needed with --list.
    #[arg(required_unless_present = "list")]
    scenario: Option<PathBuf>,

    /// Override one scenario value: a dotted key and a TOML value (strings may go unquoted),
    /// e.g. `--set machine.preset=switch-cs --set workload.iterations=500`. Repeatable;
    /// applied before sweeps.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,

    /// Run once per value of a key, e.g. `--sweep costs.wake_delay_cycles=0,250,1000`.
    /// Repeat for every combination; replaces a sweep of the same key in the file. The table
    /// and plot then show the curve.
    #[arg(long = "sweep", value_name = "KEY=A,B,C")]
    sweep: Vec<String>,

    /// Seed of the simulation's random number generator (default: the scenario's `seed`,
    /// else 1). Same seed, same output.
    #[arg(long)]
    seed: Option<u64>,

    /// Print the results as JSON instead of tables: {scenario, runs: [{settings: [{key, value}],
    /// report}]}, a report holding elapsed_ns, ops, throughput_per_s, op_latency, queue_delay,
    /// hops, hop_cost_ns, cpus [{cpu, busy_ns, idle_ns, busy_fraction, ...}] and the model's
    /// metrics (the first is the headline). Field list: scenarios/README.md.
    #[arg(long)]
    json: bool,

    /// Also write one CSV row per run to FILE.
    #[arg(long, value_name = "FILE", value_parser = corehop_bench::report::output_path)]
    csv: Option<PathBuf>,

    /// Also draw the headline metric into an SVG file: a curve over the last swept key when
    /// its values are numbers, else one bar per run.
    #[arg(long, value_name = "FILE.svg", value_parser = corehop_bench::report::plot_path)]
    plot: Option<PathBuf>,

    /// Run up to N points of a sweep at once, one per thread (default: every CPU this process
    /// may use; 1 runs them one after another). Each point is its own seeded simulation, so
    /// the output is the same, byte for byte, whatever N is.
    #[arg(long, short = 'j', value_name = "N")]
    jobs: Option<usize>,

    /// List the workload models (`[workload] kind`) and machine presets, then exit.
    #[arg(long)]
    list: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.list {
        print!("{}", listing());
        return Ok(());
    }
    let path = args.scenario.as_deref().expect("clap requires a scenario without --list");
    let mut doc = ScenarioDoc::load(path)?;
    for assignment in &args.set {
        doc.set(assignment)?;
    }
    if let Some(seed) = args.seed {
        doc.set_value("seed", toml::Value::Integer(seed as i64))?;
    }
    let sweeps = args
        .sweep
        .iter()
        .map(|s| Sweep::parse(s).map_err(|e| anyhow::anyhow!("--sweep {e}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let points = doc.expand(&sweeps)?;
    let runs = run_points(&points, args.jobs.unwrap_or(0), !args.json)?;

    if args.json {
        report::print_json(&JsonOut {
            scenario: doc.file(),
            runs: runs
                .iter()
                .map(|(p, r)| JsonRun {
                    settings: p.settings.iter().map(|(k, v)| JsonSetting { key: k, value: v }).collect(),
                    report: r,
                })
                .collect(),
        })?;
    } else {
        print!("{}", results_table(doc.file(), &runs));
        if let Some(pivot) = pivot_table(&runs) {
            println!();
            print!("{pivot}");
        }
    }
    if let Some(csv) = &args.csv {
        std::fs::write(csv, to_csv(&runs)).with_context(|| format!("writing {}", csv.display()))?;
    }
    if let Some(plot) = &args.plot {
        draw(plot, &runs)?;
    }
    Ok(())
}

#[derive(Serialize)]
struct JsonOut<'a> {
    scenario: &'a str,
    runs: Vec<JsonRun<'a>>,
}

#[derive(Serialize)]
struct JsonRun<'a> {
    settings: Vec<JsonSetting<'a>>,
    report: &'a Report,
}

#[derive(Serialize)]
struct JsonSetting<'a> {
    key: &'a str,
    value: &'a toml::Value,
}

fn listing() -> String {
    let mut t = Table::new(["workload kind", "what it models"]).title("Models");
    for m in models::MODELS {
        t.row([m.kind, m.about]);
    }
    let mut p = Table::new(["machine preset", "what it is"]).title("Machine presets");
    for name in corehop_topology::presets::names() {
        p.row([*name, corehop_topology::presets::describe(name).unwrap_or("")]);
    }
    format!("{t}\n{p}")
}

/// Runs every point on `jobs` threads (0: every allowed CPU), with a progress bar when
/// `show_progress` and there is more than one point. Results in point order; the first
/// failing point (in point order) is the error. Every point is checked before any runs.
fn run_points(points: &[Point], jobs: usize, show_progress: bool) -> anyhow::Result<Vec<(Point, Report)>> {
    for point in points {
        corehop_sim::models::check_scenario(&point.scenario)?;
    }
    let bar = if show_progress && points.len() > 1 {
        report::progress(points.len() as u64, "sim")
    } else {
        indicatif::ProgressBar::hidden()
    };
    let results = corehop_sim::run_points(points, jobs, |i| {
        bar.set_message(settings_label(&points[i]));
        bar.inc(1);
    });
    bar.finish_and_clear();
    points.iter().cloned().zip(results).map(|(point, report)| Ok((point, report?))).collect()
}

fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn settings_label(p: &Point) -> String {
    p.settings.iter().map(|(_, v)| value_text(v)).collect::<Vec<_>>().join(" / ")
}

fn short_key(key: &str) -> &str {
    key.rsplit('.').next().unwrap_or(key)
}

fn headline_text(r: &Report) -> String {
    match r.headline() {
        Some(m) if m.value.is_nan() => "-".into(),
        Some(m) if m.unit == "ns" => format!("{:.0}", m.value),
        Some(m) => format!("{:.3}", m.value),
        None => "-".into(),
    }
}

/// One row per run.
fn results_table(file: &str, runs: &[(Point, Report)]) -> Table {
    let first = &runs[0];
    let swept: Vec<&str> = first.0.settings.iter().map(|(k, _)| short_key(k)).collect();
    let headline = first.1.headline().map(|m| m.name.clone()).unwrap_or_else(|| "headline".into());
    let mut header: Vec<String> = swept.iter().map(|s| s.to_string()).collect();
    header.extend([
        headline,
        "ops/s".into(),
        "hops".into(),
        "hop cost".into(),
        "queue wait".into(),
        "busy %".into(),
    ]);
    let polls = runs.iter().any(|(_, r)| r.cpus.iter().any(|c| c.poll_ns > 0.0));
    if polls {
        header.push("poll %".into());
    }
    let title = format!(
        "{} ({}, kind {}, seed {}): {} run{}",
        first.1.scenario,
        file,
        first.1.kind,
        first.1.seed,
        runs.len(),
        if runs.len() == 1 { "" } else { "s" }
    );
    let mut t = Table::new(header).title(title);
    for (point, r) in runs {
        let mut row: Vec<String> = point.settings.iter().map(|(_, v)| value_text(v)).collect();
        row.push(headline_text(r));
        row.push(report::fmt_rate(r.throughput_per_s));
        row.push(r.hops.to_string());
        row.push(r.hop_cost_ns.map(report::fmt_ns).unwrap_or_else(|| "-".into()));
        row.push(r.queue_delay.map(|q| report::fmt_ns(q.mean_ns)).unwrap_or_else(|| "-".into()));
        row.push(
            r.cpus.iter().map(|c| format!("{:.0}", 100.0 * c.busy_fraction)).collect::<Vec<_>>().join(" "),
        );
        if polls {
            let elapsed = r.elapsed_ns.max(f64::MIN_POSITIVE);
            let poll: Vec<String> =
                r.cpus.iter().map(|c| format!("{:.0}", 100.0 * c.poll_ns / elapsed)).collect();
            row.push(poll.join(" "));
        }
        t.row(row);
    }
    if runs.len() == 1 {
        for m in first.1.model.metrics.iter().skip(1) {
            t.note(format!("{}: {:.4} {}", m.name, m.value, m.unit));
        }
    }
    t.note(format!(
        "ops are {}s; busy % per CPU (cpu0 cpu1 ...); hop cost from leaving the source to running on the target; \
         queue wait = mean time a job waited for its CPU; poll % = share of the run a CPU spent idle but polling",
        first.1.model.op_name
    ));
    let cut: Vec<&Report> = runs.iter().map(|(_, r)| r).filter(|r| r.stop == Stop::EventBudget).collect();
    if let Some(r) = cut.first() {
        t.note(format!(
            "{} of {} run(s) stopped at their event budget ({} events; `max_events` under [run], {} unless \
             set) before their work was done: their figures cover the simulated time until then",
            cut.len(),
            runs.len(),
            r.events,
            DEFAULT_MAX_EVENTS
        ));
    }
    t
}

/// With two or more swept keys: the headline by first key (rows) × last key (columns), the
/// other keys at their first value.
fn pivot_table(runs: &[(Point, Report)]) -> Option<Table> {
    let keys = runs[0].0.settings.len();
    if keys < 2 {
        return None;
    }
    let distinct = |i: usize| {
        let mut seen: Vec<String> = Vec::new();
        for (p, _) in runs {
            let v = value_text(&p.settings[i].1);
            if !seen.contains(&v) {
                seen.push(v);
            }
        }
        seen
    };
    let (rows, cols) = (distinct(0), distinct(keys - 1));
    let fixed: Vec<String> = (1..keys - 1).map(|i| value_text(&runs[0].0.settings[i].1)).collect();
    let headline = runs[0].1.headline().map(|m| m.name.clone()).unwrap_or_default();
    let corner =
        format!("{} \\ {}", short_key(&runs[0].0.settings[0].0), short_key(&runs[0].0.settings[keys - 1].0));
    let mut header = vec![corner];
    header.extend(cols.iter().cloned());
    let mut t = Table::new(header).title(format!(
        "{headline} by {} and {}",
        runs[0].0.settings[0].0,
        runs[0].0.settings[keys - 1].0
    ));
    for row in &rows {
        let mut cells = vec![row.clone()];
        for col in &cols {
            let hit = runs.iter().find(|(p, _)| {
                let v: Vec<String> = p.settings.iter().map(|(_, v)| value_text(v)).collect();
                v[0] == *row && v[keys - 1] == *col && v[1..keys - 1] == fixed[..]
            });
            cells.push(hit.map(|(_, r)| headline_text(r)).unwrap_or_else(|| "-".into()));
        }
        t.row(cells);
    }
    if !fixed.is_empty() {
        t.note(format!("other swept keys at: {}", fixed.join(", ")));
    }
    Some(t)
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn to_csv(runs: &[(Point, Report)]) -> String {
    let first = &runs[0];
    let mut header: Vec<String> = first.0.settings.iter().map(|(k, _)| k.clone()).collect();
    header.extend(
        [
            "scenario",
            "kind",
            "machine",
            "seed",
            "elapsed_ns",
            "events",
            "ops",
            "throughput_per_s",
            "op_latency_mean_ns",
            "op_latency_p99_ns",
            "queue_delay_mean_ns",
            "queue_delay_p99_ns",
            "hops",
            "hop_cost_ns",
        ]
        .map(String::from),
    );
    let cpus = first.1.cpus.len();
    header.extend((0..cpus).map(|c| format!("cpu{c}_busy_fraction")));
    header.extend((0..cpus).map(|c| format!("cpu{c}_poll_ns")));
    header.extend(first.1.model.metrics.iter().map(|m| format!("{} ({})", m.name, m.unit)));
    let mut out = header.iter().map(|h| csv_field(h)).collect::<Vec<_>>().join(",") + "\n";
    let opt = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    for (p, r) in runs {
        let mut row: Vec<String> = p.settings.iter().map(|(_, v)| value_text(v)).collect();
        row.extend([
            r.scenario.clone(),
            r.kind.clone(),
            r.machine.clone(),
            r.seed.to_string(),
            r.elapsed_ns.to_string(),
            r.events.to_string(),
            r.ops.to_string(),
            r.throughput_per_s.to_string(),
            opt(r.op_latency.map(|s| s.mean_ns)),
            opt(r.op_latency.map(|s| s.p99_ns)),
            opt(r.queue_delay.map(|s| s.mean_ns)),
            opt(r.queue_delay.map(|s| s.p99_ns)),
            r.hops.to_string(),
            opt(r.hop_cost_ns),
        ]);
        row.extend((0..cpus).map(|c| r.cpus.get(c).map(|x| x.busy_fraction.to_string()).unwrap_or_default()));
        row.extend((0..cpus).map(|c| r.cpus.get(c).map(|x| x.poll_ns.to_string()).unwrap_or_default()));
        row.extend(r.model.metrics.iter().map(|m| m.value.to_string()));
        out += &(row.iter().map(|f| csv_field(f)).collect::<Vec<_>>().join(",") + "\n");
    }
    out
}

fn draw(path: &Path, runs: &[(Point, Report)]) -> anyhow::Result<()> {
    let first = &runs[0];
    let headline = first.1.headline().map(|m| format!("{} ({})", m.name, m.unit)).unwrap_or_default();
    let title = format!("{} on {}", first.1.scenario, first.1.machine);
    let keys = first.0.settings.len();
    let numeric_x = keys > 0
        && runs.iter().all(|(p, _)| {
            p.settings[keys - 1]
                .1
                .as_float()
                .or(p.settings[keys - 1].1.as_integer().map(|i| i as f64))
                .is_some()
        });
    if numeric_x {
        let mut series: Vec<Series> = Vec::new();
        for (p, r) in runs {
            let name =
                p.settings[..keys - 1].iter().map(|(_, v)| value_text(v)).collect::<Vec<_>>().join(" / ");
            let v = &p.settings[keys - 1].1;
            let x = v.as_float().or(v.as_integer().map(|i| i as f64)).expect("checked numeric");
            let y = r.headline().map(|m| m.value).unwrap_or(f64::NAN);
            match series.iter_mut().find(|s| s.name == name) {
                Some(s) => s.points.push((x, y)),
                None => series.push(Series {
                    name: if name.is_empty() { headline.clone() } else { name },
                    points: vec![(x, y)],
                }),
            }
        }
        // Sweeps over orders of magnitude read better on a log axis.
        let xs = || series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
        let (lo, hi) = (xs().fold(f64::INFINITY, f64::min), xs().fold(0.0, f64::max));
        let scale = if lo > 0.0 && hi / lo >= 100.0 { Scale::Log10 } else { Scale::Linear };
        report::plot_lines(path, &title, &first.0.settings[keys - 1].0, &headline, scale, &series)
    } else if keys > 0 {
        let bars: Vec<(String, f64)> = runs
            .iter()
            .map(|(p, r)| (settings_label(p), r.headline().map(|m| m.value).unwrap_or(0.0)))
            .collect();
        report::plot_bars(path, &title, &headline, &bars)
    } else {
        let bars: Vec<(String, f64)> =
            first.1.cpus.iter().map(|c| (format!("cpu{}", c.cpu), 100.0 * c.busy_fraction)).collect();
        report::plot_bars(path, &title, "busy %", &bars)
    }
}

/// The paper's Table 2(b) and Table 3 (V5): simulated `gettid` round trip in ns, per
/// configuration, for none, V1..V5.
const PAPER_GETTID_NS: [(&str, [f64; 6]); 4] = [
    ("switch-cc", [120.0, 4669.0, 3247.0, 2550.0, 1986.0, 2042.0]),
    ("switch-ss", [130.0, 13229.0, 10248.0, 7982.0, 6770.0, 6689.0]),
    ("switch-cs", [121.0, 8651.0, 6343.0, 4696.0, 3869.0, 4087.0]),
    ("switch-cs-quarter", [118.0, 16735.0, 11148.0, 8140.0, 6781.0, 7024.0]),
];

/// The first paper scenario, shipped inside the binary so the tour runs from anywhere.
const SWITCH_MICRO: &str = include_str!("../../../../scenarios/switch-micro.toml");

/// A quick run of the core-switching micro-benchmark on the paper's two-core machines, with
/// the paper's figures next to ours.
pub fn tour() -> anyhow::Result<()> {
    let mut doc = ScenarioDoc::parse("scenarios/switch-micro.toml", SWITCH_MICRO)?;
    doc.set("workload.iterations=2000")?;
    let points = doc.expand(&[])?;
    let runs = run_points(&points, 0, true)?;
    print!("{}", tour_table(&runs));
    Ok(())
}

fn tour_table(runs: &[(Point, Report)]) -> Table {
    const MECHANISMS: [&str; 6] = ["none", "affinity", "handoff", "fastpath", "spin", "wakeup"];
    let mut header = vec!["machine".to_string()];
    header.extend(["none", "V1", "V2", "V3", "V4", "V5"].map(String::from));
    let mut t = Table::new(header)
        .title("Simulated gettid round trip, ns (paper Table 2(b)/3 in brackets): corehop sim scenarios/switch-micro.toml");
    let mut same_order = 0;
    let mut v1_over_v4: Vec<f64> = Vec::new();
    let mut costliest = ("", 0.0f64);
    for (preset, paper) in PAPER_GETTID_NS {
        let ours: Vec<f64> = MECHANISMS
            .iter()
            .map(|m| {
                runs.iter()
                    .find(|(p, _)| {
                        p.settings.iter().any(|(_, v)| v.as_str() == Some(preset))
                            && p.settings.iter().any(|(_, v)| v.as_str() == Some(m))
                    })
                    .and_then(|(_, r)| r.headline().map(|h| h.value))
                    .unwrap_or(f64::NAN)
            })
            .collect();
        // V1 > V2 > V3 > V4: the ordering the paper reports on every configuration.
        if ours[1] > ours[2] && ours[2] > ours[3] && ours[3] > ours[4] {
            same_order += 1;
        }
        v1_over_v4.push(ours[1] / ours[4]);
        if ours[4] > costliest.1 {
            costliest = (preset, ours[4]);
        }
        let mut row = vec![preset.to_string()];
        row.extend(ours.iter().zip(paper).map(|(o, p)| format!("{o:.0} [{p:.0}]")));
        t.row(row);
    }
    let lo = v1_over_v4.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v1_over_v4.iter().copied().fold(0.0, f64::max);
    t.note(format!(
        "Takeaway: V1 > V2 > V3 > V4 on {same_order} of 4 machines, as in the paper; the fast path with a polling \
         idle loop (V4) is {lo:.1}-{hi:.1}x cheaper than migration (V1); the costliest service core for V4 is \
         {} ({:.0} ns per call).",
        costliest.0, costliest.1
    ));
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tour_compares_every_paper_configuration() {
        let mut doc = ScenarioDoc::parse("switch-micro.toml", SWITCH_MICRO).unwrap();
        doc.set("workload.iterations=20").unwrap();
        let runs = run_points(&doc.expand(&[]).unwrap(), 0, false).unwrap();
        let out = tour_table(&runs).render();
        assert!(out.contains("V1 > V2 > V3 > V4 on 4 of 4 machines"), "{out}");
        assert!(out.contains("costliest service core for V4 is switch-cs-quarter"), "{out}");
        assert!(out.contains("[4669]") && out.contains("[6781]"), "{out}");
        assert!(!out.contains("NaN"), "{out}");
    }
}
