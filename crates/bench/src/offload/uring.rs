//! The peer rows of `corehop bench offload`: what a round trip to the service CPU costs through
//! corehop's service core, next to io_uring, the mechanism a Linux user would reach for, between
//! the same two CPUs and in the same process.
//!
//! Rows, each a round trip from the application CPU (the calling thread waits for the answer):
//!
//! - **offload**: corehop's service core runs an empty closure, an fstat, or a 4 KiB pread.
//! - **sqpoll**: io_uring with `IORING_SETUP_SQPOLL | IORING_SETUP_SQ_AFF`, its kernel thread
//!   pinned to the service CPU; the caller writes the submission entry and spins on the
//!   completion ring (no system call while the kernel thread polls). A NOP, an fstat
//!   (`IORING_OP_STATX` with `AT_EMPTY_PATH`), a 4 KiB read.
//! - **enter**: plain io_uring, one `io_uring_enter` per call (submit and wait); the call runs
//!   inside that system call on the application CPU.
//! - **local**: the same fstat and pread as a plain system call on the application CPU (what
//!   the call itself costs).
//!
//! The rows take turns: every repetition runs one batch of each, so drifts of the machine (the
//! host moving vCPUs) hit them alike. Before a batch the caller sleeps until every poller has
//! gone idle (io_uring's kernel thread after its idle time, the service core after its idle
//! spin), then warms up, so each batch measures its own poller awake and no other polling on the
//! service CPU. A batch's figure is its mean round trip; min/median/max are over repetitions.
//!
//! Where io_uring cannot be set up (ENOSYS, EPERM under seccomp or `io_uring_disabled`, an old
//! kernel without SQPOLL for unprivileged users) its rows are replaced by a skip line that says
//! why; the corehop rows are measured anyway.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use corehop_runtime::service::ServiceCores;
use corehop_runtime::sys;
use io_uring::{opcode, squeue, types, IoUring};
use serde::Serialize;

use crate::report::{self, Align, Stats, Table};

/// Bytes a pread row reads.
pub const READ_BYTES: usize = 4096;
/// How long io_uring's SQPOLL kernel thread polls after its last entry before it sleeps.
const SQ_THREAD_IDLE_MS: u32 = 2;
/// How long the caller sleeps before a batch: every poller is asleep by then.
const SETTLE: Duration = Duration::from_millis(4);

/// The call a row makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    /// Nothing: an empty closure, an io_uring NOP.
    Empty,
    Fstat,
    Pread,
}

impl Call {
    fn name(self) -> &'static str {
        match self {
            Call::Empty => "empty",
            Call::Fstat => "fstat",
            Call::Pread => "pread 4 KiB",
        }
    }
}

/// How a row reaches the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mechanism {
    Offload,
    Sqpoll,
    Enter,
    Local,
}

impl Mechanism {
    fn name(self) -> &'static str {
        match self {
            Mechanism::Offload => "offload",
            Mechanism::Sqpoll => "sqpoll",
            Mechanism::Enter => "enter",
            Mechanism::Local => "local",
        }
    }

    /// Where the call runs.
    fn runs_on(self, call: Call, app_cpu: usize, service_cpu: usize) -> String {
        match (self, call) {
            (Mechanism::Offload, _) => format!("cpu{service_cpu} (service thread)"),
            // The kernel hands statx to an io-wq worker, which may run anywhere.
            (Mechanism::Sqpoll, Call::Fstat) => format!("io-wq worker, via cpu{service_cpu}"),
            (Mechanism::Sqpoll, _) => format!("cpu{service_cpu} (kernel thread)"),
            (Mechanism::Enter, Call::Fstat) => format!("io-wq worker, via cpu{app_cpu}"),
            (Mechanism::Enter | Mechanism::Local, _) => format!("cpu{app_cpu} (caller)"),
        }
    }
}

/// One row: a mechanism and a call, its round trip, and ratios to same-run baselines.
#[derive(Debug, Clone, Serialize)]
pub struct HandoffRow {
    /// offload, sqpoll, enter or local.
    pub mechanism: &'static str,
    /// empty, fstat or "pread 4 KiB".
    pub call: &'static str,
    /// Where the call runs.
    pub runs_on: String,
    /// Mean round trip of a batch, in ns, over repetitions.
    pub round_trip_ns: Stats,
    /// Median over the same run's SQPOLL median for the same call (None without io_uring).
    pub vs_sqpoll: Option<f64>,
}

