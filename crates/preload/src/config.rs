//! The environment `corehop run` sets for the library, parsed once at start-up.
//!
//! | variable | meaning | default |
//! | --- | --- | --- |
//! | `COREHOP_SERVICE_CPUS` | kernel CPU numbers for the service threads, e.g. `1` or `2,3` or `2-3` (one thread each, at most 8) | the last CPU the process may use |
//! | `COREHOP_POLICY` | which calls go across: `adaptive`, `never`, `always`, `size[:BYTES]`, … (see [`crate::decide`]) | `adaptive` (as `corehop run`) |
//! | `COREHOP_SPIN_NS` | the longest a caller spins for its reply before sleeping (a quarter of it after a reply that needed a sleep), and an idle service thread's first polling budget | 20000 |
//! | `COREHOP_STALL_TIMEOUT_NS` | how long a caller waits for its request to be claimed before running it itself | 10000000 |
//! | `COREHOP_STATS_FILE` | file to append the exit summary to (see [`crate::stats`]); `-` is stderr | none |
//! | `COREHOP_TRACE_FILE` | file to append every intercepted call to, as CSV (see [`crate::trace`]) | none |
//! | `COREHOP_TEST_SERVICE_STALL_NS` | **tests only**: each service thread sleeps this long before claiming a batch, to exercise the stall fallback | 0 |
//!
//! A bad value is reported once on stderr and turns offload off; the program still runs.

use core::fmt;
use std::ffi::CString;

use corehop_sys::wire::env;

use crate::lane::MAX_LANES;

pub const DEFAULT_SPIN_NS: u64 = 20_000;
pub const DEFAULT_STALL_TIMEOUT_NS: u64 = 10_000_000;

/// The parsed environment.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Kernel CPU numbers of the service threads (1..=MAX_LANES of them).
    pub service_cpus: Vec<usize>,
    /// The policy spec, as given.
    pub policy: String,
    pub spin_ns: u64,
    pub stall_timeout_ns: u64,
    /// Where each process appends its summary line (`-`: standard error).
    pub stats_file: Option<CString>,
    /// Where each process appends its calls' run lengths (`corehop run --record-trace`).
    pub trace_file: Option<CString>,
    /// What the run's processes hand on to each other (see [`crate::learned`]).
    pub learned_file: Option<CString>,
    pub test_stall_ns: u64,
}

impl Config {
    /// Whether a process writes anything as it ends: a summary, a trace, or what its
    /// predictor learned.
    pub fn writes_at_exit(&self) -> bool {
        self.stats_file.is_some() || self.trace_file.is_some() || self.learned_file.is_some()
    }
}

/// A variable with a value the library cannot use.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={:?}: {}", self.var, self.value, self.reason)
    }
}

/// Parses the variables that `get` returns (raw bytes; `None` when unset). `default_cpu` gives
/// the service CPU when none is given (asked only then: it costs a system call, and `corehop
/// run` always names the CPUs).
pub fn parse(
    get: impl Fn(&'static str) -> Option<Vec<u8>>,
    default_cpu: impl FnOnce() -> usize,
) -> Result<Config, ConfigError> {
    let text = |var: &'static str| -> Result<Option<String>, ConfigError> {
        match get(var) {
            None => Ok(None),
            Some(bytes) => String::from_utf8(bytes).map(Some).map_err(|e| ConfigError {
                var,
                value: String::from_utf8_lossy(e.as_bytes()).into_owned(),
                reason: "not UTF-8".into(),
            }),
        }
    };
    let number = |var: &'static str, default: u64| -> Result<u64, ConfigError> {
        match text(var)? {
            None => Ok(default),
            Some(v) => v.trim().parse().map_err(|_| ConfigError {
                var,
                value: v.clone(),
                reason: "expected a whole number of nanoseconds".into(),
            }),
        }
    };
    // A file path, NUL-terminated for the raw openat at exit.
    let path = |var: &'static str| -> Result<Option<CString>, ConfigError> {
        get(var)
            .filter(|p| !p.is_empty())
            .map(|p| {
                CString::new(p).map_err(|_| ConfigError {
                    var,
                    value: String::new(),
                    reason: "contains a NUL byte".into(),
                })
            })
            .transpose()
    };
    let service_cpus = match text(env::SERVICE_CPUS)? {
        None => vec![default_cpu()],
        Some(v) => parse_cpu_list(&v).map_err(|reason| ConfigError {
            var: env::SERVICE_CPUS,
            value: v.clone(),
            reason,
        })?,
    };
    if service_cpus.len() > MAX_LANES {
        return Err(ConfigError {
            var: env::SERVICE_CPUS,
            value: format!("{service_cpus:?}"),
            reason: format!("at most {MAX_LANES} service CPUs"),
        });
    }
    let stats_file = path(env::STATS_FILE)?;
    let trace_file = path(env::TRACE_FILE)?;
    let learned_file = path(env::LEARNED)?;
    Ok(Config {
        service_cpus,
        policy: text(env::POLICY)?.unwrap_or_else(|| "adaptive".into()),
        spin_ns: number(env::SPIN_NS, DEFAULT_SPIN_NS)?,
        stall_timeout_ns: number(env::STALL_TIMEOUT_NS, DEFAULT_STALL_TIMEOUT_NS)?,
        stats_file,
        trace_file,
        learned_file,
        test_stall_ns: number(env::TEST_SERVICE_STALL_NS, 0)?,
    })
}

