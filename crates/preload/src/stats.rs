//! Counters of what happened to each intercepted call, and the one-line summary written at
//! exit.
//!
//! The summary is one line per process, appended with a single raw `write` to the file named
//! by `COREHOP_STATS_FILE` (`O_APPEND`, so the lines of a process tree do not interleave), or
//! to stderr when that is `-` (for use without `corehop run`). Its format, shared with
//! `corehop run`, is `corehop_sys::wire`.

use core::ffi::CStr;
use core::sync::atomic::Ordering::Relaxed;
use core::sync::atomic::{AtomicBool, AtomicU64};

use corehop_policy::offload::{CallKind, NAMED_KINDS};
use corehop_sys::wire;

use crate::sys;

/// Counters of one kind of call.
pub struct Counters {
    pub seen: AtomicU64,
    pub offloaded: AtomicU64,
    pub local: AtomicU64,
    pub kept: AtomicU64,
    pub withdrawn: AtomicU64,
    pub busy: AtomicU64,
    pub service_ns: AtomicU64,
    pub wait_ns: AtomicU64,
    pub local_ns: AtomicU64,
    pub local_timed: AtomicU64,
}

impl Counters {
    const fn new() -> Counters {
        Counters {
            seen: AtomicU64::new(0),
            offloaded: AtomicU64::new(0),
            local: AtomicU64::new(0),
            kept: AtomicU64::new(0),
            withdrawn: AtomicU64::new(0),
            busy: AtomicU64::new(0),
            service_ns: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
            local_ns: AtomicU64::new(0),
            local_timed: AtomicU64::new(0),
        }
    }

    /// The counters in `wire::COUNTERS` order.
    fn all(&self) -> [&AtomicU64; wire::COUNTERS.len()] {
        [
            &self.seen,
            &self.offloaded,
            &self.local,
            &self.kept,
            &self.withdrawn,
            &self.busy,
            &self.service_ns,
            &self.wait_ns,
            &self.local_ns,
            &self.local_timed,
        ]
    }
}

/// One set per named kind, in `NAMED_KINDS` order, and a last one for any other call.
static COUNTERS: [Counters; NAMED_KINDS.len() + 1] = [const { Counters::new() }; NAMED_KINDS.len() + 1];

/// Hand-off times of offloaded calls, per kind as `COUNTERS`, in `wire::HIST_BUCKETS` buckets.
static HANDOFF: [[AtomicU64; wire::HIST_BUCKETS]; NAMED_KINDS.len() + 1] =
    [const { [const { AtomicU64::new(0) }; wire::HIST_BUCKETS] }; NAMED_KINDS.len() + 1];

/// Whether anyone reads the counters (a summary was asked for): each count is a locked add on
/// a line all the program's threads share, which nobody needs otherwise.
static COUNTING: AtomicBool = AtomicBool::new(false);

/// Time callers spent spinning for their answers (the caller side's polling cost), in ns.
pub static SPUN_NS: AtomicU64 = AtomicU64::new(0);

fn slot(kind: CallKind) -> usize {
    kind.index().unwrap_or(NAMED_KINDS.len())
}

/// The counters of `kind`.
pub fn of(kind: CallKind) -> &'static Counters {
    &COUNTERS[slot(kind)]
}

/// Counts from now on (at start-up, when a summary will be written).
pub fn enable() {
    COUNTING.store(true, Relaxed);
}

/// An offloaded call of `kind` kept its caller waiting `ns` beyond its own run.
pub fn record_handoff(kind: CallKind, ns: u64) {
    if COUNTING.load(Relaxed) {
        HANDOFF[slot(kind)][wire::bucket_of(ns)].fetch_add(1, Relaxed);
    }
}

/// Adds one to a counter.
pub fn bump(counter: &AtomicU64) {
    add(counter, 1);
}

/// Adds `n` to a counter.
pub fn add(counter: &AtomicU64, n: u64) {
    if COUNTING.load(Relaxed) {
        counter.fetch_add(n, Relaxed);
    }
}

/// Zeroes everything (in a child after fork: its summary covers only its own calls).
///
/// Nothing is touched where nothing is counted, and only counters that are not zero are
/// written: after a fork every page is shared with the parent until written (a write copies
/// it), and a page never touched faults even to be read (about 40 KB of counters: ten page
/// faults in every child of a shell).
pub fn reset() {
    if !COUNTING.load(Relaxed) {
        return;
    }
    let counters = COUNTERS.iter().flat_map(|c| c.all());
    for counter in counters.chain(HANDOFF.iter().flatten()).chain([&SPUN_NS]) {
        zero(counter);
    }
}

/// Stores 0 in `counter` unless it holds 0 already (see [`reset`]).
pub fn zero(counter: &AtomicU64) {
    if counter.load(Relaxed) != 0 {
        counter.store(0, Relaxed);
    }
}

