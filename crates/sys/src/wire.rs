//! The preload library's protocol with `corehop run`: its settings, which `corehop run` passes
//! as environment variables, and the one-line summary each process appends at exit, which
//! `corehop run --stats` reads back. Both sides use this module, so neither spells a name of
//! its own.
//!
//! ```text
//! corehop-preload-v2 pid=1234 lanes=1 pinned=1 polled_ns=N spun_ns=N checked_ns=N [inherited=1] [sanitized=1] [settled=ARM rounds=R switches=S taken_back=T regret_ppm=P] read=SEEN:OFF:LOCAL:KEPT:WITHDRAWN:BUSY:SVC_NS:WAIT_NS:LOCAL_NS:LOCAL_TIMED hist.read=BUCKET:N,BUCKET:N write=...
//! ```
//!
//! `polled_ns` is the time the service threads spent polling for work, `spun_ns` the time
//! callers spent spinning for their answers (the CPU polling cost on each side), `checked_ns`
//! the time the service threads spent on their safety checks before and after the calls they
//! ran (part of what callers wait beyond a call's own run). `inherited=1`: the process's
//! run-length predictor started from what the run's processes before it learned.
//! `sanitized=1`: a call was about to move when a sanitizer's runtime was found in the process
//! ([`SANITIZER_INITS`]), so no service thread started and every call stayed with its caller
//! (counted as `KEPT`), where the sanitizer checks it.
//! A `hist.CALL=…` field follows each call whose calls went across: the hand-off times (the
//! caller's wait beyond the call's own run) as a log-linear histogram ([`bucket_of`]: 8
//! buckets per power of two, so a percentile is known to within 1/8), written as
//! `bucket:count` pairs of its non-empty buckets.
//!
//! The bracketed part is there when the policy is adaptive: the arm it settled on, its
//! sampling rounds, how many changed the arm, and the share of time its trials lost.
//!
//! The counters, in [`COUNTERS`] order, for each kind of call the process made:
//! - `OFF`: ran on a service thread; `LOCAL`: the policy kept it on the caller;
//! - `KEPT`: had to stay on the caller (could block, or names the calling thread);
//! - `WITHDRAWN`: the service thread did not claim it in time, so the caller ran it;
//! - `BUSY`: no slot free, or the library was busy (a nested call, a signal handler, a vfork
//!   child, start-up), so the caller ran it;
//! - `SVC_NS`: time the offloaded calls ran on the service CPUs; `WAIT_NS`: time their callers
//!   waited for them (the difference is the hand-off cost); `LOCAL_NS` over `LOCAL_TIMED`:
//!   time of the calls run on the caller that were timed.

use std::collections::BTreeMap;
use std::fmt;

/// The environment variables the preload library reads.
pub mod env {
    /// Kernel CPU numbers for the service threads (`1`, `2,3`, `2-3`).
    pub const SERVICE_CPUS: &str = "COREHOP_SERVICE_CPUS";
    /// Which calls go across: `never`, `always`, `size[:BYTES]`, ….
    pub const POLICY: &str = "COREHOP_POLICY";
    /// The longest a caller spins for its reply, and an idle service thread's first polling
    /// budget, in ns.
    pub const SPIN_NS: &str = "COREHOP_SPIN_NS";
    /// How long a caller waits for its request to be claimed before running it itself, in ns.
    pub const STALL_TIMEOUT_NS: &str = "COREHOP_STALL_TIMEOUT_NS";
    /// The file each process appends its summary line to (`-` is stderr).
    pub const STATS_FILE: &str = "COREHOP_STATS_FILE";
    /// The file each process appends its recorded calls to (`corehop run --record-trace`).
    pub const TRACE_FILE: &str = "COREHOP_TRACE_FILE";
    /// A file the processes of one run hand on what their run-length predictors learned
    /// through (`corehop run` makes one when it waits for the program).
    pub const LEARNED: &str = "COREHOP_LEARNED";
    /// Tests only: each service thread sleeps this long before claiming a batch.
    pub const TEST_SERVICE_STALL_NS: &str = "COREHOP_TEST_SERVICE_STALL_NS";
    /// Where `corehop run` finds the preload library, if not next to its own binary.
    pub const PRELOAD: &str = "COREHOP_PRELOAD";
    /// Read by the start-up stub (`crates/preload-stub`): the library it loads after the
    /// first epoch (the stub spells the name out; it links nothing).
    pub const LIBRARY: &str = "COREHOP_LIBRARY";
    /// Read by the start-up stub: the file of how each program's processes ended
    /// (`lifetimes`), in corehop's cache directory.
    pub const LIFETIMES: &str = "COREHOP_LIFETIMES";
}

