//! `corehop run`: run an unmodified program on chosen CPUs, optionally with its system calls
//! offloaded to service CPUs by the LD_PRELOAD library `libcorehop_preload.so`
//! (crates/preload; its crate docs describe what is intercepted and the hand-off protocol).
//!
//! The library is configured through environment variables set here (`COREHOP_POLICY`,
//! `COREHOP_SERVICE_CPUS`, …) and inherited by every program CMD starts. With `--stats` each
//! process appends one summary line to a temporary file at exit; this command adds them up
//! and prints a table on stderr after CMD ends, so CMD's own output is untouched.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Instant;

use anyhow::{bail, Context};
use corehop_runtime::sys;
use corehop_sys::wire::{self, env};
use corehop_topology::{excerpt, format_cpu_list, parse_cpu_list, OsCpu, VALUE_CHARS};
use serde::Serialize;

use corehop_bench::report::{fmt_ns, paired_interval, paired_median, Stats, Table};

use crate::environment::Environment;

/// The file name of the preload library cargo builds.
pub const LIBRARY: &str = "libcorehop_preload.so";

#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    corehop run --offload --policy always --stats -- sqlite3 db.sqlite 'select count(*) from t'\n  \
    corehop run --offload --service-cpus 1 --policy size --threshold 16384 -- cp big.iso /tmp/\n  \
    corehop run --cpus 0 -- make -j1\n\n\
    The preload library is built with `cargo build --workspace` (or `cargo build -p corehop-preload`)\n\
    and looked for next to the corehop binary, or at $COREHOP_PRELOAD. Under the default policy, and\n\
    without --stats, --stats-json or --record-trace, CMD gets the library's start-up stub instead (a\n\
    few pages, built with corehop): it passes calls straight to libc and loads the library into a\n\
    process that outlives its first 40 ms, so short processes pay no more than for an empty library.\n\
    A program seen twice to end within those 40 ms, starting nothing, and never otherwise, is then\n\
    started plainly, with no stub, but one start in 16: the record is\n\
    $XDG_CACHE_HOME/corehop/lifetimes-v1 (else ~/.cache/corehop/); delete it to forget.\n\
    COREHOP_STUB=none preloads the library itself.\n\n\
    Without --stats, --stats-json, --record-trace or --compare, corehop becomes CMD (exec, as env and\n\
    taskset do): same process id, CMD's own signals and exit status, no second process.")]
pub struct Args {
    /// Run CMD with system-call offload: load libcorehop_preload.so (LD_PRELOAD, appended to
    /// any existing one) so that read, write, pread/pwrite, readv/writev, open/openat, the stat
    /// family, fsync/fdatasync, sendfile, sendto/recvfrom and non-waiting poll/select may run on
    /// a service thread pinned to a service CPU. Results (return values, errno, short reads,
    /// EINTR) are unchanged; only where the kernel work runs changes. A process built with a
    /// sanitizer keeps its calls where its checks see them (`ASAN_OPTIONS` gets
    /// `verify_asan_link_order=0`, so that AddressSanitizer starts after the library). CMD and
    /// what it starts see their environment as they would plainly: corehop's variables are
    /// taken out of their sight before `main` and given back to each program they start.
    #[arg(long)]
    pub offload: bool,

    /// Service CPUs (kernel numbers, e.g. `1`, `2,3`, `2-3`): one service thread per CPU in
    /// every process of CMD, at most 8. Default: the last CPU this process may use.
    #[arg(long, value_name = "LIST", requires = "offload")]
    pub service_cpus: Option<String>,

    /// CPUs CMD itself runs on (kernel numbers). Default with --offload: unchanged for
    /// `--policy adaptive` (it moves nothing until moving pays, so it takes no CPU from the
    /// program) and `never` (it moves nothing), else every CPU this process may use except the
    /// service CPUs (all of them if that leaves none); without --offload: unchanged.
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,

    /// Which calls go across. `adaptive` (the default) moves nothing until moving pays: a
    /// process that outlives its first 40 ms (shorter ones run every call in place and pay for
    /// no policy) starts with `measured`, which keeps every kind of call (call, call site, size
    /// class, descriptor or path) local until moving it has been measured to cost the caller
    /// less — it moves a few calls of each kind as probes, within 1 % of the time its calls
    /// take. Once the process has run long enough to afford a trial (trials may cost at most
    /// 0.5 % of its time), it also tries `never`, `always`, `size` and `predicted` for short
    /// epochs, scored by the program's rate of completed calls; it switches only to an arm that wins by more
    /// than 2 %, twice, and goes on checking `never`.
    /// `--stats` says where each process settled. The fixed policies: `never` (the same-run
    /// baseline: intercept and count, move nothing), `always`, `size` (calls moving at least
    /// --threshold bytes, default 4096 — the 4 KB rule of fast-core-switching §3.6 — plus the
    /// calls that move no buffer) or `predicted` (the run-length predictor, timed form, 1500
    /// entries: offload when the call is predicted to run longer than --threshold ns; without
    /// --threshold, N is tuned online from the program's rate of completed calls). While
    /// corehop waits for CMD (with --stats, --stats-json, --record-trace or --compare), each
    /// process's predictor starts from what the processes of CMD that ended before it learned
    /// of call kinds, so a short process does not start cold.
    #[arg(long, value_enum, default_value_t = PolicyArg::Adaptive, requires = "offload")]
    pub policy: PolicyArg,

    /// Threshold of the policy: bytes for `size`, nanoseconds for `predicted`.
    #[arg(long, value_name = "BYTES|NS", requires = "offload")]
    pub threshold: Option<u64>,

    /// Print a summary on stderr when CMD ends: calls seen, offloaded, kept local and why,
    /// time on the service CPUs and the hand-off cost (mean, p50, p99), over every process CMD
    /// started, next to the runtime's `on()` round trip between the program's CPU and the
    /// service CPU, measured right after CMD ends (the same-run reference).
    #[arg(long, requires = "offload")]
    pub stats: bool,

    /// Write the summary as JSON to FILE (shape: `processes`, `unpinned`, `polled_ns`,
    /// `spun_ns`, `checked_ns`, `inherited`, `sanitized`, `settled`, `calls`: call name → seen, offloaded, local, kept,
    /// withdrawn, busy, service_ns, wait_ns, local_ns, local_timed; `handoff`: call name →
    /// `[low_ns, high_ns, count]` per non-empty histogram bucket; `on_round_trip`: `from_cpu`,
    /// `to_cpu`, `round_trip_ns` {min, median, max, samples} of the runtime's `on()` measured
    /// right after the program, or null).
    #[arg(long, value_name = "FILE", requires = "offload", value_parser = corehop_bench::report::output_path)]
    pub stats_json: Option<PathBuf>,

    /// How long a caller waits for a service thread to take its call before running the call
    /// itself (µs). A claimed call is always waited for, so nothing runs twice.
    #[arg(long, value_name = "US", default_value_t = DEFAULT_STALL_TIMEOUT_US, requires = "offload")]
    pub stall_timeout_us: u64,

    /// The longest a caller spins for its answer before sleeping on a futex (µs; a quarter of
    /// it after an answer that needed a sleep), and an idle service thread's first polling
    /// budget (then fitted to the gaps between calls). Longer spins cut hand-off latency and
    /// burn more CPU; `--stats` reports both sides' polling per offloaded call.
    #[arg(long, value_name = "US", default_value_t = DEFAULT_SPIN_US, requires = "offload")]
    pub spin_us: u64,

    /// Record every intercepted call of every process of CMD into FILE, as the CSV `corehop
    /// predict --trace FILE` replays: `call,fd,size,site,run_ns` (run length in ns on a
    /// monotonic clock, where the policy ran it; site = the program's return address, so keys
    /// are per process), each process's calls under its `# pid` line, appended at its exit
    /// (64 KiB at a time, each piece headed by that line). Use `--policy
    /// never` for local run lengths. A process that ends by `exec`, a signal or a raw exit
    /// system call (as Go programs end) adds nothing; at most 1 048 576 calls per process are
    /// kept.
    #[arg(long, value_name = "FILE", requires = "offload", conflicts_with = "compare", value_parser = corehop_bench::report::output_path)]
    pub record_trace: Option<PathBuf>,

