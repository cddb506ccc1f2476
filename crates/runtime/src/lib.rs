//! The live corehop runtime on Linux.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod sys;

// Subsystems built on the core runtime; each lands with its issue.
pub mod components;
pub mod objects;
pub mod service;
pub mod smt;
