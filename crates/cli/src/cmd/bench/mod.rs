//! `corehop bench …`: mechanisms measured side by side, each with a same-run baseline. The
//! workloads live in the `corehop-bench` crate; `run-suite` (real programs under `corehop
//! run`) lives here beside `run`.
use clap::Subcommand;
use corehop_bench::{delegate, modes, o2, offload, pipeline, switch};

/// Each variant's help is its `Args` doc comment (the first line is the summary).
#[derive(Subcommand)]
pub enum Bench {
    Switch(switch::Args),
    Delegate(delegate::Args),
    Offload(offload::Args),
    O2(o2::Args),
    Pipeline(pipeline::Args),
    Modes(modes::Args),
    RunSuite(super::suite::Args),
}

pub fn run(bench: Bench) -> anyhow::Result<()> {
    corehop_bench::report::OutsideLoad::warn_around(|| match bench {
        Bench::Switch(args) => switch::run(args),
        Bench::Delegate(args) => delegate::run(args),
        Bench::Offload(args) => offload::run(args),
        Bench::O2(args) => o2::run(args),
        Bench::Pipeline(args) => pipeline::run(args),
        Bench::Modes(args) => modes::run(args),
        Bench::RunSuite(args) => super::suite::run(args),
    })
}
