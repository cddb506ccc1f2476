//! The `corehop` command.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cmd;
mod deferred;
mod environment;
mod inherited;
mod preloadable;
mod spawn;

use deferred::{Deferred, DeferredSub};

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

/// The subcommands. Those with a one-line help of their own here build their arguments only
/// when chosen ([`deferred`]); `topo`, `sim` and `predict` take theirs from their arguments'
/// doc comment, which a deferred command has only once built (and they cost 15–20 µs).
#[derive(Subcommand)]
enum Command {
    /// A two-minute tour: this machine, hop costs measured here, each subsystem in brief.
    Tour(Deferred<cmd::tour::Args>),
    Topo(cmd::topo::Args),
    /// Measure corehop's mechanisms on this machine, each next to a same-run baseline.
    #[command(subcommand)]
    Bench(DeferredSub<cmd::bench::Bench>),
    Sim(cmd::sim::Args),
    /// Run an unmodified program with system-call offload to service CPUs (LD_PRELOAD).
    Run(Deferred<cmd::run::Args>),
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
            // Each part quotes at most a few hundred characters of input already; this bounds
            // what a chain of causes adds up to.
            eprintln!(
                "corehop: {}",
                corehop_topology::excerpt(&format!("{e:#}"), 4 * corehop_topology::MESSAGE_CHARS)
            );
            ExitCode::from(e.downcast_ref::<cmd::run::NotStarted>().map_or(1, |n| n.exit_code()))
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Tour(Deferred(args)) => cmd::tour::run(args),
        Command::Topo(args) => cmd::topo::run(args),
        Command::Bench(DeferredSub(bench)) => cmd::bench::run(bench),
        Command::Sim(args) => cmd::sim::run(args),
        Command::Run(Deferred(args)) => cmd::run::run(args),
        Command::Predict(args) => cmd::predict::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn a_panic_unwinds_with_the_static_unwinder() {
        // build.rs links libgcc_eh in place of libgcc_s: catching a panic must still work.
        let caught = std::panic::catch_unwind(|| panic!("unwinds"));
        assert!(caught.is_err());
    }

    #[test]
    fn the_command_line_is_consistent_with_every_subcommand_built() {
        // `build` runs the deferred parts too, so clap's checks cover them.
        Cli::command().debug_assert();
    }

    #[test]
    fn a_deferred_subcommand_is_listed_with_its_help_and_parses_its_arguments() {
        let mut cli = Cli::command();
        for name in ["tour", "bench", "run"] {
            let sub = cli.find_subcommand(name).unwrap();
            assert!(sub.get_about().is_some(), "{name} has no one-line help in the list");
        }
        cli.build();
        let run = cli.find_subcommand("run").unwrap();
        assert!(run.get_arguments().any(|a| a.get_id() == "offload"), "run's arguments were not built");
        assert_eq!(
            run.get_about().map(ToString::to_string).as_deref(),
            Some("Run an unmodified program with system-call offload to service CPUs (LD_PRELOAD)"),
            "the variant's help must win over the arguments' own"
        );
        let parsed =
            Cli::try_parse_from(["corehop", "run", "--offload", "--policy", "never", "--", "true"]).unwrap();
        let Command::Run(Deferred(args)) = parsed.command else { panic!("not run") };
        assert!(args.offload);
        let help = Cli::try_parse_from(["corehop", "bench", "switch", "--help"])
            .err()
            .expect("--help is not a parse");
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        assert!(Cli::try_parse_from(["corehop", "bench", "nosuch"]).is_err());
    }
}