/// The peer rows, and why some are missing.
#[derive(Debug, Clone, Serialize)]
pub struct Handoffs {
    /// Round trips per batch.
    pub batch: usize,
    /// One row per mechanism and call measured.
    pub rows: Vec<HandoffRow>,
    /// Mechanisms that could not be set up here, with the reason.
    pub skipped: Vec<String>,
}

/// One row being measured: a round trip it can repeat.
struct Probe<'a> {
    mechanism: Mechanism,
    call: Call,
    target: Target<'a>,
    samples: Vec<f64>,
}

enum Target<'a> {
    Cores(&'a ServiceCores),
    Ring(Box<IoUring>),
    Here,
}

/// The buffer a pread fills: lines of its own, none shared with what the caller touches while
/// the service thread writes it.
#[repr(C, align(4096))]
struct Page([u8; READ_BYTES]);

/// The file and buffers the calls use.
struct Io {
    fd: i32,
    buf: Box<Page>,
    stat: libc::stat,
    statx: libc::statx,
}

impl Io {
    fn fstat_here(fd: i32, out: &mut libc::stat) -> i64 {
        // SAFETY: fstat writes one struct stat into `out`, which lives for the call.
        unsafe {
            corehop_runtime::sys::syscall(libc::SYS_fstat, [fd as usize, out as *mut _ as usize, 0, 0, 0, 0])
        }
        .map_or_else(|e| -(e.0 as i64), |n| n as i64)
    }

    fn pread_here(fd: i32, buf: &mut [u8]) -> i64 {
        // SAFETY: pread64 writes at most buf.len() bytes into `buf`, which lives for the call.
        unsafe {
            corehop_runtime::sys::syscall(
                libc::SYS_pread64,
                [fd as usize, buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0],
            )
        }
        .map_or_else(|e| -(e.0 as i64), |n| n as i64)
    }
}

impl Probe<'_> {
    /// One round trip; its result (bytes, 0, or `-errno`).
    fn round(&mut self, io: &mut Io) -> i64 {
        let fd = io.fd;
        match &mut self.target {
            Target::Cores(cores) => match self.call {
                Call::Empty => {
                    cores.run(|| ());
                    0
                }
                Call::Fstat => {
                    let stat = &mut io.stat;
                    cores.run(move || Io::fstat_here(fd, stat))
                }
                Call::Pread => {
                    let buf = &mut io.buf.0[..];
                    cores.run(move || Io::pread_here(fd, buf))
                }
            },
            Target::Here => match self.call {
                Call::Empty => 0,
                Call::Fstat => Io::fstat_here(fd, &mut io.stat),
                Call::Pread => Io::pread_here(fd, &mut io.buf.0),
            },
            Target::Ring(ring) => {
                let entry = match self.call {
                    Call::Empty => opcode::Nop::new().build(),
                    Call::Fstat => opcode::Statx::new(
                        types::Fd(fd),
                        c"".as_ptr(),
                        (&mut io.statx as *mut libc::statx).cast::<types::statx>(),
                    )
                    .flags(libc::AT_EMPTY_PATH)
                    .mask(libc::STATX_BASIC_STATS)
                    .build(),
                    Call::Pread => opcode::Read::new(types::Fd(fd), io.buf.0.as_mut_ptr(), READ_BYTES as u32)
                        .offset(0)
                        .build(),
                };
                ring_round(ring, &entry.user_data(1), self.mechanism == Mechanism::Sqpoll)
            }
        }
    }
}