/// The policy `corehop run --offload` asks for by default (`COREHOP_POLICY`): the one under
/// which it preloads the start-up stub, and which the library builds only after its first epoch.
pub const DEFAULT_POLICY: &str = "adaptive";

/// The first word of every summary line; a new format gets a new tag.
pub const SUMMARY_TAG: &str = "corehop-preload-v2";

pub use crate::next_symbol::SANITIZER_INITS;
/// The tags of older formats, refused with a word on what to do.
const OLD_TAGS: [&str; 1] = ["corehop-preload-v1"];

/// The per-call counters of a summary line, in the order they are written.
pub const COUNTERS: [&str; 10] = [
    "seen",
    "offloaded",
    "local",
    "kept",
    "withdrawn",
    "busy",
    "service_ns",
    "wait_ns",
    "local_ns",
    "local_timed",
];

/// Buckets per power of two of a hand-off histogram, as a power of two.
const SUB_BITS: u32 = 3;
/// Buckets per power of two.
const SUB: usize = 1 << SUB_BITS;

/// Buckets of a hand-off histogram: below 8 ns one per ns, then 8 equal buckets per
/// power of two (log-linear, as HdrHistogram), the last also holding everything from
/// 2^34 ns (about 17 s) up.
pub const HIST_BUCKETS: usize = 256;

/// The histogram bucket of a time in ns.
pub fn bucket_of(ns: u64) -> usize {
    if ns < SUB as u64 {
        return ns as usize;
    }
    let log2 = 63 - ns.leading_zeros();
    let octave = (log2 - SUB_BITS + 1) as usize;
    let sub = ((ns >> (log2 - SUB_BITS)) as usize) & (SUB - 1);
    (octave * SUB + sub).min(HIST_BUCKETS - 1)
}

/// The times a bucket holds: `[low, high)` in ns.
pub fn bucket_range(bucket: usize) -> (u64, u64) {
    let bucket = bucket.min(HIST_BUCKETS - 1);
    if bucket < SUB {
        return (bucket as u64, bucket as u64 + 1);
    }
    let (octave, sub) = (bucket / SUB, bucket % SUB);
    let low = ((SUB + sub) as u64) << (octave - 1);
    (low, low + (1u64 << (octave - 1)))
}

/// The time a bucket stands for in a percentile: its upper bound, so a percentile is never
/// reported below what it was (and at most 1/8 above).
pub fn bucket_ns(bucket: usize) -> u64 {
    bucket_range(bucket).1
}

/// The `q`-quantile (0.0..=1.0) of a histogram, as its bucket's [`bucket_ns`]; `None` if empty.
pub fn percentile(hist: &[u64; HIST_BUCKETS], q: f64) -> Option<u64> {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((total as f64 * q.clamp(0.0, 1.0)).ceil() as u64).max(1);
    let mut seen = 0;
    hist.iter()
        .position(|&n| {
            seen += n;
            seen >= rank
        })
        .map(bucket_ns)
}

/// Where an adaptive offload policy stood at exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing<'a> {
    /// The arm it settled on (`never`, `always`, `size`, `predicted`, …).
    pub settled: &'a str,
    /// Sampling rounds completed.
    pub rounds: u32,
    /// Rounds that changed the arm.
    pub switches: u32,
    /// Of those, the switches taken back after the new arm lost its first run.
    pub taken_back: u32,
    /// The share of time its trials lost, in parts per million.
    pub regret_ppm: u64,
}

