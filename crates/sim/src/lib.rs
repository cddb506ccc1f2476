//! A deterministic discrete-event simulator of asymmetric multicores.
#![forbid(unsafe_code)]

pub mod models;