    /// Instead of running CMD once: run it once plain and untimed (to warm the page cache; its
    /// output is the reference), then REPS times without the library and REPS times with it,
    /// alternating which goes first, with its output captured; print the wall time of each
    /// (min / median / max, and the ratio to the plain median, the same-run baseline), the
    /// paired ratio (the median of each offloaded run over the plain run next to it, and where
    /// its true value lies with 95 % chance from 6 repetitions up) and whether every run's
    /// stdout, stderr and exit status matched the reference. Fails if any did not, and says
    /// whether the offloaded runs alone differed or the plain runs' own output varies from run
    /// to run (a program that prints times or pids), which no comparison can see past. The timed
    /// runs collect no summary, as a run without --stats does not; with --stats, one more run
    /// prints it. Warns on stderr if, in a comparison of 2 s or more, other processes or the
    /// hypervisor took a tenth of the CPUs' time or more (as every `corehop bench` does).
    #[arg(long, value_name = "REPS", requires = "offload", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub compare: Option<u32>,

    /// With --compare: print the result as JSON instead of a table (shape: `command`, `reps`,
    /// `service_cpus`, `policy`, and `plain` / `offload`: each `min_ns`, `median_ns`, `max_ns`,
    /// `same_output`; plus `ratio` = offload median / plain median, `paired_ratio` (null with no
    /// repetition) and `paired_interval`: `low`, `high`, `coverage`, or null under 2
    /// repetitions).
    #[arg(long, requires = "compare")]
    pub json: bool,

    /// With --compare: draw the median wall times as bars in an SVG file.
    #[arg(long, value_name = "FILE.svg", value_parser = corehop_bench::report::plot_path, requires = "compare")]
    pub plot: Option<PathBuf>,

    /// The program to run and its arguments (after `--`, or after corehop's own options: an
    /// unknown option before the program's name is an error, not a program).
    #[arg(trailing_var_arg = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Why no process reported to `--stats` or `--record-trace`, though the program did work.
const NOTHING_INTERCEPTED: &str =
    "no process reported: the preload library sees only the calls a program makes \
through libc's exported functions (libc's own paths to the kernel, such as stdio's fopen, fread and \
fwrite, pass it by); a statically linked or set-user-ID program does not load it (it starts with \
its plain environment, and what it starts runs plainly too); a process under an address-space \
or data limit (ulimit -v, ulimit -d) runs without the library's work and reports nothing; and a process \
reports at exit() or _exit(), not at exec, a fatal signal or a raw exit system call (as Go \
programs end)";

/// The first lines of a `--record-trace` file.
pub const TRACE_HEADER: &str = "# corehop run --record-trace: calls under the `# pid` line of the process that made them, run lengths in ns\ncall,fd,size,site,run_ns\n";

/// The pid a `--record-trace` line heads the calls of, if it is such a line (`# pid 123`; a
/// note about a process, `# pid 123: …`, is not).
pub fn trace_pid(line: &str) -> Option<&str> {
    line.strip_prefix("# pid ").filter(|pid| !pid.contains(':')).map(str::trim)
}

/// AddressSanitizer's settings, read by a sanitized program's runtime as it starts.
const ASAN_OPTIONS: &str = "ASAN_OPTIONS";

/// `ASAN_OPTIONS` for the program, if it needs changing: AddressSanitizer's runtime, loaded
/// with a program built with `-fsanitize=address` (GCC's default), refuses to start unless it
/// comes first in the initial library list, and the preloaded library comes before it. The
/// order does not matter here: the library passes each call on to the sanitizer's interceptor
/// and keeps every call of a sanitized process where it is made. A `verify_asan_link_order`
/// the user set stays as it is.
fn asan_options(set: Option<OsString>) -> Option<OsString> {
    const KEY: &[u8] = b"verify_asan_link_order";
    const ANY_ORDER: &str = "verify_asan_link_order=0";
    match set {
        None => Some(ANY_ORDER.into()),
        Some(options) if options.as_encoded_bytes().windows(KEY.len()).any(|w| w == KEY) => None,
        Some(mut options) if !options.is_empty() => {
            options.push(":");
            options.push(ANY_ORDER);
            Some(options)
        }
        Some(_) => Some(ANY_ORDER.into()),
    }
}

/// The calls and processes a recorded trace holds, read a line at a time (a long program's
/// trace may not fit in memory); none if it cannot be read.
fn count_recorded(path: &std::path::Path) -> (usize, usize) {
    let Ok(file) = std::fs::File::open(path) else { return (0, 0) };
    let (mut calls, mut pids) = (0, std::collections::HashSet::new());
    for line in std::io::BufRead::lines(std::io::BufReader::new(file)).map_while(Result::ok) {
        // A process's block may come in several pieces, each headed by its pid.
        if let Some(pid) = trace_pid(&line) {
            pids.insert(pid.to_string());
        } else if !line.starts_with('#') && !line.starts_with("call,") {
            calls += 1;
        }
    }
    (calls, pids.len())
}

/// The summary the program's processes appended to `path`, a line at a time; an empty one if
/// none wrote (the file is made by the library's first process).
fn read_summary(path: &std::path::Path) -> anyhow::Result<Summary> {
    let mut summary = Summary::default();
    let Ok(file) = std::fs::File::open(path) else { return Ok(summary) };
    for (number, line) in std::io::BufRead::lines(std::io::BufReader::new(file)).enumerate() {
        summary.add_line(number + 1, &line?)?;
    }
    Ok(summary)
}

/// `path` made absolute (the program may change its working directory).
fn absolute(path: &std::path::Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))
}

/// `--stall-timeout-us` by default.
pub const DEFAULT_STALL_TIMEOUT_US: u64 = 10_000;
/// `--spin-us` by default.
pub const DEFAULT_SPIN_US: u64 = 20;

/// The `--policy` choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyArg {
    Adaptive,
    Never,
    Always,
    Size,
    Predicted,
}

impl PolicyArg {
    /// The CPUs the program runs on when `--cpus` is not given: every allowed CPU but the
    /// service CPUs for a policy that moves calls from the start (all of them if that leaves
    /// none); `None` (as inherited) for `adaptive`, which moves nothing until moving pays, and
    /// for `never`, which moves nothing at all: neither may take a CPU from the program (a
    /// `never` run is the baseline the others are held against).
    pub fn program_cpus(self, allowed: &[usize], service_cpus: &[usize]) -> Option<Vec<usize>> {
        if matches!(self, PolicyArg::Adaptive | PolicyArg::Never) {
            return None;
        }
        let rest: Vec<usize> = allowed.iter().copied().filter(|c| !service_cpus.contains(c)).collect();
        Some(if rest.is_empty() { allowed.to_vec() } else { rest })
    }

    /// The policy spec the preload library parses (`corehop_policy::offload::OffloadPolicy`).
    pub fn spec(self, threshold: Option<u64>) -> anyhow::Result<String> {
        Ok(match (self, threshold) {
            (PolicyArg::Adaptive, None) => wire::DEFAULT_POLICY.into(),
            (PolicyArg::Never, None) => "never".into(),
            (PolicyArg::Always, None) => "always".into(),
            (PolicyArg::Adaptive | PolicyArg::Never | PolicyArg::Always, Some(_)) => {
                bail!("--threshold applies to --policy size or predicted only")
            }
            (PolicyArg::Size, None) => "size".into(),
            (PolicyArg::Size, Some(bytes)) => format!("size:{bytes}"),
            // The timed table (medians by call site, then by kind): it never allocates after
            // start-up, which matters inside an interposed call (the fully associative form's
            // index may grow once).
            (PolicyArg::Predicted, None) => "predicted:time:tuned".into(),
            (PolicyArg::Predicted, Some(ns)) => format!("predicted:time:{ns}"),
        })
    }
}

/// The program could not be started (not found, not executable, ...).
#[derive(Debug, thiserror::Error)]
#[error("starting {program}")]
pub struct NotStarted {
    program: String,
    source: std::io::Error,
}