/// Submits `entry` and waits for its completion: spinning on the completion ring while the
/// SQPOLL thread polls, or in `io_uring_enter` otherwise. Returns the completion's result.
fn ring_round(ring: &mut IoUring, entry: &squeue::Entry, poll: bool) -> i64 {
    // SAFETY: the entry's buffers (the probe's `Io`) outlive the call: this function returns only
    // after the entry's completion has arrived, so the kernel is done with them.
    if unsafe { ring.submission().push(entry) }.is_err() {
        return -(libc::EBUSY as i64);
    }
    // With SQPOLL this enters the kernel only to wake a sleeping kernel thread.
    let submitted = if poll { ring.submit() } else { ring.submit_and_wait(1) };
    if let Err(e) = submitted {
        return -(e.raw_os_error().unwrap_or(libc::EIO) as i64);
    }
    loop {
        if let Some(cqe) = ring.completion().next() {
            return cqe.result() as i64;
        }
        if poll {
            sys::cpu_relax();
        } else if let Err(e) = ring.submit_and_wait(1) {
            return -(e.raw_os_error().unwrap_or(libc::EIO) as i64);
        }
    }
}

/// A ring on this thread, polled by a kernel thread pinned to `service_cpu` if `sqpoll`.
fn ring(sqpoll: Option<usize>) -> std::io::Result<IoUring> {
    let mut builder = IoUring::builder();
    if let Some(cpu) = sqpoll {
        builder.setup_sqpoll(SQ_THREAD_IDLE_MS).setup_sqpoll_cpu(cpu as u32);
    }
    builder.build(8)
}

fn skip_reason(what: &str, err: &std::io::Error) -> String {
    let why = match err.raw_os_error() {
        Some(libc::ENOSYS) => "io_uring is not in this kernel (ENOSYS)".to_string(),
        Some(libc::EPERM) => {
            "io_uring is not permitted here (EPERM: seccomp, or kernel.io_uring_disabled)".to_string()
        }
        _ => err.to_string(),
    };
    format!("{what}: skipped, {why}")
}

/// Measures every row, `reps` batches of `batch` round trips each, alternating. Runs on the
/// calling thread, which must be pinned to `app_cpu`; `dir` holds the file read.
pub fn measure(
    cores: &ServiceCores,
    app_cpu: usize,
    service_cpu: usize,
    reps: usize,
    batch: usize,
    dir: &Path,
) -> anyhow::Result<Handoffs> {
    let path = dir.join("pread-4k");
    std::fs::write(&path, vec![7u8; READ_BYTES])?;
    let file = std::fs::File::open(&path)?;
    let mut io = Io {
        fd: file.as_raw_fd(),
        buf: Box::new(Page([0; READ_BYTES])),
        // SAFETY: struct stat and struct statx are plain old data; all zeroes is valid.
        stat: unsafe { std::mem::zeroed() },
        // SAFETY: as above.
        statx: unsafe { std::mem::zeroed() },
    };
    let mut skipped = vec![];
    let mut probes = vec![];
    let calls = [Call::Empty, Call::Fstat, Call::Pread];
    for call in calls {
        probes.push(Probe {
            mechanism: Mechanism::Offload,
            call,
            target: Target::Cores(cores),
            samples: vec![],
        });
    }
    for (mechanism, sqpoll) in [(Mechanism::Sqpoll, Some(service_cpu)), (Mechanism::Enter, None)] {
        for call in calls {
            match ring(sqpoll) {
                Ok(ring) => probes.push(Probe {
                    mechanism,
                    call,
                    target: Target::Ring(Box::new(ring)),
                    samples: vec![],
                }),
                Err(e) => {
                    skipped.push(skip_reason(&format!("io_uring {}", mechanism.name()), &e));
                    break;
                }
            }
        }
    }
    for call in [Call::Fstat, Call::Pread] {
        probes.push(Probe { mechanism: Mechanism::Local, call, target: Target::Here, samples: vec![] });
    }
    // Each probe once, to find calls the kernel refuses (an old kernel's statx, say).
    probes.retain_mut(|probe| {
        let ret = probe.round(&mut io);
        let expected = if probe.call == Call::Pread { READ_BYTES as i64 } else { 0 };
        if ret != expected {
            let err = std::io::Error::from_raw_os_error((-ret).clamp(0, 4095) as i32);
            skipped.push(format!(
                "{} {}: skipped, returned {ret} ({err}), expected {expected}",
                probe.mechanism.name(),
                probe.call.name()
            ));
        }
        ret == expected
    });
    let warm_up = (batch / 10).clamp(8, 200);
    for _ in 0..reps {
        for probe in &mut probes {
            std::thread::sleep(SETTLE);
            for _ in 0..warm_up {
                probe.round(&mut io);
            }
            let start = sys::now_ns();
            for _ in 0..batch {
                probe.round(&mut io);
            }
            probe.samples.push(sys::now_ns().saturating_sub(start) as f64 / batch as f64);
        }
    }
    drop(file);
    let medians: Vec<(Mechanism, Call, Stats)> =
        probes.iter().filter_map(|p| Some((p.mechanism, p.call, Stats::of(&p.samples)?))).collect();
    let sqpoll_median = |call: Call| {
        medians.iter().find(|(m, c, _)| *m == Mechanism::Sqpoll && *c == call).map(|(_, _, s)| s.median)
    };
    let rows = medians
        .iter()
        .map(|&(mechanism, call, stats)| HandoffRow {
            mechanism: mechanism.name(),
            call: call.name(),
            runs_on: mechanism.runs_on(call, app_cpu, service_cpu),
            round_trip_ns: stats,
            vs_sqpoll: sqpoll_median(call).map(|s| stats.median / s),
        })
        .collect();
    Ok(Handoffs { batch, rows, skipped })
}

