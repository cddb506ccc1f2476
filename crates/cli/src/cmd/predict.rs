//! `corehop predict`: replay a system-call trace through the run-length predictor.
//!
//! For every call the predictor is asked first, then told the real run length, exactly as the
//! runtime would use it, each process of the trace with predictors of its own, started from
//! what the last process to end had learned (as under `corehop run`). Reported per
//! table form: how often the prediction was exact, within ±5 %, and how often the offload
//! decision "prediction > N" matched "actual > N" for each threshold N. Next to it, the
//! same-trace baseline: the best *constant* decision at that N (always offload or never),
//! which any useful predictor must beat.

use std::collections::HashMap;
use std::path::PathBuf;

use corehop_policy::offload::{within_tolerance, Learned, RunLengthPredictor, Source, TableForm};
use serde::Serialize;

use corehop_bench::report::{self, Align, Scale, Series, Table};

mod trace;

pub use trace::{Format, TraceCall};

/// Replay system-call traces through the run-length predictor and report its accuracy.
///
/// Record a trace with `corehop run --offload --policy never --record-trace t.csv -- CMD`, with
/// `strace -f -T -tt -o trace.txt CMD …` (add `-k` for call sites: each call's first stack
/// frame outside the C library; `-i`, `-n`, `-y`, `-r`, `-ttt` are read past), or write a CSV
/// with the columns `call,fd,size,site,run_ns`, or with a header line naming its columns in
/// any order (`call` and `run_ns` needed, other columns ignored). Each process of a trace (the calls under a `# pid` line of a
/// recorded one, a pid of strace's with its threads) is replayed through predictors of its
/// own, as each process under the library has its own, started from what the last process to
/// end had learned of call kinds (`--start`). Several traces end in a table of each form's
/// scores averaged over them.
///
/// strace stops the program at every call, and its `-T` times include that stop: a call that
/// runs 1 µs plainly shows several (at least 5 µs on a 2-vCPU KVM guest). Thresholds below
/// that find every call of an strace trace above them: "always" is right at each, and a
/// predictor can at best tie it (each process's first calls, made before it has seen a run,
/// cost it a few). Only `--record-trace` times calls as the library sees them.
#[derive(clap::Args)]
pub struct Args {
    /// Trace file(s) to replay, each reported on its own: `--trace a.csv b.csv` (a shell
    /// glob works) or `--trace a.csv --trace b.csv`.
    #[arg(long = "trace", required = true, value_name = "FILE", num_args = 1..)]
    pub traces: Vec<PathBuf>,
    /// Trace syntax; `auto` tells CSV from strace by the first line.
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    pub format: Format,
    /// Offload thresholds N to score decisions at, in ns (comma-separated, at most 64). A
    /// decision is right when "it will run longer than N" matches what the call then did.
    /// The paper's forms decide "predicted > N"; the timed form decides by its prediction or,
    /// where that has lately guessed worse, by the majority of the key's (or of all calls')
    /// runs at N.
    #[arg(long, value_delimiter = ',', default_values_t = [1_000u64, 5_000, 20_000, 100_000])]
    pub thresholds: Vec<u64>,
    /// Entries of the fully-associative (LRU) table (the paper: 200).
    #[arg(long, default_value_t = 200)]
    pub fa_entries: usize,
    /// Entries of the direct-mapped (tagless) table (the paper: 1500).
    #[arg(long, default_value_t = 1500)]
    pub dm_entries: usize,
    /// What each process's timed predictor starts from.
    #[arg(long, value_enum, default_value_t = Start::Inherited)]
    pub start: Start,
    /// Replay only the calls the papers switch on (read/write family, open, stat family,
    /// fsync, sendfile, sendto/recvfrom, poll/select) instead of every call in the trace.
    #[arg(long)]
    pub named_only: bool,
    /// Print JSON instead of tables: `[{trace, format, calls, processes, skipped_lines, start, forms:
    /// [{form, exact, within_5pct, local, global, cold, decisions: [{n_ns, right,
    /// best_constant, actual_above}]}]}]`, all rates as fractions 0..1.
    #[arg(long)]
    pub json: bool,
    /// Draw decision accuracy against N (every trace and form, plus the constant baseline).
    #[arg(long, value_name = "FILE.svg", value_parser = corehop_bench::report::plot_path)]
    pub plot: Option<PathBuf>,
}