/// What a summary line says about its process as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Process<'a> {
    /// The process id.
    pub pid: i32,
    /// Its service threads.
    pub lanes: usize,
    /// Whether they could be pinned to their CPUs.
    pub pinned: bool,
    /// The time they spent polling for work, in ns.
    pub polled_ns: u64,
    /// The time callers spent spinning for answers, in ns.
    pub spun_ns: u64,
    /// The time the service threads spent on safety checks around the calls, in ns.
    pub checked_ns: u64,
    /// Whether its run-length predictor started from what the run's processes before it
    /// learned (`COREHOP_LEARNED`).
    pub inherited: bool,
    /// Whether a sanitizer's runtime was in it ([`SANITIZER_INITS`]): every call stayed.
    pub sanitized: bool,
    /// Where an adaptive policy stood.
    pub standing: Option<Standing<'a>>,
}

/// Writes one summary line (with its newline) for `process` and the counters and hand-off
/// histogram of each kind of call it made. Formats without allocating, so the preload
/// library can call it at exit.
pub fn write_line<'a, W: fmt::Write>(
    out: &mut W,
    process: &Process<'_>,
    calls: impl IntoIterator<Item = (&'a str, [u64; COUNTERS.len()], [u64; HIST_BUCKETS])>,
) -> fmt::Result {
    let Process { pid, lanes, pinned, polled_ns, spun_ns, checked_ns, inherited, sanitized, standing } =
        *process;
    write!(
        out,
        "{SUMMARY_TAG} pid={pid} lanes={lanes} pinned={} polled_ns={polled_ns} spun_ns={spun_ns} checked_ns={checked_ns}",
        u8::from(pinned)
    )?;
    if inherited {
        out.write_str(" inherited=1")?;
    }
    if sanitized {
        out.write_str(" sanitized=1")?;
    }
    if let Some(s) = standing {
        write!(
            out,
            " settled={} rounds={} switches={} taken_back={} regret_ppm={}",
            s.settled, s.rounds, s.switches, s.taken_back, s.regret_ppm
        )?;
    }
    for (name, counters, hist) in calls {
        write!(out, " {name}=")?;
        for (i, value) in counters.iter().enumerate() {
            write!(out, "{}{value}", if i == 0 { "" } else { ":" })?;
        }
        let mut first = true;
        for (bucket, count) in hist.iter().enumerate().filter(|(_, &n)| n > 0) {
            if first {
                write!(out, " hist.{name}=")?;
            }
            write!(out, "{}{bucket}:{count}", if first { "" } else { "," })?;
            first = false;
        }
    }
    out.write_str("\n")
}

/// The counters of one kind of call, added up over processes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[allow(missing_docs)] // each field is the counter of the same name in the module docs
pub struct CallCounts {
    pub seen: u64,
    pub offloaded: u64,
    pub local: u64,
    pub kept: u64,
    pub withdrawn: u64,
    pub busy: u64,
    pub service_ns: u64,
    pub wait_ns: u64,
    pub local_ns: u64,
    pub local_timed: u64,
}

impl CallCounts {
    /// The counters in [`COUNTERS`] order.
    pub fn fields(&self) -> [u64; COUNTERS.len()] {
        self.clone().fields_mut().map(|field| *field)
    }

    /// The counters in [`COUNTERS`] order, to change.
    fn fields_mut(&mut self) -> [&mut u64; COUNTERS.len()] {
        [
            &mut self.seen,
            &mut self.offloaded,
            &mut self.local,
            &mut self.kept,
            &mut self.withdrawn,
            &mut self.busy,
            &mut self.service_ns,
            &mut self.wait_ns,
            &mut self.local_ns,
            &mut self.local_timed,
        ]
    }

    /// Adds `fields` (in [`COUNTERS`] order) to these counters.
    pub fn add_fields(&mut self, fields: [u64; COUNTERS.len()]) {
        self.fields_mut().into_iter().zip(fields).for_each(|(sum, n)| *sum += n);
    }

