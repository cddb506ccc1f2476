//! What the machine is.
//!
//! A [`Machine`] lists the CPUs a process may use, grouped into cores (SMT siblings share a
//! core) and packages, with their caches, core class (big/little, P/E) and relative speed.
//! It is plain read-only data, built four ways:
//!
//! - by discovery from sysfs ([`discover`]), respecting the affinity mask and cgroup cpuset;
//! - from a TOML machine description ([`Machine::from_toml_str`], [`Machine::from_toml_file`]);
//! - from a built-in preset of the papers' machines ([`presets`]);
//! - from groups of identical cores in code ([`MachineBuilder`]), for tests and synthetic
//!   machines.
//!
//! Emulation overrides ("cpu 1 runs at 0.25 of full speed") are part of the description, so the
//! runtime and the simulator read them from the same place. Nothing here schedules anything.
#![forbid(unsafe_code)]

mod builder;
mod cpulist;
mod discover;
mod emulate;
mod error;
mod file;
mod machine;
pub mod presets;

pub use builder::{CacheSpec, CoreGroup, MachineBuilder, Per};
pub use cpulist::{format_cpu_list, format_size, parse_cpu_list, parse_size};
pub use discover::{
    affinity_from_status, cgroup_cpuset, cpuinfo_has_flag, discover, discover_at, discover_with,
    DiscoverOptions, Discovery, SpeedSource,
};
pub use emulate::parse_emulation;
pub use error::TopologyError;
pub use machine::*;