/// Parses `1`, `0,2`, `2-3,6`: distinct CPU numbers, in the order given.
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let lo: usize = lo.parse().map_err(|_| format!("{part:?} is not a CPU number or range"))?;
        let hi: usize = hi.parse().map_err(|_| format!("{part:?} is not a CPU number or range"))?;
        if lo > hi {
            return Err(format!("range {part:?} runs backwards"));
        }
        if hi >= libc::CPU_SETSIZE as usize {
            return Err(format!("CPU {hi} is beyond the largest CPU number ({})", libc::CPU_SETSIZE - 1));
        }
        for cpu in lo..=hi {
            if cpus.contains(&cpu) {
                return Err(format!("CPU {cpu} is listed twice"));
            }
            cpus.push(cpu);
        }
    }
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&'static str, &str)]) -> impl Fn(&'static str) -> Option<Vec<u8>> {
        let map: HashMap<&'static str, Vec<u8>> =
            pairs.iter().map(|(k, v)| (*k, v.as_bytes().to_vec())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn defaults_when_nothing_is_set() {
        let c = parse(env(&[]), || 3).unwrap();
        assert_eq!(c.service_cpus, vec![3]);
        assert_eq!(c.policy, "adaptive");
        assert_eq!(c.spin_ns, DEFAULT_SPIN_NS);
        assert_eq!(c.stall_timeout_ns, DEFAULT_STALL_TIMEOUT_NS);
        assert_eq!(c.stats_file, None);
        assert_eq!(c.test_stall_ns, 0);
    }

    #[test]
    fn reads_every_variable() {
        let c = parse(
            env(&[
                ("COREHOP_SERVICE_CPUS", "1,4-5"),
                ("COREHOP_POLICY", "always"),
                ("COREHOP_SPIN_NS", "7"),
                ("COREHOP_STALL_TIMEOUT_NS", "8"),
                ("COREHOP_STATS_FILE", "/tmp/s"),
                ("COREHOP_TEST_SERVICE_STALL_NS", "9"),
            ]),
            || unreachable!("the CPUs are named"),
        )
        .unwrap();
        assert_eq!(c.service_cpus, vec![1, 4, 5]);
        assert_eq!(c.policy, "always");
        assert_eq!((c.spin_ns, c.stall_timeout_ns, c.test_stall_ns), (7, 8, 9));
        assert_eq!(c.stats_file.as_deref(), Some(c"/tmp/s"));
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (var, value) in [
            ("COREHOP_SERVICE_CPUS", "x"),
            ("COREHOP_SERVICE_CPUS", "3-1"),
            ("COREHOP_SERVICE_CPUS", "1,1"),
            ("COREHOP_SERVICE_CPUS", "0-8"),
            ("COREHOP_SERVICE_CPUS", "99999"),
            ("COREHOP_SPIN_NS", "-1"),
            ("COREHOP_STALL_TIMEOUT_NS", "soon"),
        ] {
            let err = parse(env(&[(var, value)]), || 0).unwrap_err();
            assert_eq!(err.var, var, "{value}");
            assert!(err.to_string().contains(var));
        }
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0").unwrap(), vec![0]);
        assert_eq!(parse_cpu_list(" 2 - 3 , 0").unwrap(), vec![2, 3, 0]);
        assert!(parse_cpu_list("").is_err());
        assert!(parse_cpu_list("1,").is_err());
    }
}