/// Where a process's predictors start (the paper's forms always start empty: their table is
/// all they learn).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Start {
    /// From what the last process to end had learned of call kinds and of calls as a whole,
    /// as under `corehop run` when it waits for the program (`--stats`, `--record-trace`,
    /// `--compare`): in a recorded trace, whose processes are written as they end, from the
    /// process before.
    Inherited,
    /// From nothing, as a process started outside a run that hands on.
    Fresh,
}

/// Accuracy of one predictor form on one trace.
#[derive(Debug, Serialize, PartialEq)]
pub struct FormReport {
    pub form: String,
    pub exact: f64,
    pub within_5pct: f64,
    /// Share of predictions from the key's own entry, from the global mean, and cold.
    pub local: f64,
    pub global: f64,
    pub cold: f64,
    pub decisions: Vec<DecisionScore>,
}

/// Offload-decision accuracy at one threshold.
#[derive(Debug, Serialize, PartialEq)]
pub struct DecisionScore {
    pub n_ns: u64,
    /// Share of calls where the decision ("move it": the call will run longer than N)
    /// matched "actual > N".
    pub right: f64,
    /// The better of "always offload" and "never offload" on the same calls.
    pub best_constant: f64,
    /// Share of calls that really ran longer than N.
    pub actual_above: f64,
}

#[derive(Debug, Serialize)]
pub struct TraceReport {
    pub trace: String,
    pub format: Format,
    pub calls: usize,
    /// Processes the calls came from, each replayed through predictors of its own.
    pub processes: usize,
    pub skipped_lines: usize,
    /// What each process's timed predictor started from.
    pub start: Start,
    pub forms: Vec<FormReport>,
}

impl TraceReport {
    /// The trace's file name without its folder (the path as given if it has none).
    fn file_name(&self) -> String {
        std::path::Path::new(&self.trace)
            .file_name()
            .map_or(self.trace.clone(), |n| n.to_string_lossy().into())
    }
}

/// At most this many processes' predictors are kept during a replay: a process seen again
/// after this many others have been starts afresh (a recorded trace holds one process at a
/// time; strace's interleaves the ones running together).
const LIVE_PROCESSES: usize = 64;