    /// Adds `other` to these counters.
    pub fn add(&mut self, other: &CallCounts) {
        self.add_fields(other.fields());
    }
}

/// The processes whose adaptive policy settled on one arm.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Settled {
    /// How many processes.
    pub processes: usize,
    /// Their sampling rounds, added up.
    pub rounds: u64,
    /// Their rounds that changed the arm, added up.
    pub switches: u64,
    /// Of those, the switches taken back after the new arm lost its first run.
    pub taken_back: u64,
    /// The largest share of time one of them lost to trials, in parts per million.
    pub max_regret_ppm: u64,
}

/// Every process's summary line of a run, added up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Summary {
    /// Processes that made intercepted calls.
    pub processes: usize,
    /// Processes whose service threads could not be pinned to their CPU.
    pub unpinned: usize,
    /// Time the service threads spent polling for work, in ns, over every process.
    pub polled_ns: u64,
    /// Time callers spent spinning for answers, in ns, over every process.
    pub spun_ns: u64,
    /// Time the service threads spent on safety checks around the calls, in ns, over every
    /// process.
    pub checked_ns: u64,
    /// Processes whose run-length predictor started from what the run's processes before them
    /// learned.
    pub inherited: usize,
    /// Processes with a sanitizer's runtime, whose calls all stayed with their callers.
    pub sanitized: usize,
    /// Adaptive policies: settled arm → the processes that settled there.
    pub settled: BTreeMap<String, Settled>,
    /// Call name → counters.
    pub calls: BTreeMap<String, CallCounts>,
    /// Call name → hand-off histogram ([`HIST_BUCKETS`] buckets, see [`bucket_of`]).
    #[cfg_attr(feature = "serde", serde(serialize_with = "sparse"))]
    pub handoff: BTreeMap<String, [u64; HIST_BUCKETS]>,
}

/// The hand-off histograms in JSON: call name → `[low_ns, high_ns, count]` of each non-empty
/// bucket (serde has no arrays this long, and the empty buckets say nothing).
#[cfg(feature = "serde")]
fn sparse<S: serde::Serializer>(
    handoff: &BTreeMap<String, [u64; HIST_BUCKETS]>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = serializer.serialize_map(Some(handoff.len()))?;
    for (name, hist) in handoff {
        let buckets: Vec<[u64; 3]> = hist
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(b, &n)| {
                let (low, high) = bucket_range(b);
                [low, high, n]
            })
            .collect();
        map.serialize_entry(name, &buckets)?;
    }
    map.end()
}

/// A summary line that is not in the format above.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {why}: {text:?}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub why: String,
    /// The line.
    pub text: String,
}

impl Summary {
    /// Parses the lines the preload library appends; blank lines are skipped.
    pub fn parse(text: &str) -> Result<Summary, ParseError> {
        let mut summary = Summary::default();
        for (number, line) in text.lines().enumerate() {
            summary.add_line(number + 1, line)?;
        }
        Ok(summary)
    }

