//! Workload models, one module per paper experiment family.
pub mod objects;
pub mod offload;
pub mod pipeline;
pub mod smt;
pub mod switch;
