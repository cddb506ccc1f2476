//! `corehop bench …`: mechanisms measured side by side, each with a same-run baseline.
use clap::Subcommand;

pub mod modes;
pub mod o2;
pub mod offload;
pub mod pipeline;
pub mod switch;

#[derive(Subcommand)]
pub enum Bench {
    /// Hop round trips per mechanism and wake-up vs the cache-line floor and a plain gettid.
    Switch(switch::Args),
    /// Offload policies side by side on SQLite transactions and a loopback file server.
    Offload(offload::Args),
    /// Directory lookups under plain threads, static sharding and O² object scheduling.
    O2(o2::Args),
    /// A driver → IP → TCP → sink pipeline under placements and emulated core speeds.
    Pipeline(pipeline::Args),
    /// SMT modes (AMP vs SMP vs hybrid) live, where the machine has SMT.
    Modes(modes::Args),
}

pub fn run(bench: Bench) -> anyhow::Result<()> {
    match bench {
        Bench::Switch(args) => switch::run(args),
        Bench::Offload(args) => offload::run(args),
        Bench::O2(args) => o2::run(args),
        Bench::Pipeline(args) => pipeline::run(args),
        Bench::Modes(args) => modes::run(args),
    }
}