/// The rows as a table, with the skip lines as notes.
pub fn table(handoffs: &Handoffs, app_cpu: usize, service_cpu: usize) -> Table {
    let mut t = Table::new(["call", "mechanism", "runs on", "round trip median", "min–max", "×sqpoll"])
        .title(format!(
            "Hand-off round trips from cpu{app_cpu} to the service cpu{service_cpu}, alternating batches of {} — same-run baseline: io_uring SQPOLL",
            handoffs.batch
        ))
        .align(0, Align::Left)
        .align(1, Align::Left)
        .align(2, Align::Left);
    let mut rows: Vec<&HandoffRow> = handoffs.rows.iter().collect();
    rows.sort_by_key(|r| ["empty", "fstat", "pread 4 KiB"].iter().position(|c| *c == r.call));
    for r in rows {
        t.row([
            r.call.to_string(),
            r.mechanism.to_string(),
            r.runs_on.clone(),
            report::fmt_ns(r.round_trip_ns.median),
            format!("{}–{}", report::fmt_ns(r.round_trip_ns.min), report::fmt_ns(r.round_trip_ns.max)),
            r.vs_sqpoll.map_or("-".into(), |x| format!("{x:.2}")),
        ]);
    }
    t.note("round trip: mean of a batch (the caller waits for each answer); min/median/max over repetitions; each batch starts with every poller asleep, then warms up");
    t.note("sqpoll: kernel thread pinned to the service CPU, caller spins on the completion ring; enter: one io_uring_enter per call; local: the plain system call");
    for line in &handoffs.skipped {
        t.note(line.clone());
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_reasons_name_the_cause() {
        let nosys = skip_reason("io_uring sqpoll", &std::io::Error::from_raw_os_error(libc::ENOSYS));
        assert!(nosys.contains("skipped") && nosys.contains("ENOSYS"), "{nosys}");
        let perm = skip_reason("io_uring enter", &std::io::Error::from_raw_os_error(libc::EPERM));
        assert!(perm.contains("seccomp"), "{perm}");
    }

    #[test]
    fn table_lists_rows_by_call_and_skips_as_notes() {
        let stats = Stats { min: 200.0, median: 300.0, max: 900.0, samples: 3 };
        let row = |mechanism, call| HandoffRow {
            mechanism,
            call,
            runs_on: "cpu1".into(),
            round_trip_ns: stats,
            vs_sqpoll: None,
        };
        let handoffs = Handoffs {
            batch: 10,
            rows: vec![row("offload", "pread 4 KiB"), row("offload", "empty")],
            skipped: vec!["io_uring sqpoll: skipped, io_uring is not in this kernel (ENOSYS)".into()],
        };
        let text = table(&handoffs, 0, 1).render();
        let empty = text.find("empty").unwrap();
        let pread = text.find("pread 4 KiB").unwrap();
        assert!(empty < pread, "{text}");
        assert!(text.contains("ENOSYS"), "{text}");
    }
}