impl NotStarted {
    /// The exit status a shell or `env` gives a command it cannot start: 127 if it was not
    /// found, 126 if it was found but could not be run.
    pub fn exit_code(&self) -> u8 {
        if self.source.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        }
    }
}

/// How to start a program.
pub struct Launch {
    pub command: Vec<OsString>,
    /// CPUs the program runs on (`None`: as inherited).
    pub cpus: Option<Vec<usize>>,
    pub offload: Option<Offload>,
    /// Collect stdout and stderr instead of passing them through.
    pub capture: bool,
}

/// The preload configuration.
#[derive(Clone)]
pub struct Offload {
    pub library: PathBuf,
    pub service_cpus: Vec<usize>,
    pub policy: String,
    pub stall_timeout_ns: u64,
    pub spin_ns: u64,
    /// Where the processes append their summaries.
    pub stats_file: Option<PathBuf>,
    /// Where the processes append their recorded calls (`--record-trace`).
    pub trace_file: Option<PathBuf>,
}

impl Offload {
    /// The start-up stub to preload in the library's place, if this run may: under the default
    /// policy, which moves nothing in a process's first epoch, with nothing that counts or
    /// records every call from the first (no summary, no trace).
    pub fn stub(&self) -> Option<PathBuf> {
        let quiet = self.stats_file.is_none() && self.trace_file.is_none();
        (quiet && self.policy == wire::DEFAULT_POLICY).then(|| find_stub(&self.library)).flatten()
    }
}

/// What a run produced.
pub struct Finished {
    pub status: ExitStatus,
    pub wall_ns: u64,
    pub summary: Option<Summary>,
    /// stdout and stderr, when captured.
    pub output: Option<(Vec<u8>, Vec<u8>)>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let allowed = kernel_numbers(sys::affinity().context("reading this process's CPU affinity")?);
    let online = online_cpus();
    let mut launch = Launch { command: args.command, cpus: None, offload: None, capture: false };
    let mut service_cpus = Vec::new();
    if args.offload {
        service_cpus = match &args.service_cpus {
            Some(list) => checked_cpus("--service-cpus", list, &allowed, online.as_deref())?,
            None => vec![*allowed.last().context("this process may run on no CPU")?],
        };
        if service_cpus.len() > 8 {
            bail!("--service-cpus {}: at most 8 service CPUs", format_cpu_list(&service_cpus));
        }
        let stats_file = (args.stats || args.stats_json.is_some()).then(stats_path);
        launch.offload = Some(Offload {
            library: find_library()?,
            service_cpus: service_cpus.clone(),
            policy: args.policy.spec(args.threshold)?,
            stall_timeout_ns: args.stall_timeout_us.saturating_mul(1_000),
            spin_ns: args.spin_us.saturating_mul(1_000),
            stats_file,
            trace_file: args.record_trace.as_deref().map(absolute).transpose()?,
        });
    }
    launch.cpus = match &args.cpus {
        Some(list) => Some(checked_cpus("--cpus", list, &allowed, online.as_deref())?),
        None if args.offload => args.policy.program_cpus(&allowed, &service_cpus),
        None => None,
    };
    if let Some(reps) = args.compare {
        let output = CompareOutput { stats: args.stats, json: args.json, plot: args.plot };
        return corehop_bench::report::OutsideLoad::warn_around(|| {
            compare(launch, reps, &service_cpus, &output)
        });
    }
    if let Some(path) = launch.offload.as_ref().and_then(|o| o.trace_file.as_ref()) {
        std::fs::write(path, TRACE_HEADER)
            .with_context(|| format!("creating the trace file {}", path.display()))?;
    }
    let collects = launch.offload.as_ref().is_some_and(|o| o.stats_file.is_some() || o.trace_file.is_some());
    if !collects {
        return Err(launch.exec());
    }
    let finished = launch.run()?;
    if let Some(path) = launch.offload.as_ref().and_then(|o| o.trace_file.as_ref()) {
        let (calls, processes) = count_recorded(path);
        eprintln!("corehop: recorded {calls} calls of {processes} process(es) in {}", path.display());
        if calls == 0 {
            eprintln!("corehop: {NOTHING_INTERCEPTED}");
        }
    }
    if let Some(summary) = &finished.summary {
        // Right after the program, between its CPU and the service CPU: the hop a hand-off
        // is held against, measured on this machine as it is now.
        let program_cpus = launch.cpus.as_deref().unwrap_or(&allowed);
        let hop = match program_cpus.iter().find(|c| !service_cpus.contains(c)) {
            Some(&from) => HopReference::measure(from, service_cpus[0]),
            None => Err(anyhow::anyhow!("the program shares its only CPU with the service thread")),
        };
        if args.stats {
            eprint!("{}", summary.table(&service_cpus, finished.wall_ns, hop.as_ref().ok()).render());
            if let Err(e) = &hop {
                eprintln!("corehop: no on() round trip to compare the hand-offs with: {e:#}");
            }
        }
        if let Some(path) = &args.stats_json {
            let json =
                serde_json::to_string_pretty(&StatsJson { summary, on_round_trip: hop.as_ref().ok() })?;
            std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
        }
    }
    exit_like(finished.status)
}

/// Ends corehop as the program ended: with its exit code, or killed by the same signal (so a
/// shell or supervisor sees what it would have seen without corehop).
fn exit_like(status: ExitStatus) -> ! {
    if let Some(signal) = status.signal() {
        // SAFETY: plain libc calls on this process: no core file of corehop's own, the
        // default action for the signal, the signal let through, then raised.
        unsafe {
            let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            libc::signal(signal, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, signal);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(signal);
        }
    }
    std::process::exit(exit_code(status))
}

/// Passes the signals sent to corehop on to the program it runs, so that killing corehop ends
/// the program (corehop then ends as the program did and removes its files), and a signal the
/// program handles (SIGUSR1, SIGCONT after it stopped) reaches it as if sent to it directly.
mod forward {
    use std::sync::atomic::{AtomicI32, Ordering::SeqCst};

    /// The program's pid (0: not started yet).
    static CHILD: AtomicI32 = AtomicI32::new(0);
    /// A signal that came before the program started.
    static PENDING: AtomicI32 = AtomicI32::new(0);

    /// What may be sent to a process to end it, tell it something or wake it; not SIGPIPE,
    /// SIGCHLD or the job-control stops, which say something of corehop itself.
    pub const SIGNALS: [i32; 9] = [
        libc::SIGTERM,
        libc::SIGINT,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGWINCH,
        libc::SIGCONT,
    ];

    extern "C" fn on_signal(signal: i32, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
        // A signal from the terminal (SI_KERNEL) reached the program's process group itself;
        // one sent with kill (si_code <= 0) was meant for corehop alone and is passed on.
        // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
        if unsafe { (*info).si_code } > 0 {
            return;
        }
        match CHILD.load(SeqCst) {
            0 => PENDING.store(signal, SeqCst),
            // SAFETY: kill is async-signal-safe.
            child => unsafe {
                libc::kill(child, signal);
            },
        }
    }

    /// Installs the handlers (before the program starts, so no signal is lost). A signal
    /// corehop was started ignoring stays ignored: the program inherits that, as from the
    /// shell (`nohup`, or `&` in a script, which ignores SIGINT and SIGQUIT).
    pub fn install() {
        for signal in SIGNALS {
            if crate::inherited::ignored(signal) {
                continue;
            }
            // SAFETY: a zeroed sigaction with an SA_SIGINFO handler that only makes
            // async-signal-safe calls and touches atomics.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(signal, &action, std::ptr::null_mut());
            }
        }
    }

    /// The program started as `pid`: a signal that came meanwhile goes to it now.
    pub fn started(pid: u32) {
        let pid = pid as i32;
        CHILD.store(pid, SeqCst);
        let pending = PENDING.swap(0, SeqCst);
        if pending != 0 {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(pid, pending) };
        }
    }

    /// The program ended: nothing more to pass on.
    pub fn ended() {
        CHILD.store(0, SeqCst);
    }
}

/// How `--compare` reports.
struct CompareOutput {
    stats: bool,
    json: bool,
    plot: Option<PathBuf>,
}

