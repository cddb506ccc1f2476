//! Everything that can be wrong with a machine description, a CPU list or a sysfs tree.

use std::path::PathBuf;

use thiserror::Error;

/// Why a machine could not be built, loaded, discovered or changed.
///
/// Variants carry the offending values so a message can name the problem exactly.
#[derive(Debug, Error)]
pub enum TopologyError {
    // The messages below include the inner error's text, so they do not also chain it as a
    // `source` (anyhow would print it twice).
    /// A problem inside a machine file; `problem` says what.
    #[error("machine file {}: {problem}", path.display())]
    InFile { path: PathBuf, problem: Box<TopologyError> },
    #[error("cannot read {}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    /// TOML syntax, an unknown key, a value of the wrong type (the message has the line).
    #[error("{0}")]
    Syntax(String),
    #[error("the machine has no CPUs")]
    Empty,
    /// A CPU count or number past [`crate::MAX_CPUS`] (Linux's own limit): refused before
    /// anything that size is allocated.
    #[error("{what} is {value}; at most {} CPUs (cpu0..cpu{}) are supported", crate::MAX_CPUS, crate::MAX_CPUS - 1)]
    TooManyCpus { what: String, value: u128 },
    #[error("{what} {value} is listed twice")]
    Duplicate { what: &'static str, value: usize },
    #[error("cpu{cpu} has speed {speed}; a speed must be in (0, 1], 1.0 being the fastest core")]
    BadSpeed { cpu: usize, speed: f64 },
    #[error("cpu{cpu} has emulated speed {speed}; an emulated speed must be in (0, 1]")]
    BadEmulatedSpeed { cpu: usize, speed: f64 },
    #[error("{cache} lists cpu{cpu}, but the machine has only {cpus} CPUs (cpu0..cpu{})", cpus.saturating_sub(1))]
    CacheUnknownCpu { cache: String, cpu: usize, cpus: usize },
    #[error("{0}")]
    Inconsistent(String),
    #[error("bad CPU list {input:?}: {reason}")]
    CpuList { input: String, reason: String },
    #[error("bad size {input:?}: expected bytes or a number with K, M or G (e.g. 32K, 8M)")]
    Size { input: String },
    #[error("bad emulation {input:?}: {reason} (expected e.g. \"1=0.25,3=0.5\" or \"2-3=0.5\")")]
    Emulation { input: String, reason: String },
    #[error("cpu{cpu} does not exist; this machine has cpu0..cpu{}", cpus.saturating_sub(1))]
    UnknownCpu { cpu: usize, cpus: usize },
    #[error("unknown preset {name:?}; known presets: {}", known.join(", "))]
    UnknownPreset { name: String, known: Vec<&'static str> },
    #[error("no CPUs found under {}: {reason}", root.display())]
    NoCpus { root: PathBuf, reason: String },
    #[error("none of the online CPUs ({online}) is allowed for this process (allowed: {allowed})")]
    NothingAllowed { online: String, allowed: String },
}

impl TopologyError {
    /// Wraps `self` so that its message names the file it came from.
    pub fn in_file(self, path: impl Into<PathBuf>) -> TopologyError {
        TopologyError::InFile { path: path.into(), problem: Box::new(self) }
    }
}