/// This process's summary line: the counters of every kind of call it made.
fn format_summary(out: &mut impl core::fmt::Write, process: &wire::Process<'_>) -> core::fmt::Result {
    let names = NAMED_KINDS.iter().map(|k| k.name().unwrap_or("other")).chain(["other"]);
    let calls = names.zip(COUNTERS.iter().zip(&HANDOFF)).filter(|(_, (c, _))| c.seen.load(Relaxed) > 0).map(
        |(name, (c, hist))| {
            (name, c.all().map(|counter| counter.load(Relaxed)), hist.each_ref().map(|b| b.load(Relaxed)))
        },
    );
    wire::write_line(out, process, calls)
}

/// The longest summary line: every kind of call with every counter and every histogram
/// bucket at their widest (20 digits).
const MAX_LINE: usize =
    512 + (NAMED_KINDS.len() + 1) * (2 * 24 + wire::COUNTERS.len() * 21 + wire::HIST_BUCKETS * (4 + 21));

/// A text buffer over memory mapped for the summary line (its histograms make it too long
/// for a stack buffer on any thread that may call `exit`; the allocator is not used at exit).
struct Mapped {
    base: *mut u8,
    len: usize,
}

impl Mapped {
    fn new() -> Option<Mapped> {
        sys::map_anonymous(MAX_LINE, 0).map(|base| Mapped { base, len: 0 })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `base` maps MAX_LINE bytes, owned by this value, of which `len` are written.
        unsafe { core::slice::from_raw_parts(self.base, self.len) }
    }
}

impl core::fmt::Write for Mapped {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let end = self.len + s.len();
        if end > MAX_LINE {
            return Err(core::fmt::Error);
        }
        // SAFETY: `base` maps MAX_LINE bytes owned by this value; `end` is within them.
        unsafe { core::ptr::copy_nonoverlapping(s.as_ptr(), self.base.add(self.len), s.len()) };
        self.len = end;
        Ok(())
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `new`, which nothing borrows any more.
        unsafe { sys::unmap(self.base, MAX_LINE) };
    }
}

/// Appends this process's summary line to `path` (a NUL-terminated C string; `-` is stderr),
/// if it made any intercepted call. Nothing is written if the line could not be made whole.
pub fn write_summary(path: &CStr, process: &wire::Process<'_>) {
    if COUNTERS.iter().all(|c| c.seen.load(Relaxed) == 0) {
        return;
    }
    let Some(mut line) = Mapped::new() else { return };
    if format_summary(&mut line, process).is_err() {
        return;
    }
    if path.to_bytes() == b"-" {
        sys::write_all(2, line.bytes());
    } else {
        sys::append_to(path, |fd| sys::write_all(fd, line.bytes()));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_summary_line_is_what_corehop_run_parses() {
        enable();
        bump(&of(CallKind::Statx).seen);
        add(&of(CallKind::Statx).wait_ns, 9);
        record_handoff(CallKind::Statx, 700);
        bump(&of(CallKind::Other(7)).seen);
        let mut line = String::new();
        let standing =
            wire::Standing { settled: "never", rounds: 2, switches: 0, taken_back: 0, regret_ppm: 10 };
        let process = wire::Process {
            pid: 1,
            lanes: 1,
            pinned: true,
            polled_ns: 0,
            spun_ns: 0,
            checked_ns: 0,
            inherited: false,
            sanitized: false,
            standing: Some(standing),
        };
        format_summary(&mut line, &process).unwrap();
        let summary = wire::Summary::parse(&line).unwrap();
        assert_eq!(summary.processes, 1);
        assert_eq!(summary.calls["statx"].seen, 1);
        assert_eq!(summary.calls["statx"].wait_ns, 9);
        assert_eq!(summary.calls["other"].seen, 1);
        assert_eq!(summary.settled["never"].processes, 1);
        assert_eq!(wire::percentile(&summary.handoff["statx"], 0.5), Some(704));
        // [640, 704)
    }

    /// The widest line possible (every kind, every counter and bucket at 20 digits) fits the
    /// mapped buffer, and parses back.
    #[test]
    fn the_longest_summary_line_fits_its_buffer() {
        let mut line = Mapped::new().unwrap();
        let process = wire::Process {
            pid: i32::MAX,
            lanes: 8,
            pinned: true,
            polled_ns: u64::MAX,
            spun_ns: u64::MAX,
            checked_ns: u64::MAX,
            inherited: true,
            sanitized: false,
            standing: None,
        };
        let names = NAMED_KINDS.iter().map(|k| k.name().unwrap_or("other")).chain(["other"]);
        let calls =
            names.map(|name| (name, [u64::MAX; wire::COUNTERS.len()], [u64::MAX; wire::HIST_BUCKETS]));
        wire::write_line(&mut line, &process, calls).unwrap();
        assert!(line.bytes().ends_with(b"\n"));
        let text = core::str::from_utf8(line.bytes()).unwrap();
        assert_eq!(wire::Summary::parse(text).unwrap().processes, 1);
    }
}