/// One side of a `--compare` run, for `--json`.
#[derive(Serialize)]
struct CompareSide {
    min_ns: f64,
    median_ns: f64,
    max_ns: f64,
    same_output: bool,
}

#[derive(Serialize)]
struct CompareJson {
    command: Vec<String>,
    reps: u32,
    service_cpus: Vec<usize>,
    policy: String,
    plain: CompareSide,
    offload: CompareSide,
    ratio: f64,
    /// The median of the repetitions' own offload / plain ratios.
    paired_ratio: Option<f64>,
    paired_interval: Option<corehop_bench::report::Interval>,
}

/// `--compare`: the program with and without the library, alternating, outputs compared.
fn compare(mut launch: Launch, reps: u32, service_cpus: &[usize], out: &CompareOutput) -> anyhow::Result<()> {
    launch.capture = true;
    let offload = launch.offload.take().context("--compare needs --offload")?;
    let bar = corehop_bench::report::progress(u64::from(reps) * 2 + 1, "runs");
    // An untimed plain run first: it fills the page cache with what the program reads, which
    // the first timed run would otherwise pay alone, and its output is the reference.
    let warm_up = launch.run()?;
    let output = warm_up.output.unwrap_or_default();
    let reference = (warm_up.status, output.0, output.1);
    bar.inc(1);
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    // Per side, whether any run's exit status, stdout or stderr differed from the reference.
    let mut differed = [[false; 3]; 2];
    for rep in 0..reps {
        // Which side goes first alternates, so a drift of the host falls on both alike.
        let order = if rep % 2 == 0 { [false, true] } else { [true, false] };
        for with_offload in order {
            // Timed as a user runs it: with no summary to collect, the library counts nothing
            // and a call it keeps local passes it by (counting every call put a program of
            // one-byte reads at 1.29 times plain, against 1.05). `--stats` adds one more run
            // for the summary.
            launch.offload = with_offload.then(|| offload.clone());
            let finished = launch.run()?;
            let mode = usize::from(with_offload);
            times[mode].push(finished.wall_ns as f64);
            let output = finished.output.unwrap_or_default();
            let this = [finished.status != reference.0, output.0 != reference.1, output.1 != reference.2];
            for (seen, now) in differed[mode].iter_mut().zip(this) {
                *seen |= now;
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let same = differed.map(|side| !side.contains(&true));
    // Only the table prints the summary.
    let summary = if out.stats && !out.json {
        launch.offload = Some(Offload { stats_file: Some(stats_path()), ..offload.clone() });
        let finished = launch.run()?;
        finished.summary.map(|s| (s, finished.wall_ns))
    } else {
        None
    };
    let plain = Stats::of(&times[0]).context("no plain run")?;
    let command: Vec<String> = launch.command.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let paired = paired_median(&times[1], &times[0]);
    let interval = paired_interval(&times[1], &times[0]);
    let mut table = Table::new(["mode", "min", "median", "max", "median / plain", "paired", "same output"])
        .title(format!("corehop run --compare {reps}: {}", command.join(" ")));
    for (mode, name) in [(0, "plain (baseline)"), (1, offload.policy.as_str())] {
        let s = Stats::of(&times[mode]).context("no run")?;
        let paired = match (mode, paired, interval) {
            (1, Some(p), Some(i)) => format!("{p:.3} ({})", i.range(2)),
            (1, Some(p), None) => format!("{p:.3}"),
            _ => "-".to_string(),
        };
        table.row([
            if mode == 0 { name.to_string() } else { format!("offload {name}") },
            fmt_ns(s.min),
            fmt_ns(s.median),
            fmt_ns(s.max),
            format!("{:.3}", s.median / plain.median),
            paired,
            if same[mode] { "yes" } else { "NO" }.to_string(),
        ]);
    }
    table.note(format!(
        "wall time of {reps} runs each, after an untimed plain run, the side that goes first alternating; service \
         CPU {}; same output = stdout, stderr and exit status equal to the untimed run's",
        format_cpu_list(service_cpus)
    ));
    if let Some(i) = interval {
        table.note(format!(
            "paired = the median over the repetitions of each offloaded run's time over the plain run next to it \
             (steadier where times swing from one repetition to the next), and in brackets where its true value \
             lies {} (a sign test's order statistics; an interval that holds 1 says the difference is within the \
             noise)",
            i.chance()
        ));
    }
    let offloaded = Stats::of(&times[1]).context("no offloaded run")?;
    if out.json {
        let side = |s: Stats, same: bool| CompareSide {
            min_ns: s.min,
            median_ns: s.median,
            max_ns: s.max,
            same_output: same,
        };
        corehop_bench::report::print_json(&CompareJson {
            command: command.clone(),
            reps,
            service_cpus: service_cpus.to_vec(),
            policy: offload.policy.clone(),
            plain: side(plain, same[0]),
            offload: side(offloaded, same[1]),
            ratio: offloaded.median / plain.median,
            paired_ratio: paired,
            paired_interval: interval,
        })?;
    } else {
        print!("{}", table.render());
        if out.stats {
            if let Some((summary, wall_ns)) = &summary {
                print!("{}", summary.table(service_cpus, *wall_ns, None).render());
            }
        }
    }
    if let Some(path) = &out.plot {
        let bars = vec![
            ("plain".to_string(), plain.median / 1e6),
            (format!("offload {}", offload.policy), offloaded.median / 1e6),
        ];
        corehop_bench::report::plot_bars(
            path,
            &format!("corehop run --compare: {}", command.join(" ")),
            "median wall time (ms)",
            &bars,
        )?;
    }
    if !(same[0] && same[1]) {
        let streams = |side: [bool; 3]| {
            let names = ["exit status", "stdout", "stderr"];
            names.into_iter().zip(side).filter(|(_, d)| *d).map(|(n, _)| n).collect::<Vec<_>>().join(", ")
        };
        let offload_alone = [0, 1, 2].map(|i| differed[1][i] && !differed[0][i]);
        if offload_alone.contains(&true) {
            bail!(
                "the offloaded runs' {} differed from the plain runs', which did not differ there",
                streams(offload_alone)
            );
        }
        bail!(
            "the plain runs' own {} differed from one run to the next (times, pids or addresses in the output?), \
             so the outputs cannot show whether offload changed anything",
            streams(differed[0])
        );
    }
    Ok(())
}

/// The shell's convention: the exit code, or 128 + the signal that ended the program.
pub fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 1,
    }
}

/// Where `program` is, as `execvp` finds it: itself if it names a path, else the first
/// executable file of that name in `PATH`.
pub fn program_path(program: &std::ffi::OsStr) -> Option<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|candidate| {
        std::fs::metadata(candidate).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

impl Launch {
    /// Becomes the program (`execve`), as `env` and `taskset` do, when nothing is to be
    /// collected after it ends: it keeps corehop's process id, its signals and exit status are
    /// the program's own, and it pays no second process. Returns only if the exec failed.
    pub fn exec(&self) -> anyhow::Error {
        let (words, environment) = match self.prepared(false, None) {
            Ok(prepared) => prepared,
            Err(e) => return e,
        };
        let words: Vec<&std::ffi::OsStr> = words.iter().map(OsString::as_os_str).collect();
        let mut command = Command::new(words[0]);
        command.args(&words[1..]);
        crate::inherited::keep_for(&mut command, false);
        // Last: the program starts from this hook, after `keep_for`'s.
        environment.start_with(&mut command, &words);
        if let Some(cpus) = &self.cpus {
            if let Err(e) = sys::set_affinity(&os_cpus(cpus)) {
                return anyhow::Error::from(e).context(format!("running on CPUs {}", format_cpu_list(cpus)));
            }
        }
        NotStarted { program: self.command[0].to_string_lossy().into_owned(), source: command.exec() }.into()
    }

    /// The program's words and the changes to its environment (the preload library and its
    /// settings); `via_shell`: run by `/bin/sh`, for a file the kernel cannot run itself.
    /// Started either way (exec or spawn), the program gets the environment in our order.
    fn prepared(
        &self,
        via_shell: bool,
        learned: Option<&Path>,
    ) -> anyhow::Result<(Vec<OsString>, Environment)> {
        let (program, rest) = self.command.split_first().context("no command given")?;
        // A shell sets `_` to the path of the program it starts; started from one, corehop
        // holds its own there. The program gets its own, as from the shell.
        let underscore = std::env::var_os("_").is_some();
        let found =
            if via_shell || underscore || self.offload.is_some() { program_path(program) } else { None };
        let mut words: Vec<OsString> = Vec::with_capacity(self.command.len() + 1);
        if via_shell {
            words.extend(["/bin/sh".into(), found.clone().map_or(program.clone(), PathBuf::into_os_string)]);
        } else {
            words.push(program.clone());
        }
        words.extend(rest.iter().cloned());
        let mut environment = Environment::default();
        if let (true, Some(path)) = (underscore, &found) {
            environment.set("_", path);
        }
        // A program no library is preloaded into starts as it would plainly, and so does one
        // the loader would only list the libraries of (`hidden_env::LOADER_TRACE`), and the
        // loader itself asked to (`ld.so --list`).
        let traced = std::env::var_os(corehop_sys::hidden_env::LOADER_TRACE).is_some()
            || corehop_sys::hidden_env::loader_describes(
                program.as_bytes(),
                rest.iter().map(|w| w.as_bytes()),
            );
        let preloaded = !traced && (via_shell || found.as_deref().is_none_or(crate::preloadable::preloads));
        if let Some(offload) = self.offload.as_ref().filter(|_| preloaded) {
            let mut preload = std::env::var_os("LD_PRELOAD").unwrap_or_default();
            if !preload.is_empty() {
                preload.push(":");
            }
            match offload.stub() {
                Some(stub) => {
                    preload.push(stub);
                    environment.set(env::LIBRARY, &offload.library);
                    match lifetimes_file() {
                        Some(path) => environment.set(env::LIFETIMES, path),
                        None => environment.clear(env::LIFETIMES),
                    };
                }
                None => {
                    preload.push(&offload.library);
                    environment.clear(env::LIBRARY).clear(env::LIFETIMES);
                }
            }
            if let Some(options) = asan_options(std::env::var_os(ASAN_OPTIONS)) {
                environment.set(ASAN_OPTIONS, options);
            }
            environment
                .set("LD_PRELOAD", preload)
                .set(env::SERVICE_CPUS, format_cpu_list(&offload.service_cpus))
                .set(env::POLICY, &offload.policy)
                .set(env::STALL_TIMEOUT_NS, offload.stall_timeout_ns.to_string())
                .set(env::SPIN_NS, offload.spin_ns.to_string());
            match &offload.stats_file {
                Some(path) => environment.set(env::STATS_FILE, path),
                None => environment.clear(env::STATS_FILE),
            };
            match &offload.trace_file {
                Some(path) => environment.set(env::TRACE_FILE, path),
                None => environment.clear(env::TRACE_FILE),
            };
            match learned {
                Some(path) => environment.set(env::LEARNED, path),
                None => environment.clear(env::LEARNED),
            };
            // The program sees what it would plainly; what it starts gets these back.
            environment.hide_from_program(&[
                "LD_PRELOAD",
                ASAN_OPTIONS,
                env::LIBRARY,
                env::LIFETIMES,
                env::SERVICE_CPUS,
                env::POLICY,
                env::STALL_TIMEOUT_NS,
                env::SPIN_NS,
                env::STATS_FILE,
                env::TRACE_FILE,
                env::LEARNED,
            ]);
        }
        Ok((words, environment))
    }

    /// Starts the program, waits for it, and collects the offload summary if one was asked for.
    pub fn run(&self) -> anyhow::Result<Finished> {
        let program = self.command.first().context("no command given")?;
        let learned = self.offload.as_ref().and_then(|_| LearnedFile::new());
        // Words and environment made before the clock starts; started after.
        let prepare = |via_shell| -> anyhow::Result<(Vec<OsString>, Option<Vec<std::ffi::CString>>)> {
            let (words, environment) = self.prepared(via_shell, learned.as_ref().map(LearnedFile::path))?;
            Ok((words, environment.entries()))
        };
        let spawn = |(words, entries): &(Vec<OsString>, Option<Vec<std::ffi::CString>>)| {
            let words: Vec<&std::ffi::OsStr> = words.iter().map(OsString::as_os_str).collect();
            crate::spawn::spawn(&words, entries.as_deref(), self.capture)
        };
        let prepared = prepare(false)?;
        // The child inherits the CPU mask of the thread that starts it: narrow ours for the
        // spawn, then put it back.
        let previous = sys::affinity().context("reading this thread's CPU affinity")?;
        if let Some(cpus) = &self.cpus {
            sys::set_affinity(&os_cpus(cpus))
                .with_context(|| format!("running on CPUs {}", format_cpu_list(cpus)))?;
        }
        if let Some(path) = self.offload.as_ref().and_then(|o| o.stats_file.as_ref()) {
            // Made here, empty and private, so the library only appends to a file of ours.
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("creating the summary file {}", path.display()))?;
        }
        forward::install();
        let start = Instant::now();
        let mut spawned = spawn(&prepared);
        if spawned.as_ref().is_err_and(|e| e.raw_os_error() == Some(libc::ENOEXEC)) {
            // A file the kernel cannot run (a script without `#!`): `/bin/sh` runs it, as the
            // shell and `execvp` (so `corehop run` without a summary) do.
            spawned = spawn(&prepare(true)?);
        }
        if self.cpus.is_some() {
            sys::set_affinity(&previous).context("restoring this thread's CPU affinity")?;
        }
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                if let Some(path) = self.offload.as_ref().and_then(|o| o.stats_file.as_ref()) {
                    let _ = std::fs::remove_file(path);
                }
                return Err(NotStarted { program: program.to_string_lossy().into_owned(), source: e }.into());
            }
        };
        forward::started(child.id());
        let (status, output) = if self.capture {
            let (status, stdout, stderr) = child.wait_with_output().context("waiting for the program")?;
            (status, Some((stdout, stderr)))
        } else {
            (child.wait().context("waiting for the program")?, None)
        };
        forward::ended();
        let wall_ns = start.elapsed().as_nanos() as u64;
        let summary = match self.offload.as_ref().and_then(|o| o.stats_file.as_ref()) {
            Some(path) => {
                let summary = read_summary(path);
                let _ = std::fs::remove_file(path);
                Some(summary.with_context(|| format!("reading the offload summary {}", path.display()))?)
            }
            None => None,
        };
        Ok(Finished { status, wall_ns, summary, output })
    }
}

