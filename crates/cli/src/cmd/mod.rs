//! One module per subcommand; each has `Args` (clap) and `run(Args)`.
pub mod bench;
pub mod predict;
pub mod run;
pub mod sim;
pub mod suite;
pub mod topo;
pub mod tour;