    /// Adds one line the preload library appended (`number`, from 1, names it in errors): a
    /// file of them is read a line at a time, however many processes wrote it. A blank line
    /// adds nothing.
    pub fn add_line(&mut self, number: usize, line: &str) -> Result<(), ParseError> {
        if line.trim().is_empty() {
            return Ok(());
        }
        let bad = |why: String| ParseError { line: number, why, text: line.to_string() };
        let mut fields = line.split_whitespace();
        match fields.next() {
            Some(SUMMARY_TAG) => {}
            Some(old) if OLD_TAGS.contains(&old) => {
                return Err(bad(format!(
                    "written by an older preload library ({old}, expected {SUMMARY_TAG}): rebuild it \
                     with corehop (`cargo build --workspace`) or point COREHOP_PRELOAD at the new one"
                )))
            }
            _ => return Err(bad(format!("not a {SUMMARY_TAG} summary"))),
        }
        self.processes += 1;
        let mut settled: Option<&str> = None;
        for field in fields {
            let (key, value) =
                field.split_once('=').ok_or_else(|| bad(format!("field {field:?} has no '='")))?;
            let number = || value.parse::<u64>().map_err(|_| bad(format!("{key} is not a number")));
            match key {
                "pid" | "lanes" => {}
                "pinned" => self.unpinned += usize::from(value == "0"),
                "polled_ns" => self.polled_ns += number()?,
                "spun_ns" => self.spun_ns += number()?,
                "checked_ns" => self.checked_ns += number()?,
                "inherited" => self.inherited += usize::from(value == "1"),
                "sanitized" => self.sanitized += usize::from(value == "1"),
                "settled" => {
                    self.settled.entry(value.to_string()).or_default().processes += 1;
                    settled = Some(value);
                }
                hist if hist.starts_with("hist.") => {
                    let mut buckets = [0u64; HIST_BUCKETS];
                    for pair in value.split(',') {
                        let parsed = pair
                            .split_once(':')
                            .and_then(|(b, n)| Some((b.parse::<usize>().ok()?, n.parse::<u64>().ok()?)));
                        match parsed {
                            Some((bucket, count)) if bucket < HIST_BUCKETS => buckets[bucket] += count,
                            _ => {
                                return Err(bad(format!(
                                    "{hist}: {pair:?} is not BUCKET:COUNT with BUCKET below {HIST_BUCKETS}"
                                )))
                            }
                        }
                    }
                    let sum =
                        self.handoff.entry(hist["hist.".len()..].to_string()).or_insert([0; HIST_BUCKETS]);
                    sum.iter_mut().zip(buckets).for_each(|(a, b)| *a = a.saturating_add(b));
                }
                "rounds" | "switches" | "taken_back" | "regret_ppm" => {
                    let n = number()?;
                    let arm = settled.ok_or_else(|| bad(format!("{key} before settled")))?;
                    let entry = self.settled.entry(arm.to_string()).or_default();
                    match key {
                        "rounds" => entry.rounds += n,
                        "switches" => entry.switches += n,
                        "taken_back" => entry.taken_back += n,
                        _ => entry.max_regret_ppm = entry.max_regret_ppm.max(n),
                    }
                }
                call => {
                    let numbers: Vec<u64> = value
                        .split(':')
                        .map(str::parse)
                        .collect::<Result<_, _>>()
                        .map_err(|_| bad(format!("counters of {call} are not numbers")))?;
                    let fields: [u64; COUNTERS.len()] = numbers.as_slice().try_into().map_err(|_| {
                        bad(format!("{call} has {} counters, expected {}", numbers.len(), COUNTERS.len()))
                    })?;
                    self.calls.entry(call.to_string()).or_default().add_fields(fields);
                }
            }
        }
        Ok(())
    }