/// The file the program's processes hand on what their predictors learned through
/// (`COREHOP_LEARNED`): unnamed, so nothing is left behind, and reached as
/// `/proc/PID/fd/N` while this process holds it open, that is while it waits for the program.
/// Only then: a program corehop execs (nothing to collect) gets none, and no descriptor of ours.
struct LearnedFile {
    _file: std::fs::File,
    path: PathBuf,
}

impl LearnedFile {
    /// `None` if none can be made; the processes then each start fresh.
    fn new() -> Option<LearnedFile> {
        let file = tempfile::tempfile().ok()?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        Some(LearnedFile { path: format!("/proc/{}/fd/{fd}", std::process::id()).into(), _file: file })
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

/// The table of how each program's processes ended (`corehop_sys::lifetimes`), made if need
/// be: `lifetimes-v1` in `$XDG_CACHE_HOME/corehop`, else in `$HOME/.cache/corehop`. `None` if
/// neither names an absolute directory, or the file cannot be made (the stub then gives every
/// program its start-up stub, as without a table).
pub(crate) fn lifetimes_file() -> Option<PathBuf> {
    let absolute = |name: &str| std::env::var_os(name).map(PathBuf::from).filter(|p| p.is_absolute());
    let cache = absolute("XDG_CACHE_HOME").or_else(|| absolute("HOME").map(|home| home.join(".cache")))?;
    let dir = cache.join("corehop");
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir).ok()?;
    let path = dir.join(corehop_sys::lifetimes::FILE_NAME);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .ok()?;
    let metadata = file.metadata().ok()?;
    let bytes = corehop_sys::lifetimes::TABLE_BYTES as u64;
    // Only ever longer: a process that has it mapped would fault on a page cut off.
    if !metadata.is_file() || metadata.len() < bytes && file.set_len(bytes).is_err() {
        return None;
    }
    Some(path)
}

/// The words of the table of lifetimes, read now (for a report: the processes change it as
/// they go); `None` if there is none.
pub(crate) fn read_lifetimes() -> Option<Vec<u64>> {
    let bytes = std::fs::read(lifetimes_file()?).ok()?;
    let table = bytes.get(..corehop_sys::lifetimes::TABLE_BYTES)?;
    Some(table.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))).collect())
}

