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
//!
//! Two numberings exist side by side: [`CpuId`] is the dense index inside one machine
//! (`0..machine.cpus().len()`), [`OsCpu`] the kernel's number ([`Cpu::os_id`]). They differ
//! when the process may use only some CPUs.
//!
//! # Examples
//! ```
//! use corehop_topology::{presets, CpuId, Machine};
//!
//! // A paper's machine: two 3 GHz complex cores and a 3.5 MB shared L2.
//! let mut machine = presets::by_name("switch-cc")?;
//! machine.apply_emulation("1=0.25")?; // the paper's `sim_Cc`, emulated
//! assert_eq!(machine.cpu(CpuId(1)).unwrap().effective_speed(), 0.25);
//! assert_eq!(machine.shared_cache(CpuId(0), CpuId(1)).unwrap().level, 2);
//!
//! // Saved and loaded back as a machine file.
//! let loaded = Machine::from_toml_str(&machine.to_toml_string())?;
//! assert_eq!(loaded.cpus(), machine.cpus());
//!
//! // This host, restricted to the CPUs this process may use.
//! if std::path::Path::new("/sys/devices/system/cpu").is_dir() {
//!     let host = corehop_topology::discover()?;
//!     assert!(host.cpus().iter().all(|cpu| cpu.speed > 0.0 && cpu.speed <= 1.0));
//! }
//! # Ok::<(), corehop_topology::TopologyError>(())
//! ```
#![warn(missing_docs)]
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
pub use error::{excerpt, TopologyError, MESSAGE_CHARS, VALUE_CHARS};
pub use file::{read_text_file, MAX_DESCRIPTION_BYTES};

/// The most CPUs a machine may have, and one past the largest CPU number: Linux's own
/// largest `NR_CPUS`. Every count and CPU number read from outside is checked against it.
pub const MAX_CPUS: usize = 8192;
pub use machine::*;
