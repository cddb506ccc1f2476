//! One module per subcommand; each has `Args` (clap) and `run(Args)`.
pub mod topo;
