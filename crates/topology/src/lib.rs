//! What the machine is.
//!
//! A [`Machine`] lists the CPUs a process may use, grouped into cores (SMT siblings share a
//! core) and packages, with their caches, core class (big/little, P/E) and relative speed.
//! It is plain read-only data, built three ways:
//!
//! - by discovery from sysfs ([`discover`]), respecting the affinity mask and cgroup cpuset;
//! - from a TOML machine description ([`Machine::from_toml_str`]);
//! - from a built-in preset of the papers' machines ([`presets`]).
//!
//! Emulation overrides ("cpu 1 runs at 0.25 of full speed") are part of the description, so the
//! runtime and the simulator read them from the same place. Nothing here schedules anything.
#![forbid(unsafe_code)]

mod machine;

pub use machine::*;
