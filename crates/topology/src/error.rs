//! Everything that can be wrong with a machine description, a CPU list or a sysfs tree.

use std::borrow::Cow;
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
    #[error("bad CPU list {:?}: {reason}", excerpt(input, VALUE_CHARS))]
    CpuList {
        /// The text.
        input: String,
        /// Why.
        reason: String,
    },
    /// A size (`32K`, `8M`) that does not parse.
    #[error(
        "bad size {:?}: expected bytes or a number with K, M or G (e.g. 32K, 8M)",
        excerpt(input, VALUE_CHARS)
    )]
    Size {
        /// The text.
        input: String,
    },
    /// An emulation override (`1=0.25`) that does not parse.
    #[error(
        "bad emulation {:?}: {reason} (expected e.g. \"1=0.25,3=0.5\" or \"2-3=0.5\")",
        excerpt(input, VALUE_CHARS)
    )]
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
    #[error("unknown preset {:?}; known presets: {}", excerpt(name, VALUE_CHARS), known.join(", "))]
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

/// Characters of a user's value (a key, a name, a CPU list) that an error message quotes.
pub const VALUE_CHARS: usize = 160;
/// Characters of a parser's message (which may quote the input) that an error shows.
pub const MESSAGE_CHARS: usize = 1000;

/// `text` as an error message quotes it: whole when it has at most `max_chars` characters,
/// else its first three quarters and last quarter of them around a count of the bytes left
/// out. A file of one long line (a binary, a minified blob) or a long argument must not come
/// back as a message the size of the file.
pub fn excerpt(text: &str, max_chars: usize) -> Cow<'_, str> {
    let chars = text.chars().count();
    if chars <= max_chars {
        return Cow::Borrowed(text);
    }
    let (head, tail) = (max_chars - max_chars / 4, max_chars / 4);
    let at = |n: usize| text.char_indices().nth(n).map_or(text.len(), |(i, _)| i);
    let (head_end, tail_start) = (at(head), at(chars - tail));
    let left_out = tail_start - head_end;
    Cow::Owned(format!("{}…({left_out} bytes)…{}", &text[..head_end], &text[tail_start..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpt_keeps_short_text_and_both_ends_of_long_text() {
        assert_eq!(excerpt("cpu3", VALUE_CHARS), "cpu3");
        let long = format!("{}{}{}", "a".repeat(120), "é".repeat(1000), "z".repeat(40));
        let shown = excerpt(&long, VALUE_CHARS);
        assert_eq!(shown, format!("{}…(2000 bytes)…{}", "a".repeat(120), "z".repeat(40)));
        let exact = "x".repeat(MESSAGE_CHARS);
        assert_eq!(excerpt(&exact, MESSAGE_CHARS), exact.as_str());
    }
}