/// A fresh path in the temporary directory for the summary lines: `$TMPDIR` if it is an
/// absolute path to a directory (the program may change its working directory, and a
/// relative one would name another place there), else `/tmp`.
pub fn stats_path() -> PathBuf {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    temp_dir(std::env::var_os("TMPDIR")).join(format!("corehop-offload-{}-{nanos}.stats", std::process::id()))
}

fn temp_dir(tmpdir: Option<OsString>) -> PathBuf {
    tmpdir.map(PathBuf::from).filter(|dir| dir.is_absolute() && dir.is_dir()).unwrap_or_else(|| "/tmp".into())
}

/// The kernel's online CPUs, if sysfs says.
fn online_cpus() -> Option<Vec<usize>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    parse_cpu_list(&text).ok()
}

/// Parses a CPU list given on the command line and checks every CPU exists and may be used.
fn checked_cpus(
    flag: &str,
    list: &str,
    allowed: &[usize],
    online: Option<&[usize]>,
) -> anyhow::Result<Vec<usize>> {
    let cpus = parse_cpu_list(list).with_context(|| format!("{flag} {:?}", excerpt(list, VALUE_CHARS)))?;
    if cpus.is_empty() {
        bail!("{flag} {:?} names no CPU", excerpt(list, VALUE_CHARS));
    }
    for &cpu in &cpus {
        if online.is_some_and(|online| !online.contains(&cpu)) {
            bail!(
                "{flag}: CPU {cpu} does not exist or is offline on this machine (online: {})",
                format_cpu_list(online.unwrap_or_default())
            );
        }
        if !allowed.contains(&cpu) {
            bail!(
                "{flag}: CPU {cpu} is not allowed for this process (allowed: {})",
                format_cpu_list(allowed)
            );
        }
    }
    Ok(cpus)
}

/// Finds the preload library: `$COREHOP_PRELOAD`, else next to the corehop binary (cargo puts
/// both in `target/<profile>/`), else one directory up (for test binaries in `deps/`).
pub fn find_library() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(env::PRELOAD) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("{}={} is not a file", env::PRELOAD, path.display());
        }
        return Ok(path.canonicalize()?);
    }
    let exe = std::env::current_exe().context("locating the corehop binary")?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [dir.join(LIBRARY), dir.join("..").join(LIBRARY)];
    for candidate in &candidates {
        if candidate.is_file() {
            return Ok(candidate.canonicalize()?);
        }
    }
    bail!(
        "{LIBRARY} not found (looked in {}); build it with `cargo build --workspace` (or \
         `cargo build -p corehop-preload`, with --release for a release corehop), or set \
         COREHOP_PRELOAD=/path/to/{LIBRARY}",
        dir.display()
    )
}

/// The preload library's start-up stub, named in its directory.
pub const STUB: &str = "libcorehop_preload_stub.so";
/// Where `corehop run` finds the start-up stub, if not next to the library or where the build
/// put it; `none` preloads the library itself.
const STUB_VAR: &str = "COREHOP_STUB";

/// Finds the start-up stub (`crates/preload-stub`): `$COREHOP_STUB` (`none`: preload the
/// library itself), else next to `library`, else where this binary's build put it.
pub fn find_stub(library: &Path) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(STUB_VAR) {
        return (path != "none").then(|| PathBuf::from(path));
    }
    let beside = library.with_file_name(STUB);
    if beside.is_file() {
        return Some(beside);
    }
    let built = Path::new(env!("COREHOP_STUB_BUILT"));
    built.is_file().then(|| built.to_path_buf())
}

/// The offload summary of a run, as the preload library writes it (`corehop_sys::wire`).
pub use corehop_sys::wire::Summary;

/// The kernel CPU numbers of a CPU list, typed.
fn os_cpus(cpus: &[usize]) -> Vec<OsCpu> {
    cpus.iter().map(|&cpu| OsCpu(cpu)).collect()
}

/// Kernel CPU numbers as the command spells them (CPU lists, environment variables).
pub(crate) fn kernel_numbers(cpus: Vec<OsCpu>) -> Vec<usize> {
    cpus.into_iter().map(|cpu| cpu.0).collect()
}

/// Batches of `on()` round trips in a [`HopReference`].
const HOP_BATCHES: usize = 15;
/// `on()` round trips per batch.
const HOP_BATCH: u64 = 2_000;

/// The runtime's `on()` round trip from the program's CPU to the service CPU and back, both
/// workers polling (`Wake::Spin`): what a hand-off of the same two CPUs is held against.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct HopReference {
    /// Kernel CPU number the round trips start from (one the program ran on).
    pub from_cpu: usize,
    /// Kernel CPU number of the service CPU.
    pub to_cpu: usize,
    /// Mean round trip of a batch, in ns: min/median/max over the batches.
    pub round_trip_ns: Stats,
}

impl HopReference {
    /// [`HOP_BATCHES`] batches of [`HOP_BATCH`] `on()` round trips between kernel CPUs `from`
    /// and `to`, after a warm-up batch.
    pub fn measure(from: usize, to: usize) -> anyhow::Result<HopReference> {
        use corehop_runtime::{on, Runtime, Wake};
        let machine = corehop_topology::discover().context("discovering the CPUs")?;
        let dense = |os: usize| {
            machine
                .cpus()
                .iter()
                .find(|c| c.os_id.0 == os)
                .map(|c| c.id)
                .with_context(|| format!("no CPU {os} here"))
        };
        let (from_id, to_id) = (dense(from)?, dense(to)?);
        let rt = Runtime::builder().machine(machine).cpus([from_id, to_id]).wake(Wake::Spin).build()?;
        let batches = rt.block_on(from_id, move || -> Result<Vec<f64>, corehop_runtime::Error> {
            let mut batches = Vec::with_capacity(HOP_BATCHES);
            for batch in 0..=HOP_BATCHES {
                let start = sys::now_ns();
                for i in 0..HOP_BATCH {
                    std::hint::black_box(on(to_id, move || std::hint::black_box(i))?);
                }
                if batch > 0 {
                    batches.push(sys::now_ns().saturating_sub(start) as f64 / HOP_BATCH as f64);
                }
            }
            Ok(batches)
        })??;
        let round_trip_ns = Stats::of(&batches).context("no on() round trip measured")?;
        Ok(HopReference { from_cpu: from, to_cpu: to, round_trip_ns })
    }
}

/// `--stats-json`: the summary, and the `on()` round trip measured after the program.
#[derive(Serialize)]
struct StatsJson<'a> {
    #[serde(flatten)]
    summary: &'a Summary,
    on_round_trip: Option<&'a HopReference>,
}

/// What `corehop run --stats` prints of a [`Summary`].
trait SummaryTable {
    /// The summary as a table, with the estimate of time moved and time lost underneath, and
    /// the hand-off percentiles next to `hop`'s round trip if it was measured.
    fn table(&self, service_cpus: &[usize], wall_ns: u64, hop: Option<&HopReference>) -> Table;
}