/// Replays `calls` through predictors of `form`, asking before telling, each process of the
/// trace through its own (as each process under the library has its own), started as `start`
/// says; a process ends at its last call of the trace. The timed form
/// decides by a vote kept at the threshold it decides at, so it gets one predictor per
/// threshold, each deciding and learning at its own; the paper's forms compare one prediction
/// with every threshold. The first predictor is also scored on its predicted run lengths.
pub fn evaluate(
    calls: &[TraceCall],
    form: TableForm,
    thresholds: &[u64],
    start: Start,
) -> anyhow::Result<FormReport> {
    let per_threshold = matches!(form, TableForm::Timed { .. });
    let count = if per_threshold { thresholds.len().max(1) } else { 1 };
    let last_call: HashMap<u32, usize> = calls.iter().enumerate().map(|(at, c)| (c.process, at)).collect();
    // What the last process to end had learned, per predictor.
    let mut handed_on: Option<Vec<Learned>> = None;
    let started = |handed_on: &Option<Vec<Learned>>| -> anyhow::Result<Vec<RunLengthPredictor>> {
        let mut predictors =
            (0..count).map(|_| RunLengthPredictor::new(form)).collect::<Result<Vec<_>, _>>()?;
        if let (Start::Inherited, Some(learned)) = (start, handed_on) {
            predictors.iter_mut().zip(learned).for_each(|(p, learned)| p.start_from(learned));
        }
        Ok(predictors)
    };
    // process → (the call it last made, its predictors).
    let mut live: HashMap<u32, (usize, Vec<RunLengthPredictor>)> = HashMap::new();
    let (mut exact, mut close, mut local, mut global, mut cold) = (0usize, 0usize, 0usize, 0usize, 0usize);
    let mut right = vec![0usize; thresholds.len()];
    let mut above = vec![0usize; thresholds.len()];
    for (at, c) in calls.iter().enumerate() {
        if !live.contains_key(&c.process) && live.len() == LIVE_PROCESSES {
            let idlest = live.iter().min_by_key(|(_, (last, _))| *last).map(|(&p, _)| p);
            live.remove(&idlest.expect("a full map has a least recently used process"));
        }
        let (last, predictors) = match live.entry(c.process) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert((at, started(&handed_on)?)),
        };
        *last = at;
        let p = predictors[0].predict_call(&c.call);
        exact += usize::from(p.run == c.run_ns);
        close += usize::from(within_tolerance(p.run, c.run_ns));
        match p.source {
            Source::Local => local += 1,
            Source::Global => global += 1,
            Source::Cold => cold += 1,
        }
        for (i, &n) in thresholds.iter().enumerate() {
            let predictor = &predictors[if per_threshold { i } else { 0 }];
            right[i] += usize::from(predictor.above_call(&c.call, n) == (c.run_ns > n));
            above[i] += usize::from(c.run_ns > n);
        }
        for (i, predictor) in predictors.iter_mut().enumerate() {
            predictor.observe_call(&c.call, c.run_ns, thresholds.get(i).copied().unwrap_or(0));
        }
        if last_call[&c.process] == at {
            handed_on = predictors.iter().map(RunLengthPredictor::learned).collect();
        }
    }
    let share = |count: usize| if calls.is_empty() { 0.0 } else { count as f64 / calls.len() as f64 };
    let decisions = thresholds
        .iter()
        .enumerate()
        .map(|(i, &n)| DecisionScore {
            n_ns: n,
            right: share(right[i]),
            best_constant: share(above[i].max(calls.len() - above[i])),
            actual_above: share(above[i]),
        })
        .collect();
    Ok(FormReport {
        form: form.label(),
        exact: share(exact),
        within_5pct: share(close),
        local: share(local),
        global: share(global),
        cold: share(cold),
        decisions,
    })
}

/// Parses and scores one trace file.
pub fn replay(path: &std::path::Path, args: &Args) -> anyhow::Result<TraceReport> {
    let text = corehop_topology::read_text_file(path, MAX_TRACE_BYTES).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidData => {
            anyhow::anyhow!("trace {} is not text (a trace is `strace -f -T` output or CSV)", path.display())
        }
        std::io::ErrorKind::FileTooLarge => {
            anyhow::anyhow!("trace {} is {e}: split it", path.display())
        }
        _ => anyhow::Error::new(e).context(format!("reading trace {}", path.display())),
    })?;
    let mut parsed = trace::parse(path, &text, args.format)?;
    if args.named_only {
        parsed.calls.retain(|c| c.call.kind.name().is_some());
    }
    anyhow::ensure!(!parsed.calls.is_empty(), "{}: no completed system calls to replay", path.display());
    let forms = [
        TableForm::FullyAssociative { entries: args.fa_entries },
        TableForm::DirectMapped { entries: args.dm_entries },
        TableForm::Timed { entries: args.dm_entries },
    ]
    .into_iter()
    .map(|form| evaluate(&parsed.calls, form, &args.thresholds, args.start))
    .collect::<anyhow::Result<_>>()?;
    Ok(TraceReport {
        trace: path.display().to_string(),
        format: parsed.format,
        calls: parsed.calls.len(),
        processes: parsed.calls.iter().map(|c| c.process).collect::<std::collections::HashSet<_>>().len(),
        skipped_lines: parsed.skipped,
        start: args.start,
        forms,
    })
}

