//! `corehop run --record-trace FILE`: every intercepted call's run length, kept in memory and
//! appended to FILE at exit as the CSV `corehop predict` reads (`call,fd,size,site,run_ns`).
//!
//! The records live in one anonymous mapping made at start-up ([`MAX_RECORDS`] of them, pages
//! touched only as they fill), so recording allocates nothing on the interposed path. Each
//! record is claimed by one `fetch_add` and written as atomics, its first word last: the exit
//! writer skips a record another thread is still filling. A forked child starts an empty
//! trace of its own. Calls past the capacity are counted, not recorded; a process that ends
//! with `_exit`, a signal or `exec` writes nothing.

use core::ffi::CStr;
use core::fmt::Write as _;
use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize};

use corehop_policy::offload::{CallKind, NAMED_KINDS};

use crate::sys;

/// Records per process at most (32 bytes each: a 32 MiB mapping, touched as it fills).
pub const MAX_RECORDS: usize = 1 << 20;

/// One call: word 0 is `(kind index + 1) << 32 | fd as u32` (0 while being written), then
/// size, call site and run length.
type Record = [AtomicU64; 4];

static RECORDS: AtomicPtr<Record> = AtomicPtr::new(core::ptr::null_mut());
static NEXT: AtomicUsize = AtomicUsize::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Maps the record buffer; false if the kernel refused (recording stays off).
pub fn start() -> bool {
    let bytes = MAX_RECORDS * core::mem::size_of::<Record>();
    let Some(addr) = sys::map_anonymous(bytes, libc::MAP_NORESERVE) else { return false };
    RECORDS.store(addr.cast::<Record>(), Release);
    true
}

/// Whether calls are being recorded.
pub fn on() -> bool {
    !RECORDS.load(Relaxed).is_null()
}

fn records() -> &'static [Record] {
    let base = RECORDS.load(Acquire);
    if base.is_null() {
        return &[];
    }
    // SAFETY: `start` mapped MAX_RECORDS records of zeroed, readable and writable memory that
    // is never unmapped; all-zero bytes are valid `AtomicU64`s, and every access is atomic.
    unsafe { core::slice::from_raw_parts(base, MAX_RECORDS) }
}

/// Records one completed call.
pub fn record(kind: CallKind, fd: i32, size: u64, site: u64, run_ns: u64) {
    let records = records();
    if records.is_empty() {
        return;
    }
    let index = NEXT.fetch_add(1, Relaxed);
    let Some(record) = records.get(index) else {
        DROPPED.fetch_add(1, Relaxed);
        return;
    };
    let kind = kind.index().map_or(NAMED_KINDS.len(), |i| i) as u64;
    record[1].store(size, Relaxed);
    record[2].store(site, Relaxed);
    record[3].store(run_ns, Relaxed);
    record[0].store((kind + 1) << 32 | u64::from(fd as u32), Release);
}

/// A forked child records its own calls only (the buffer was copied with the parent's).
pub fn after_fork_child() {
    // Nothing written where nothing was recorded: see `stats::reset`.
    if NEXT.load(Relaxed) == 0 && DROPPED.load(Relaxed) == 0 {
        return;
    }
    let filled = NEXT.swap(0, Relaxed).min(MAX_RECORDS);
    records()[..filled].iter().for_each(|r| r[0].store(0, Relaxed));
    DROPPED.store(0, Relaxed);
}

/// Whole lines, written to a descriptor a buffer at a time, each buffer headed by this
/// process's `# pid` line: processes that exit together append their buffers in turn, and
/// each buffer must say whose calls follow.
struct Chunk {
    fd: i32,
    pid: i32,
    text: sys::Text<{ 1 << 16 }>,
}

impl Chunk {
    fn line(&mut self, args: core::fmt::Arguments<'_>) {
        if self.text.is_empty() {
            let _ = self.text.write_fmt(format_args!("# pid {}\n", self.pid));
        }
        let mark = self.text.len();
        if self.text.write_fmt(args).is_err() {
            self.text.truncate(mark);
            self.flush();
            let _ = self.text.write_fmt(format_args!("# pid {}\n", self.pid));
            let _ = self.text.write_fmt(args);
        }
    }

    /// One `write` of whole lines: O_APPEND keeps another process's chunk from splitting them.
    fn flush(&mut self) {
        sys::write_all(self.fd, self.text.bytes());
        self.text.truncate(0);
    }
}

/// Appends this process's records to `path`: a `# pid` comment, then one CSV line per call,
/// then a comment counting calls past the capacity, if any.
pub fn write(path: &CStr) {
    let filled = NEXT.load(Relaxed).min(MAX_RECORDS);
    if filled == 0 {
        return;
    }
    sys::append_to(path, |fd| {
        let pid = sys::getpid();
        let mut chunk = Chunk { fd, pid, text: sys::Text::new() };
        for record in &records()[..filled] {
            let head = record[0].load(Acquire);
            if head == 0 {
                continue;
            }
            let kind = NAMED_KINDS.get(((head >> 32) - 1) as usize).and_then(|k| k.name()).unwrap_or("other");
            let fd = head as u32 as i32;
            let (size, site, run) =
                (record[1].load(Relaxed), record[2].load(Relaxed), record[3].load(Relaxed));
            chunk.line(format_args!("{kind},{fd},{size},{site},{run}\n"));
        }
        let dropped = DROPPED.load(Relaxed);
        if dropped > 0 {
            chunk.line(format_args!("# pid {pid}: {dropped} more calls not recorded (buffer full)\n"));
        }
        chunk.flush();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_written_as_the_csv_predict_reads() {
        assert!(start());
        record(CallKind::Fstat, 3, 0, 0x55d0_1234, 1_300);
        record(CallKind::Pread, 4, 4096, 7, 2_500);
        let dir = std::env::temp_dir().join(format!("corehop-trace-{}", std::process::id()));
        let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        write(&path);
        let text = std::fs::read_to_string(&dir).unwrap();
        std::fs::remove_file(&dir).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("# pid "), "{text}");
        assert_eq!(lines[1..], ["fstat,3,0,1439699508,1300", "pread64,4,4096,7,2500"], "{text}");
        after_fork_child();
        assert!(records()[0][0].load(Relaxed) == 0);

        // More than one buffer's worth: every piece says whose calls follow.
        for i in 0..5_000 {
            record(CallKind::Read, 3, 4096, 0x55d0_0000_0000 + i, 1_000 + i);
        }
        write(&path);
        let text = std::fs::read_to_string(&dir).unwrap();
        std::fs::remove_file(&dir).unwrap();
        let header = format!("# pid {}", sys::getpid());
        let pieces: Vec<&str> = text.split(&format!("{header}\n")).collect();
        assert_eq!(pieces[0], "", "the text starts with the header");
        assert!(pieces.len() > 2, "{} pieces", pieces.len());
        assert!(pieces[1..]
            .iter()
            .all(|p| !p.is_empty() && p.lines().all(|l| l.starts_with("read,3,4096,"))));
        assert_eq!(text.lines().filter(|l| !l.starts_with('#')).count(), 5_000);
        after_fork_child();
    }
}