impl SummaryTable for Summary {
    fn table(&self, service_cpus: &[usize], wall_ns: u64, hop: Option<&HopReference>) -> Table {
        let per = |ns: u64, n: u64| if n == 0 { "-".to_string() } else { fmt_ns(ns as f64 / n as f64) };
        // The counts under the preload library's own names, then the times per call.
        let counts = &corehop_sys::wire::COUNTERS[..6];
        let mut table = Table::new(
            ["call"]
                .iter()
                .chain(counts)
                .chain(&["on service", "hand-off", "p50", "p99", "p50 ÷ on()", "run local"])
                .copied(),
        )
        .title(format!(
            "corehop offload summary ({} process{}, service CPU{} {})",
            self.processes,
            if self.processes == 1 { "" } else { "es" },
            if service_cpus.len() == 1 { "" } else { "s" },
            format_cpu_list(service_cpus)
        ));
        let total = self.total();
        let mut all_handoffs = [0; corehop_sys::wire::HIST_BUCKETS];
        for hist in self.handoff.values() {
            all_handoffs.iter_mut().zip(hist).for_each(|(a, b)| *a += b);
        }
        let quantile = |name: &str, q: f64| {
            let hist = if name == "total" { Some(&all_handoffs) } else { self.handoff.get(name) };
            hist.and_then(|h| corehop_sys::wire::percentile(h, q))
        };
        let bound =
            |ns: Option<u64>| ns.map_or_else(|| "-".to_string(), |ns| format!("≤{}", fmt_ns(ns as f64)));
        let hop_ns = hop.map(|h| h.round_trip_ns.median);
        let ratio = |ns: Option<u64>| match (ns, hop_ns) {
            (Some(ns), Some(hop)) if hop > 0.0 => format!("≤{:.2}", ns as f64 / hop),
            _ => "-".to_string(),
        };
        for (name, c) in self.calls.iter().map(|(n, c)| (n.as_str(), c)).chain([("total", &total)]) {
            let times = [
                per(c.service_ns, c.offloaded),
                per(c.wait_ns.saturating_sub(c.service_ns), c.offloaded),
                bound(quantile(name, 0.5)),
                bound(quantile(name, 0.99)),
                ratio(quantile(name, 0.5)),
                per(c.local_ns, c.local_timed),
            ];
            let counted = c.fields().into_iter().take(counts.len()).map(|n| n.to_string());
            table.row([name.to_string()].into_iter().chain(counted).chain(times));
        }
        table.note(
            "local: the policy kept it on the caller; kept: it had to stay (could block until a signal, or names \
             the calling thread); withdrawn: the service thread did not take it in time (stall fallback); busy: no \
             free slot, nested call or start-up. Times are per call: on service = run time on the service CPU, \
             hand-off = the caller's wait beyond that (mean; p50 and p99 as the upper bounds of their \
             histogram buckets, which are at most 1/8 wide), the service thread's safety checks included.",
        );
        match hop {
            Some(h) => table.note(format!(
                "same-run reference: the runtime's on() round trip cpu{} → cpu{} → cpu{}, both workers polling, \
                 measured right after the program: median {} (min {}, max {}, over {} batches of {HOP_BATCH}); \
                 p50 ÷ on() is each hand-off median over that median",
                h.from_cpu,
                h.to_cpu,
                h.from_cpu,
                fmt_ns(h.round_trip_ns.median),
                fmt_ns(h.round_trip_ns.min),
                fmt_ns(h.round_trip_ns.max),
                h.round_trip_ns.samples
            )),
            None => table.note("same-run reference: no on() round trip measured"),
        };
        table.note(format!(
            "service threads spent {} on safety checks around the calls ({} per offloaded call): part of the \
             hand-off (the system calls that check a descriptor's type or an opened path before a call, and \
             a new device's file system after a stat)",
            fmt_ns(self.checked_ns as f64),
            per(self.checked_ns, total.offloaded)
        ));
        table.note(format!(
            "service threads polled for work {} in all ({} per offloaded call), callers spun for answers {} \
             ({} per offloaded call): the CPU polling cost on each side; idle, a service thread polls for an \
             adaptive budget fitted to the gaps between calls, then sleeps; a caller spins up to its limit \
             (a quarter of it after an answer that needed a sleep), then sleeps",
            fmt_ns(self.polled_ns as f64),
            per(self.polled_ns, total.offloaded),
            fmt_ns(self.spun_ns as f64),
            per(self.spun_ns, total.offloaded)
        ));
        let overhead = total.wait_ns.saturating_sub(total.service_ns);
        table.note(format!(
            "estimate: {} of kernel work moved off the program's CPUs; {} lost to hand-offs ({} per offloaded call); \
             wall time {}.",
            fmt_ns(total.service_ns as f64),
            fmt_ns(overhead as f64),
            per(overhead, total.offloaded),
            fmt_ns(wall_ns as f64)
        ));
        if self.processes == 0 {
            table.note(NOTHING_INTERCEPTED);
        }
        if self.unpinned > 0 {
            table.note(format!("{} process(es) could not pin their service threads", self.unpinned));
        }
        if self.sanitized > 0 {
            table.note(format!(
                "{} of {} process(es) kept every call with its caller: a sanitizer (AddressSanitizer, \
                 ThreadSanitizer, ...) checks each call in the thread that makes it",
                self.sanitized, self.processes
            ));
        }
        if self.inherited > 0 {
            table.note(format!(
                "{} of {} process(es) started their run-length predictor from what the processes before them learned",
                self.inherited, self.processes
            ));
        }
        for (arm, s) in &self.settled {
            table.note(format!(
                "adaptive: {} process(es) settled on `{arm}` after {} sampling round(s) ({} switch(es), {} \
                 taken back when the new arm lost its first run); trials cost at most {:.2} % of a \
                 process's time{}",
                s.processes,
                s.rounds,
                s.switches,
                s.taken_back,
                s.max_regret_ppm as f64 / 1e4,
                if s.rounds == 0 {
                    " (none ran long enough to afford a trial: moving was never tried)"
                } else {
                    ""
                }
            ));
        }
        table
    }
}