/// The largest predictor table accepted: a thousand times the papers' 1500 entries, still
/// tens of MB, where an unchecked size would allocate until the process aborts.
const MAX_TABLE_ENTRIES: usize = 1 << 21;

/// The most thresholds scored at once: the timed form keeps a predictor per threshold.
const MAX_THRESHOLDS: usize = 64;

/// The largest trace read (1 GiB, some ten million calls), where an unchecked size would read
/// a file of any size, or a device that never ends, into memory.
const MAX_TRACE_BYTES: u64 = 1 << 30;

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(!args.thresholds.is_empty(), "--thresholds needs at least one value");
    anyhow::ensure!(
        args.thresholds.len() <= MAX_THRESHOLDS,
        "--thresholds takes at most {MAX_THRESHOLDS} values, got {}",
        args.thresholds.len()
    );
    anyhow::ensure!(args.fa_entries > 0 && args.dm_entries > 0, "predictor tables need at least one entry");
    anyhow::ensure!(
        args.fa_entries <= MAX_TABLE_ENTRIES && args.dm_entries <= MAX_TABLE_ENTRIES,
        "predictor tables hold at most {MAX_TABLE_ENTRIES} entries (--fa-entries {}, --dm-entries {})",
        args.fa_entries,
        args.dm_entries
    );
    let reports = args.traces.iter().map(|path| replay(path, &args)).collect::<anyhow::Result<Vec<_>>>()?;
    if args.json {
        report::print_json(&reports)?;
    } else {
        for r in &reports {
            println!("{}", table(r).render());
        }
        if let Some(t) = summary(&reports) {
            println!("{}", t.render());
        }
    }
    if let Some(path) = &args.plot {
        plot(path, &reports)?;
        if !args.json {
            println!("plot written to {}", path.display());
        }
    }
    Ok(())
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn table(r: &TraceReport) -> Table {
    let mut header = vec!["predictor".to_string(), "exact".into(), "±5%".into(), "local/global".into()];
    header.extend(r.forms[0].decisions.iter().map(|d| format!("right@N={}", report::fmt_ns(d.n_ns as f64))));
    let mut t = Table::new(header)
        .title(format!(
            "{} — {} calls of {} process(es) ({:?}), {} lines skipped",
            r.trace, r.calls, r.processes, r.format, r.skipped_lines
        ))
        .align(0, Align::Left);
    for f in &r.forms {
        let mut row = vec![
            f.form.clone(),
            pct(f.exact),
            pct(f.within_5pct),
            format!("{}/{}", pct(f.local), pct(f.global)),
        ];
        row.extend(f.decisions.iter().map(|d| pct(d.right)));
        t.row(row);
    }
    let mut baseline = vec!["best constant".to_string(), "-".into(), "-".into(), "-".into()];
    baseline.extend(r.forms[0].decisions.iter().map(|d| pct(d.best_constant)));
    t.row(baseline);
    t.note("right@N: share of calls where the decision \"it will run longer than N\" was right (fa, dm: predicted > N; time: its prediction, or the majority of the key's runs at N where that guessed better); best constant: always or never offload, whichever is right more often on this trace");
    if r.processes > 1 {
        t.note(match r.start {
            Start::Inherited => "time: each process started from what the last process to end had learned of call kinds, as under `corehop run` (--start fresh: each alone)",
            Start::Fresh => "time: each process started alone (--start fresh)",
        });
    }
    if r.format == Format::Strace {
        t.note("strace -T times have µs resolution and include tracing overhead");
    }
    t
}

