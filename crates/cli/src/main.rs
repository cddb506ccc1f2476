//! The `corehop` command.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;

/// corehop puts each piece of work on the CPU core that suits it.
///
/// Start with `corehop tour`: this machine as corehop sees it, the hop mechanisms measured
/// against the cache-line floor, and a quick run of each subsystem.
#[derive(Parser)]
#[command(name = "corehop", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A two-minute tour: this machine, hop costs measured here, each subsystem in brief.
    Tour(cmd::tour::Args),
    Topo(cmd::topo::Args),
    /// Measure corehop's mechanisms on this machine, each next to a same-run baseline.
    #[command(subcommand)]
    Bench(cmd::bench::Bench),
    Sim(cmd::sim::Args),
    /// Run an unmodified program with system-call offload to service CPUs (LD_PRELOAD).
    Run(cmd::run::Args),
    Predict(cmd::predict::Args),
}

/// Runs the command; an error is printed as its chain of causes on one line (no backtrace,
/// whatever `RUST_BACKTRACE` says), and a program that could not be started ends corehop as
/// it would end a shell (127: not found, 126: not runnable).
fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corehop: {e:#}");
            ExitCode::from(e.downcast_ref::<cmd::run::NotStarted>().map_or(1, |n| n.exit_code()))
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Tour(args) => cmd::tour::run(args),
        Command::Topo(args) => cmd::topo::run(args),
        Command::Bench(bench) => cmd::bench::run(bench),
        Command::Sim(args) => cmd::sim::run(args),
        Command::Run(args) => cmd::run::run(args),
        Command::Predict(args) => cmd::predict::run(args),
    }
}