/// `corehop tour` part: `sort` and `dd` on a generated file, each with and without offload
/// (`--policy always`, so every intercepted call really goes across), outputs compared, and
/// the offload summary of the dd run.
pub fn tour() -> anyhow::Result<()> {
    let library = find_library()?;
    let allowed = kernel_numbers(sys::affinity()?);
    let service = *allowed.last().context("no CPU allowed")?;
    let app: Vec<usize> = allowed.iter().copied().filter(|&c| c != service).collect();
    let app = if app.is_empty() { allowed.clone() } else { app };
    // Removed on every way out, errors included.
    let tmp = tempfile::Builder::new().prefix("corehop-tour-run-").tempdir()?;
    let dir = tmp.path();
    let input = dir.join("input.txt");
    let mut text = String::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..100_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        text.push_str(&format!("{:016x}\n", x));
    }
    std::fs::write(&input, &text)?;
    let reps = 3;
    let default_policy = PolicyArg::Adaptive.spec(None)?;
    // Plain, then the mechanism (every call moved), then what `corehop run --offload` does.
    let modes = [None, Some("always"), Some(default_policy.as_str())];
    let mut table = Table::new([
        "program",
        "plain (min/med/max)",
        "always (min/med/max)",
        "default (min/med/max)",
        "same output",
        "moved: always",
        "moved: default",
    ])
    .title(format!(
        "corehop run --offload, --policy always and the default (service CPU {service}, program on {})",
        format_cpu_list(&app)
    ));
    let programs: [(&str, Vec<OsString>, &str); 2] = [
        ("sort", vec!["sort".into(), input.clone().into(), "-o".into()], "sorted"),
        (
            "dd bs=64K",
            vec![
                "dd".into(),
                format!("if={}", input.display()).into(),
                "bs=64K".into(),
                "status=none".into(),
            ],
            "copy",
        ),
    ];
    let mut shown = None;
    let mut over_plain = Vec::new();
    for (name, argv, out_name) in programs {
        let mut wall_ns: [Vec<f64>; 3] = Default::default();
        let mut moved = [String::from("-"), String::from("-"), String::from("-")];
        let mut same = true;
        for rep in 0..reps {
            for (m, policy) in modes.iter().enumerate() {
                let out = dir.join(format!("{out_name}-{m}"));
                let mut command = argv.clone();
                if name == "sort" {
                    command.push(out.clone().into());
                } else {
                    command.push(format!("of={}", out.display()).into());
                }
                let launch = Launch {
                    command,
                    capture: false,
                    cpus: Some(app.clone()),
                    offload: policy.map(|policy| Offload {
                        library: library.clone(),
                        service_cpus: vec![service],
                        policy: policy.into(),
                        stall_timeout_ns: 10_000_000,
                        spin_ns: 20_000,
                        stats_file: Some(stats_path()),
                        trace_file: None,
                    }),
                };
                let finished = launch.run()?;
                if !finished.status.success() {
                    bail!("{name} failed: {}", finished.status);
                }
                wall_ns[m].push(finished.wall_ns as f64);
                if policy.is_some() {
                    // A process too short to load the library (the default's start-up stub
                    // loads it after 40 ms) moved nothing and leaves no summary.
                    moved[m] = match &finished.summary {
                        Some(summary) => {
                            let total = summary.total();
                            format!("{} / {}", total.offloaded, total.seen)
                        }
                        None => "0 (not loaded)".into(),
                    };
                }
                if m == 1 && rep == reps - 1 && name != "sort" {
                    shown = finished.summary.map(|summary| (summary, finished.wall_ns));
                }
            }
            let plain = std::fs::read(dir.join(format!("{out_name}-0")))?;
            for m in 1..modes.len() {
                same &= std::fs::read(dir.join(format!("{out_name}-{m}")))? == plain;
            }
        }
        let show = |v: &[f64]| {
            Stats::of(v).map_or("-".into(), |s| {
                format!("{} / {} / {}", fmt_ns(s.min), fmt_ns(s.median), fmt_ns(s.max))
            })
        };
        let [plain, always, default] = &wall_ns;
        if let (Some(p), Some(a), Some(d)) = (Stats::of(plain), Stats::of(always), Stats::of(default)) {
            over_plain.push(format!("{name} {:.2}× and {:.2}×", a.median / p.median, d.median / p.median));
        }
        let [_, moved_always, moved_default] = moved;
        table.row([
            name.to_string(),
            show(plain),
            show(always),
            show(default),
            if same { "yes" } else { "NO" }.to_string(),
            moved_always,
            moved_default,
        ]);
    }
    table.note(format!(
        "wall time of {reps} runs each, alternating; plain = the same program without the library; \
         always moves every call it may (the mechanism at work), the default moves a call only \
         once moving it measured cheaper"
    ));
    print!("{}", table.render());
    let Some((summary, wall_ns)) = shown else { bail!("the dd run left no offload summary") };
    print!("{}", summary.table(&[service], wall_ns, None).render());
    let total = summary.total();
    let per = |ns: u64| fmt_ns(ns as f64 / total.offloaded.max(1) as f64);
    let handoff = total.wait_ns.saturating_sub(total.service_ns);
    println!(
        "takeaway: unmodified programs ran their file system calls on CPU {service} with byte-identical results; \
         a hand-off cost {} per call against {} of kernel work moved off the program's CPU. In wall time, \
         always and the default ran at {} of plain: the default moves a call only once moving it \
         measured cheaper for the program.",
        per(handoff),
        per(total.service_ns),
        over_plain.join("; ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_sanitizer_may_come_after_the_library_unless_the_user_said_otherwise() {
        let any = Some(OsString::from("verify_asan_link_order=0"));
        assert_eq!(asan_options(None), any);
        assert_eq!(asan_options(Some("".into())), any);
        assert_eq!(
            asan_options(Some("detect_leaks=0".into())),
            Some("detect_leaks=0:verify_asan_link_order=0".into())
        );
        assert_eq!(asan_options(Some("verify_asan_link_order=1".into())), None);
    }

    #[test]
    fn policy_specs() {
        assert_eq!(PolicyArg::Size.spec(None).unwrap(), "size");
        assert_eq!(PolicyArg::Size.spec(Some(100)).unwrap(), "size:100");
        assert_eq!(PolicyArg::Predicted.spec(None).unwrap(), "predicted:time:tuned");
        assert_eq!(PolicyArg::Predicted.spec(Some(5000)).unwrap(), "predicted:time:5000");
        assert!(PolicyArg::Always.spec(Some(1)).is_err());
        for p in
            [PolicyArg::Adaptive, PolicyArg::Never, PolicyArg::Always, PolicyArg::Size, PolicyArg::Predicted]
        {
            let spec = p.spec(None).unwrap();
            assert!(spec.parse::<corehop_policy::offload::OffloadPolicy>().is_ok(), "{spec}");
        }
    }

    #[test]
    fn summaries_render_as_a_table() {
        let text = "corehop-preload-v2 pid=1 lanes=1 pinned=1 checked_ns=30 read=3:2:0:1:0:0:200:500:40:1 \
                    hist.read=48:2\n\
                    corehop-preload-v2 pid=2 lanes=1 pinned=0 read=1:1:0:0:0:0:10:20:0:0 hist.read=56:1 \
                    fsync=1:0:0:0:1:0:0:0:7:1\n";
        let s = Summary::parse(text).unwrap();
        assert_eq!(s.processes, 2);
        assert_eq!(s.unpinned, 1);
        assert_eq!(s.calls["read"].seen, 4);
        assert_eq!(s.calls["read"].offloaded, 3);
        assert_eq!(s.calls["read"].wait_ns, 520);
        assert_eq!(s.calls["fsync"].withdrawn, 1);
        assert_eq!(s.total().seen, 5);
        assert_eq!(corehop_sys::wire::bucket_range(48), (256, 288));
        let hop = HopReference {
            from_cpu: 0,
            to_cpu: 1,
            round_trip_ns: Stats { min: 100.0, median: 144.0, max: 300.0, samples: 15 },
        };
        let rendered = s.table(&[1], 1000, Some(&hop)).render();
        assert!(rendered.contains("fsync") && rendered.contains("total"));
        let header = rendered.lines().find(|l| l.contains("offloaded")).unwrap();
        let words: Vec<&str> = header.split_whitespace().collect();
        assert_eq!(
            words[..7],
            ["call", "seen", "offloaded", "local", "kept", "withdrawn", "busy"],
            "{header}"
        );
        let read: Vec<&str> =
            rendered.lines().find(|l| l.starts_with("read")).unwrap().split_whitespace().collect();
        assert_eq!(read[..7], ["read", "4", "3", "0", "1", "0", "0"], "{rendered}");
        // The median of three hand-offs, two in [256, 288) ns: at most 288 ns, 2× the hop.
        assert!(rendered.contains("≤288 ns") && rendered.contains("≤2.00"), "{rendered}");
        assert!(rendered.contains("cpu0 → cpu1 → cpu0") && rendered.contains("median 144 ns"), "{rendered}");
        assert!(
            rendered.contains("30 ns on safety checks around the calls (10 ns per offloaded call)"),
            "{rendered}"
        );
        assert!(!s.table(&[1], 1000, None).render().contains("≤2.00"));
    }

    #[test]
    fn cpu_lists_are_checked_against_the_machine() {
        let allowed = [0, 1];
        let online = [0, 1, 2];
        assert_eq!(checked_cpus("--cpus", "1", &allowed, Some(&online)).unwrap(), vec![1]);
        let e = checked_cpus("--cpus", "7", &allowed, Some(&online)).unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
        let e = checked_cpus("--cpus", "2", &allowed, Some(&online)).unwrap_err().to_string();
        assert!(e.contains("not allowed"), "{e}");
        assert!(checked_cpus("--cpus", "x", &allowed, Some(&online)).is_err());
        assert!(checked_cpus("--cpus", "", &allowed, Some(&online)).is_err());
    }

    #[test]
    fn the_tour_runs_when_the_library_is_built() {
        match find_library() {
            Ok(_) => tour().unwrap(),
            Err(e) => eprintln!("skipped: {e}"),
        }
    }

    #[test]
    fn the_summary_goes_to_an_absolute_temporary_directory() {
        assert_eq!(temp_dir(None), PathBuf::from("/tmp"));
        assert_eq!(temp_dir(Some("relative/dir".into())), PathBuf::from("/tmp"));
        assert_eq!(temp_dir(Some("/no/such/dir/here".into())), PathBuf::from("/tmp"));
        let dir = std::env::current_dir().unwrap();
        assert_eq!(temp_dir(Some(dir.clone().into_os_string())), dir);
    }

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 128 + 9);
    }
}
