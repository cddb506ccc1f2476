//! Every corehop decision, as pure deterministic code.
//!
//! No threads, no clocks, no system calls: time comes in as numbers (nanoseconds or cycles,
//! as each type documents), observations come in as method calls, decisions come out as values.
//! The live runtime and the simulator are two drivers of the same code.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod components;
pub mod objects;
pub mod offload;
pub mod payoff;
pub mod pick;
pub mod smt;
pub mod spin;
