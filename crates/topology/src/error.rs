//! Everything that can be wrong with a machine description, a CPU list or a sysfs tree.

use std::path::PathBuf;

use thiserror::Error;

/// Why a machine could not be built, loaded, discovered or changed.
///
/// Variants carry the offending values so a message can name the problem exactly.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TopologyError {
    // The messages below include the inner error's text, so they do not also chain it as a
    // `source` (anyhow would print it twice).
    /// A problem inside a machine file; `problem` says what.
    #[error("machine file {}: {problem}", path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// What is wrong in it.
        problem: Box<TopologyError>,
    },
    /// A file could not be read.
    #[error("cannot read {}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
    /// TOML syntax, an unknown key, a value of the wrong type (the message has the line).
    #[error("{0}")]
    Syntax(String),
    /// A machine with no CPUs.
    #[error("the machine has no CPUs")]
    Empty,
    /// A CPU count or number past [`crate::MAX_CPUS`] (Linux's own limit): refused before
    /// anything that size is allocated.
    #[error("{what} is {value}; at most {} CPUs (cpu0..cpu{}) are supported", crate::MAX_CPUS, crate::MAX_CPUS - 1)]
    TooManyCpus {
        /// What was counted or numbered.
        what: String,
        /// Its value.
        value: u128,
    },
    /// A CPU, core or cache listed twice.
    #[error("{what} {value} is listed twice")]
    Duplicate {
        /// What was listed.
        what: &'static str,
        /// Its number.
        value: usize,
    },
    /// A speed outside (0, 1].
    #[error("cpu{cpu} has speed {speed}; a speed must be in (0, 1], 1.0 being the fastest core")]
    BadSpeed {
        /// The CPU.
        cpu: usize,
        /// Its speed.
        speed: f64,
    },
    /// An emulated speed outside (0, 1].
    #[error("cpu{cpu} has emulated speed {speed}; an emulated speed must be in (0, 1]")]
    BadEmulatedSpeed {
        /// The CPU.
        cpu: usize,
        /// Its emulated speed.
        speed: f64,
    },
    /// A cache shared by a CPU the machine does not have.
    #[error("{cache} lists cpu{cpu}, but the machine has only {cpus} CPUs (cpu0..cpu{})", cpus.saturating_sub(1))]
    CacheUnknownCpu {
        /// The cache.
        cache: String,
        /// The CPU it names.
        cpu: usize,
        /// How many CPUs the machine has.
        cpus: usize,
    },
    /// A description that contradicts itself (the message says how).
    #[error("{0}")]
    Inconsistent(String),
    /// A CPU list (`0-3,6`) that does not parse.
    #[error("bad CPU list {input:?}: {reason}")]
    CpuList {
        /// The text.
        input: String,
        /// Why.
        reason: String,
    },
    /// A size (`32K`, `8M`) that does not parse.
    #[error("bad size {input:?}: expected bytes or a number with K, M or G (e.g. 32K, 8M)")]
    Size {
        /// The text.
        input: String,
    },
    /// An emulation override (`1=0.25`) that does not parse.
    #[error("bad emulation {input:?}: {reason} (expected e.g. \"1=0.25,3=0.5\" or \"2-3=0.5\")")]
    Emulation {
        /// The text.
        input: String,
        /// Why.
        reason: String,
    },
    /// A CPU the machine does not have.
    #[error("cpu{cpu} does not exist; this machine has cpu0..cpu{}", cpus.saturating_sub(1))]
    UnknownCpu {
        /// The CPU asked for.
        cpu: usize,
        /// How many CPUs the machine has.
        cpus: usize,
    },
    /// A preset name that is not built in.
    #[error("unknown preset {name:?}; known presets: {}", known.join(", "))]
    UnknownPreset {
        /// The name asked for.
        name: String,
        /// The names there are.
        known: Vec<&'static str>,
    },
    /// A sysfs tree with no CPUs in it.
    #[error("no CPUs found under {}: {reason}", root.display())]
    NoCpus {
        /// The tree.
        root: PathBuf,
        /// Why nothing was found.
        reason: String,
    },
    /// Online CPUs exist, but this process may use none of them.
    #[error("none of the online CPUs ({online}) is allowed for this process (allowed: {allowed})")]
    NothingAllowed {
        /// The online CPUs.
        online: String,
        /// The CPUs the affinity mask and cpuset allow.
        allowed: String,
    },
}

impl TopologyError {
    /// Wraps `self` so that its message names the file it came from.
    pub fn in_file(self, path: impl Into<PathBuf>) -> TopologyError {
        TopologyError::InFile { path: path.into(), problem: Box::new(self) }
    }
}
