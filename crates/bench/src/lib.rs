//! corehop's workloads and side-by-side benchmarks, as a library.
//!
//! Each module is one `corehop bench` command: its clap `Args`, a `run` that measures the
//! mechanisms side by side with a same-run baseline and reports through [`report`], a quick
//! `tour`, and the workload itself (SQLite TPC-B transactions, a loopback file server,
//! directory lookups, a packet-processing pipeline, SMT mode schedules) as plain functions
//! that criterion benchmarks (`benches/`) call too.
#![warn(missing_docs)]

pub mod delegate;
pub mod modes;
pub mod o2;
pub mod offload;
pub mod pair;
pub mod pipeline;
pub mod report;
pub mod switch;