    /// Everything added up.
    pub fn total(&self) -> CallCounts {
        let mut total = CallCounts::default();
        for counts in self.calls.values() {
            total.add(counts);
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_line_parses_back_to_its_counters() {
        let mut line = String::new();
        let read = [3, 2, 0, 1, 0, 0, 200, 500, 40, 1];
        let fsync = [1, 0, 0, 0, 1, 0, 0, 0, 7, 1];
        let standing = Standing { settled: "never", rounds: 3, switches: 1, taken_back: 1, regret_ppm: 900 };
        let mut hist = [0; HIST_BUCKETS];
        hist[bucket_of(1_000)] = 3;
        hist[bucket_of(50_000)] = 1;
        let none = [0; HIST_BUCKETS];
        let process = Process {
            pid: 7,
            lanes: 1,
            pinned: false,
            polled_ns: 40,
            spun_ns: 9,
            checked_ns: 5,
            inherited: true,
            sanitized: true,
            standing: Some(standing),
        };
        write_line(&mut line, &process, [("read", read, hist), ("fsync", fsync, none)]).unwrap();
        assert!(line.starts_with(
            "corehop-preload-v2 pid=7 lanes=1 pinned=0 polled_ns=40 spun_ns=9 checked_ns=5 inherited=1 sanitized=1 settled=never rounds=3"
        ));
        assert!(
            line.contains(&format!(" hist.read={}:3,{}:1 ", bucket_of(1_000), bucket_of(50_000))),
            "{line}"
        );
        let twice = format!("{line}\n{line}");
        let s = Summary::parse(&twice).unwrap();
        assert_eq!((s.processes, s.unpinned), (2, 2));
        assert_eq!(s.calls["read"].wait_ns, 1000);
        assert_eq!(s.calls["fsync"].local_ns, 14);
        assert_eq!(s.total().seen, 8);
        assert_eq!(s.calls["read"].fields(), read.map(|n| 2 * n));
        assert_eq!((s.polled_ns, s.spun_ns, s.checked_ns, s.inherited, s.sanitized), (80, 18, 10, 2, 2));
        let never = &s.settled["never"];
        assert_eq!(
            (never.processes, never.rounds, never.switches, never.taken_back, never.max_regret_ppm),
            (2, 6, 2, 2, 900)
        );
        let read_hist = &s.handoff["read"];
        assert_eq!(read_hist.iter().sum::<u64>(), 8);
        assert_eq!(percentile(read_hist, 0.5), Some(1024)); // 1000 ns is in [960, 1024)
        assert_eq!(percentile(read_hist, 0.99), Some(53_248)); // 50 000 ns is in [49 152, 53 248)
        assert!(!s.handoff.contains_key("fsync"));
    }

    #[test]
    fn buckets_are_log_linear_with_eight_per_power_of_two() {
        assert_eq!((bucket_of(0), bucket_of(7)), (0, 7));
        assert_eq!((bucket_of(8), bucket_of(15), bucket_of(16)), (8, 15, 16));
        assert_eq!(bucket_range(bucket_of(1_000)), (960, 1024));
        assert_eq!(bucket_of(u64::MAX), HIST_BUCKETS - 1);
        // Every bucket holds exactly its range, the ranges tile the line, and none is wider
        // than 1/8 of its lower bound: a percentile is known to within 12.5 %.
        for b in 0..HIST_BUCKETS - 1 {
            let (low, high) = bucket_range(b);
            assert_eq!((bucket_of(low), bucket_of(high - 1), bucket_of(high)), (b, b, b + 1), "bucket {b}");
            assert!(b < 8 || (high - low) * 8 <= low, "bucket {b} is [{low}, {high})");
            assert_eq!(bucket_ns(b), high);
        }
        assert_eq!(bucket_range(HIST_BUCKETS - 1).0, 15 << 30);
        assert_eq!(percentile(&[0; HIST_BUCKETS], 0.5), None);
    }

    #[test]
    fn malformed_lines_are_errors_that_name_the_line() {
        for text in [
            "something else\n",
            "corehop-preload-v2 pid=1 read=1:2\n",
            "corehop-preload-v2 pid=1 read=a:b:c:d:e:f:g:h:i:j\n",
            "corehop-preload-v2 pid=1 read\n",
            "corehop-preload-v2 pid=1 rounds=3\n",
            "corehop-preload-v2 pid=1 settled=never rounds=x\n",
            "corehop-preload-v2 pid=1 hist.read=1,2\n",
            "corehop-preload-v2 pid=1 hist.read=256:1\n",
            "corehop-preload-v2 pid=1 hist.read=3:x\n",
            "corehop-preload-v2 pid=1 checked_ns=-1\n",
        ] {
            let err = Summary::parse(text).unwrap_err();
            assert_eq!(err.line, 1, "{err}");
        }
        assert_eq!(Summary::parse("").unwrap().processes, 0);
    }

    #[test]
    fn a_line_of_the_older_format_says_to_rebuild_the_library() {
        let err = Summary::parse("corehop-preload-v1 pid=1 read=1:0:0:0:0:0:0:0:0:0\n").unwrap_err();
        assert!(err.why.contains("older preload library") && err.why.contains("rebuild"), "{err}");
    }
}