/// Over several traces: each form's share of right decisions at each N averaged over the
/// traces (each trace weighs the same, however many calls it has), its mean over all N, and
/// at how many (trace, N) points it fell below that trace's best constant rule.
fn summary(reports: &[TraceReport]) -> Option<Table> {
    let [first, _, ..] = reports else { return None };
    let thresholds: Vec<u64> = first.forms[0].decisions.iter().map(|d| d.n_ns).collect();
    let mut header = vec!["predictor".to_string()];
    header.extend(thresholds.iter().map(|&n| format!("right@N={}", report::fmt_ns(n as f64))));
    header.extend(["mean".to_string(), "below constant".to_string()]);
    let mut t = Table::new(header)
        .title(format!("all {} traces: right decisions averaged over the traces", reports.len()))
        .align(0, Align::Left);
    let points = reports.len() * thresholds.len();
    // A row: `score` of each trace at each N, averaged over the traces, their mean, and `last`.
    let averaged = |name: &str, score: &dyn Fn(&TraceReport, usize) -> f64, last: String| {
        let by_n: Vec<f64> = (0..thresholds.len())
            .map(|i| reports.iter().map(|r| score(r, i)).sum::<f64>() / reports.len() as f64)
            .collect();
        let mut row = vec![name.to_string()];
        row.extend(by_n.iter().map(|&x| pct(x)));
        row.extend([pct(by_n.iter().sum::<f64>() / by_n.len() as f64), last]);
        row
    };
    for (f, form) in first.forms.iter().enumerate() {
        let below = reports
            .iter()
            .flat_map(|r| r.forms[f].decisions.iter())
            .filter(|d| d.right < d.best_constant)
            .count();
        let right = |r: &TraceReport, i: usize| r.forms[f].decisions[i].right;
        t.row(averaged(&form.form, &right, format!("{below} of {points}")));
    }
    let constant = |r: &TraceReport, i: usize| r.forms[0].decisions[i].best_constant;
    t.row(averaged("best constant", &constant, "-".into()));
    t.note("below constant: (trace, N) points where the form was right less often than always or never offloading, whichever was better on that trace");
    for (f, form) in first.forms.iter().enumerate() {
        if let Some(points) = points_below(reports, f) {
            t.note(format!("{} below the constant at: {points}", form.form));
        }
    }
    Some(t)
}

/// Where form `f` fell below the best constant rule, by how many calls: "trace N=…: k calls"
/// for each point, if there are some and few enough (at most [`POINTS_NAMED`]) to read.
fn points_below(reports: &[TraceReport], f: usize) -> Option<String> {
    let points: Vec<String> = reports
        .iter()
        .flat_map(|r| r.forms[f].decisions.iter().map(move |d| (r, d)))
        .filter(|(_, d)| d.right < d.best_constant)
        .map(|(r, d)| {
            let name = r.file_name();
            let calls = ((d.best_constant - d.right) * r.calls as f64).round();
            format!("{name} N={}: {calls} of {} calls", report::fmt_ns(d.n_ns as f64), r.calls)
        })
        .collect();
    (!points.is_empty() && points.len() <= POINTS_NAMED).then(|| points.join("; "))
}

/// Points below the constant a summary names one by one, at most (a form below it nearly
/// everywhere is told by its count).
const POINTS_NAMED: usize = 12;

fn plot(path: &std::path::Path, reports: &[TraceReport]) -> anyhow::Result<()> {
    let mut series = vec![];
    for r in reports {
        let name = r.file_name();
        for f in &r.forms {
            let points = f.decisions.iter().map(|d| (d.n_ns as f64, 100.0 * d.right)).collect();
            series.push(Series { name: format!("{name} {}", f.form), points });
        }
        let points = r.forms[0].decisions.iter().map(|d| (d.n_ns as f64, 100.0 * d.best_constant)).collect();
        series.push(Series { name: format!("{name} best constant"), points });
    }
    report::plot_lines(
        path,
        "Right offload decisions against threshold N",
        "N (ns)",
        "right decisions (%)",
        Scale::Log10,
        &series,
    )
}

