//! `corehop tour`: the front door. This machine as corehop sees it, the hop mechanisms
//! measured here against the cache-line floor, then a quick run of each subsystem.

use std::time::Instant;

use corehop_bench as bench;

use super::{predict, run as run_cmd, sim, topo};

/// Runs every part of the tour in turn; a part that fails is reported and the tour goes on.
#[derive(clap::Args)]
pub struct Args {
    /// Run only the parts whose names contain this text (e.g. `--only switch`).
    #[arg(long)]
    only: Option<String>,
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
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for &(name, what, part) in PARTS {
        if args.only.as_deref().is_some_and(|only| !name.contains(only)) {
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
