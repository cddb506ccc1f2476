//! Counters of what happened to each intercepted call, and the one-line summary written at
//! exit.
//!
//! The summary is one line per process, appended with a single raw `write` to the file named
//! by `COREHOP_STATS_FILE` (`O_APPEND`, so the lines of a process tree do not interleave), or
//! to stderr when that is `-` (for use without `corehop run`):
//!
//! ```text
//! corehop-preload-v1 pid=1234 lanes=1 pinned=1 read=SEEN:OFF:LOCAL:KEPT:WITHDRAWN:BUSY:SVC_NS:WAIT_NS:LOCAL_NS:LOCAL_TIMED write=...
//! ```
//!
//! - `OFF`: ran on a service thread; `LOCAL`: the policy kept it on the caller;
//! - `KEPT`: had to stay on the caller (could block, or names the calling thread);
//! - `WITHDRAWN`: the service thread did not claim it in time, so the caller ran it;
//! - `BUSY`: no slot free, or the library was busy (a nested call, a signal handler, a vfork
//!   child, start-up), so the caller ran it;
//! - `SVC_NS`: time the offloaded calls ran on the service CPUs; `WAIT_NS`: time their callers
//!   waited for them (the difference is the hand-off cost); `LOCAL_NS` over `LOCAL_TIMED`:
//!   time of the calls run on the caller that were timed.

use core::fmt::Write as _;
use core::sync::atomic::AtomicU64;
use core::sync::atomic::Ordering::Relaxed;

use crate::calls::{Kind, KINDS};
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

    fn all(&self) -> [&AtomicU64; 10] {
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

static COUNTERS: [Counters; KINDS.len()] = [const { Counters::new() }; KINDS.len()];

/// The counters of `kind`.
pub fn of(kind: Kind) -> &'static Counters {
    &COUNTERS[kind as usize]
}

/// Adds one to a counter.
pub fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}

/// Adds `n` to a counter.
pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Relaxed);
}

/// Zeroes everything (in a child after fork: its summary covers only its own calls).
pub fn reset() {
    for c in &COUNTERS {
        for counter in c.all() {
            counter.store(0, Relaxed);
        }
    }
}

/// A fixed buffer that formats without allocating.
struct Line {
    buf: [u8; 4096],
    len: usize,
}

impl core::fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let end = self.len + s.len();
        if end > self.buf.len() {
            return Err(core::fmt::Error);
        }
        self.buf[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Appends this process's summary line to `path` (a NUL-terminated C string; `-` is stderr),
/// if it made any intercepted call. `lanes` and `pinned` describe the service threads.
pub fn write_summary(path: &[u8], lanes: usize, pinned: bool) {
    if COUNTERS.iter().all(|c| c.seen.load(Relaxed) == 0) {
        return;
    }
    let mut line = Line { buf: [0; 4096], len: 0 };
    let _ = write!(line, "corehop-preload-v1 pid={} lanes={} pinned={}", sys::getpid(), lanes, pinned as u8);
    for (kind, c) in KINDS.iter().zip(&COUNTERS) {
        if c.seen.load(Relaxed) == 0 {
            continue;
        }
        let _ = write!(line, " {}=", kind.name());
        for (i, counter) in c.all().iter().enumerate() {
            let _ = write!(line, "{}{}", if i == 0 { "" } else { ":" }, counter.load(Relaxed));
        }
    }
    let _ = line.write_str("\n");
    if path == b"-\0" {
        sys::write_all(2, &line.buf[..line.len]);
        return;
    }
    let flags = libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC;
    // SAFETY: `path` is NUL-terminated (checked by the caller); openat reads it only.
    let fd = unsafe {
        sys::raw(libc::SYS_openat, [libc::AT_FDCWD as u64, path.as_ptr() as u64, flags as u64, 0o644, 0, 0])
    };
    if fd < 0 {
        return;
    }
    sys::write_all(fd as i32, &line.buf[..line.len]);
    // SAFETY: closes the descriptor opened just above.
    unsafe { sys::raw(libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0]) };
}