/// One line for the tour: the predictor on the bundled SQLite trace, against the best
/// constant decision.
pub fn tour_summary() -> anyhow::Result<String> {
    let text = include_str!("../../tests/fixtures/traces/recorded/sqlite3.csv");
    let parsed = trace::parse(std::path::Path::new("sqlite3.csv"), text, Format::Csv)?;
    let thresholds = [1_000, 2_000, 5_000, 20_000];
    let timed = evaluate(&parsed.calls, TableForm::TIMED, &thresholds, Start::Inherited)?;
    let paper = evaluate(&parsed.calls, TableForm::PAPER_FA, &thresholds, Start::Inherited)?;
    let joined = |parts: Vec<String>| parts.join(" / ");
    let row = |form: &FormReport| joined(form.decisions.iter().map(|d| pct(d.right)).collect());
    let ns = joined(thresholds.iter().map(|&n| report::fmt_ns(n as f64)).collect());
    Ok(format!(
        "run-length predictor on a sqlite3 trace recorded by `corehop run --record-trace` ({} calls, run lengths in ns)\n\
         decisions right at N = {ns}:\n  timed (corehop run's)    {}\n  the paper's form (FA)    {}  (its exact / ±5 % hits: {} / {})\n  best constant rule       {}",
        parsed.calls.len(),
        row(&timed),
        row(&paper),
        pct(paper.exact),
        pct(paper.within_5pct),
        joined(timed.decisions.iter().map(|d| pct(d.best_constant)).collect()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use corehop_policy::offload::{CallDesc, CallKind};

    fn calls(runs: &[(u64, u64)]) -> Vec<TraceCall> {
        runs.iter()
            .map(|&(site, run_ns)| TraceCall {
                call: CallDesc::new(CallKind::Read, 3, 64, site),
                run_ns,
                process: 0,
            })
            .collect()
    }

    #[test]
    fn scores_a_hand_built_trace() {
        // site 1 steady at 100, site 2 steady at 10 000: after the first sight each is exact.
        let trace = calls(&[(1, 100), (2, 10_000), (1, 100), (2, 10_000), (1, 100), (2, 10_000)]);
        let r = evaluate(&trace, TableForm::PAPER_FA, &[1_000], Start::Inherited).unwrap();
        // Predictions: cold 0, global 100, local 100, local 10 000, local 100, local 10 000.
        assert_eq!(r.exact, 4.0 / 6.0);
        assert_eq!(r.within_5pct, 4.0 / 6.0);
        assert_eq!((r.local, r.global, r.cold), (4.0 / 6.0, 1.0 / 6.0, 1.0 / 6.0));
        // Wrong side of N = 1000 only for site 2's first call (predicted 100).
        assert_eq!(
            r.decisions[0],
            DecisionScore { n_ns: 1_000, right: 5.0 / 6.0, best_constant: 0.5, actual_above: 0.5 }
        );
    }

    #[test]
    fn each_process_learns_alone() {
        // The same key in three processes, the first seen again after the others: each of
        // them starts cold; the first still knows its key when it comes back.
        let mut trace = calls(&[(1, 100), (1, 100), (1, 100), (1, 100), (1, 100)]);
        for (call, process) in trace.iter_mut().zip([0, 0, 1, 2, 0]) {
            call.process = process;
        }
        let r = evaluate(&trace, TableForm::PAPER_FA, &[1_000], Start::Inherited).unwrap();
        assert_eq!((r.local, r.cold), (2.0 / 5.0, 3.0 / 5.0));
        // With more processes between than are kept, the first starts afresh.
        let mut trace = calls(&vec![(1, 100); LIVE_PROCESSES + 2]);
        for (i, call) in trace.iter_mut().enumerate() {
            call.process = (i % (LIVE_PROCESSES + 1)) as u32;
        }
        let r = evaluate(&trace, TableForm::PAPER_FA, &[1_000], Start::Inherited).unwrap();
        assert_eq!(r.cold, 1.0);
    }
}
