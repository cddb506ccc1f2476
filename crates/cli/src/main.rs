//! The `corehop` command.
use clap::{Parser, Subcommand};

mod cmd;

/// corehop puts each piece of work on the CPU core that suits it.
#[derive(Parser)]
#[command(name = "corehop", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show this machine as corehop sees it: CPUs, cores, SMT siblings, caches, classes, speeds.
    Topo(cmd::topo::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Topo(args) => cmd::topo::run(args),
    }
}
