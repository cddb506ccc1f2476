//! `corehop tour`: the front door. This machine as corehop sees it, the hop mechanisms
//! measured here against the cache-line floor, then a quick run of each subsystem.

use std::time::Instant;

use corehop_bench as bench;

use super::{predict, run as run_cmd, sim, topo};

/// Runs every part of the tour in turn; a part that fails is reported and the tour goes on.
#[derive(clap::Args)]
#[command(
    after_help = "--json prints, instead of the narrative, `{parts: [{name, what, ok, seconds, error, output}], \
seconds, ok, failed}`: each part runs as `corehop tour --only NAME` in a process of its own, `output` is what \
it printed, `error` null or why it failed; a line a part goes to standard error as it ends."
)]
pub struct Args {
    /// Run only the parts whose names contain this text (e.g. `--only switch`).
    #[arg(long)]
    only: Option<String>,
    /// Print a JSON summary of the parts, each part's narrative in it, instead of the narrative.
    #[arg(long)]
    json: bool,
}

/// One part's outcome, for `--json`.
#[derive(serde::Serialize)]
struct PartJson {
    name: &'static str,
    what: &'static str,
    ok: bool,
    seconds: f64,
    error: Option<String>,
    output: String,
}

#[derive(serde::Serialize)]
struct TourJson {
    parts: Vec<PartJson>,
    seconds: f64,
    ok: usize,
    failed: usize,
}

type Part = (&'static str, &'static str, fn() -> anyhow::Result<()>);

const PARTS: &[Part] = &[
    ("machine", "this machine as corehop sees it", topo::tour),
    ("switch", "hop mechanisms vs the cache-line floor (fast-core-switching)", bench::switch::tour),
    ("offload", "system-call offload policies (selective-os-offload)", bench::offload::tour),
    ("predict", "the run-length predictor on a recorded trace", predict_part),
    ("run", "an unmodified program with LD_PRELOAD offload", run_cmd::tour),
    ("o2", "operations sent to the core that caches their object (O²)", bench::o2::tour),
    ("pipeline", "components on dedicated or slow cores (multiserver)", bench::pipeline::tour),
    ("modes", "SMT AMP vs SMP vs hybrid (smt-asymmetric-multiprocessing)", bench::modes::tour),
    ("sim", "a paper experiment in the simulator", sim::tour),
];

fn predict_part() -> anyhow::Result<()> {
    println!("{}", predict::tour_summary()?);
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(only) = &args.only {
        let names: Vec<&str> = PARTS.iter().map(|p| p.0).collect();
        anyhow::ensure!(
            names.iter().any(|name| name.contains(only.as_str())),
            "--only {only:?} names no part of the tour; its parts: {}",
            names.join(", ")
        );
    }
    if args.json {
        return run_json(args.only.as_deref());
    }
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for &(name, what, part) in PARTS {
        if !chosen(args.only.as_deref(), name) {
            continue;
        }
        println!("\n━━ {name}: {what} ━━");
        let t = Instant::now();
        let result = part();
        let secs = t.elapsed().as_secs_f64();
        if let Err(err) = &result {
            println!("!! {name} failed: {err:#}");
        }
        outcomes.push((name, result.is_ok(), secs));
    }
    println!("\n━━ summary ━━");
    for (name, ok, secs) in &outcomes {
        println!("  {:<10} {:<6} {:>6.1} s", name, if *ok { "ok" } else { "FAILED" }, secs);
    }
    let failed = outcomes.iter().filter(|o| !o.1).count();
    println!(
        "  tour took {:.0} s; {} of {} parts ok",
        started.elapsed().as_secs_f64(),
        outcomes.len() - failed,
        outcomes.len()
    );
    anyhow::ensure!(failed == 0, "{failed} part(s) of the tour failed");
    Ok(())
}

/// Whether `--only` (if given) picks the part `name`.
fn chosen(only: Option<&str>, name: &str) -> bool {
    only.is_none_or(|only| name.contains(only))
}

/// `--json`: each part in a process of its own (`corehop tour --only NAME`), so that what it
/// prints lands in the summary and not on standard output.
fn run_json(only: Option<&str>) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let started = Instant::now();
    let mut parts = Vec::new();
    for &(name, what, _) in PARTS {
        if !chosen(only, name) {
            continue;
        }
        let t = Instant::now();
        let out = std::process::Command::new(&exe).args(["tour", "--only", name]).output()?;
        let seconds = t.elapsed().as_secs_f64();
        let ok = out.status.success();
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let error = (!ok).then(|| if stderr.is_empty() { out.status.to_string() } else { stderr });
        eprintln!("tour: {name} {} in {seconds:.1} s", if ok { "ok" } else { "FAILED" });
        let output = String::from_utf8_lossy(&out.stdout).into_owned();
        parts.push(PartJson { name, what, ok, seconds, error, output });
    }
    let failed = parts.iter().filter(|p| !p.ok).count();
    let summary =
        TourJson { ok: parts.len() - failed, failed, seconds: started.elapsed().as_secs_f64(), parts };
    println!("{}", serde_json::to_string_pretty(&summary)?);
    anyhow::ensure!(failed == 0, "{failed} part(s) of the tour failed");
    Ok(())
}
