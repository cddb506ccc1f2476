//! `corehop bench offload`: the offload policies side by side, in one run, on two real
//! workloads, with `never` (everything on the application CPU) as the same-run baseline.
//!
//! - **sqlite**: TPC-B-like transactions on SQLite with durable commits
//!   (`synchronous=FULL`, rollback journal, fsync on every commit) in a temporary directory;
//!   each statement is one offload decision, COMMIT is described as an fsync (see `sqlite.rs`).
//! - **files**: a static-file server over 127.0.0.1 (openat, fstat, send, sendfile per request)
//!   and a closed-loop client, both on the application CPU.
//!
//! The application runs on one CPU and one service core on another. Every policy runs once
//! per repetition, interleaved, so drifts in machine load hit all policies alike. Reported per
//! policy: throughput (min/median/max over repetitions), ×never (median ratio), latency
//! p50/mean/p99 (all repetitions pooled: a mean far above the median is a tail of units the
//! host held up), share of calls offloaded, and per-CPU busy time: the
//! application CPU (CPU time of the app threads / wall) and the service CPU (time running
//! offloaded work / wall; the service thread's own CPU time, spinning included, in JSON). The
//! round trip of an empty closure to the service core and back is measured in the same run:
//! it is the hop cost offload has to beat, and the threshold the predictors start from. Next
//! to it, the peer rows (`uring.rs`): the same hand-off, an fstat and a 4 KiB pread through the
//! service core and through io_uring (SQPOLL on the service CPU, and plain `io_uring_enter`),
//! alternating in the same process.

use std::path::{Path, PathBuf};

use anyhow::Context;
use corehop_policy::offload::{
    Adaptive, Measured, MeasuredConfig, OffloadPolicy, Predicted, StaticProfile, TableForm,
};
use corehop_policy::payoff::PayoffConfig;
use corehop_runtime::service::{thread_cpu_ns, OffloadStats, Offloader, ServiceConfig, ServiceCores};
use corehop_runtime::{sys, OsCpu};
use serde::Serialize;

use crate::report::{self, Align, OutputArgs, Stats, Table};

pub mod files;
pub mod sqlite;
pub mod tasks;
pub mod uring;

/// Offload policies side by side on SQLite transactions and a loopback file server.
///
/// --quick lowers the defaults of --reps, --txns and --requests (values given explicitly
/// still win). --plot draws throughput relative to `never` per workload and policy as bars.
///
/// A second table compares hand-off round trips between the same two CPUs, alternating in
/// one process: corehop's service core (empty, fstat, 4 KiB pread), io_uring with SQPOLL (its
/// kernel thread pinned to the service CPU: NOP, STATX, READ), plain `io_uring_enter`, and the
/// plain local call. Where io_uring is unavailable (ENOSYS, EPERM) its rows say so.
///
/// --json prints `{hop_round_trip_ns, app_cpu, service_cpu, shared_cpu, results: [{workload,
/// policy, ops, throughput: {min, median, max, samples}, vs_never, paired_vs_never,
/// best_fixed: null | {policy, ratio, paired_ratio, paired_interval: {low, high, coverage} |
/// null}, head_to_head: null | {policy, pairs, throughput: {min, median, max, samples},
/// fixed_throughput: {...}, ratio, paired_ratio, paired_interval}, p50_ns, mean_ns, p99_ns, offloaded,
/// app_busy, service_busy, service_thread_busy, ended_on, sampling_rounds}], handoff: {batch,
/// rows: [{mechanism, call, runs_on, round_trip_ns: {min, median, max, samples}, vs_sqpoll}],
/// skipped: [reason]}}`
/// (busy values are fractions of wall time; paired ratios are medians over the repetitions of
/// the ratio within one repetition; `best_fixed`: for predicted, measured and tuned, the
/// fixed rule (never, always, size, static) with the best median in the run, and where the
/// paired ratio's true value lies with the chance given (`corehop bench run-suite --help`
/// says how); `head_to_head`: for `tuned`, it and that best fixed rule measured again, in
/// `--head-to-head` pairs of back-to-back runs (see there); `ended_on` and `sampling_rounds`:
/// for `tuned`, the arm each repetition ended in and the sampling rounds it completed, as
/// printed under the table, else empty).
#[derive(clap::Args, Clone)]
pub struct Args {
    /// Policies to compare (comma-separated): never, always, size (the 4 KB rule), static
    /// (calls whose profiled mean run is ≥ 2 × the measured hop), predicted (the timed run-length
    /// predictor, N = the measured hop round trip plus --caller-spin-us: what a caller's CPU
    /// spends on a moved call, so only calls that run longer give it time back; files-tasks
    /// adds no spin, since its tasks yield their CPU while a call runs elsewhere; N rises to
    /// the measured cost of a move if that is higher), measured (a call key moves once moving
    /// it measured cheaper for its caller than running it here; probes within 1 % of the
    /// calls' time), tuned (the default of `corehop run --offload`: starts in measured, and
    /// samples never, always, size, static and predicted in short trials scored by the
    /// application's own throughput). `never` is always included: it is the baseline.
    #[arg(long, value_delimiter = ',', default_values_t = PolicyChoice::ALL.map(|p| p.name().to_string()))]
    pub policies: Vec<String>,
    /// Workloads (comma-separated): sqlite, files, files-tasks (the file server on the task
    /// runtime: 16 connections, a task each; a moved call takes its task to the service
    /// CPU's worker, where it stays while its calls keep moving, and the other tasks run on
    /// meanwhile; see `offload/tasks.rs`).
    #[arg(long, value_delimiter = ',', default_values = ["sqlite", "files", "files-tasks"])]
    pub workloads: Vec<String>,
    /// Repetitions of every policy (min/median/max are over these) [default: 5; 1 with --quick].
    /// On a host that drifts (a VM whose vCPUs it moves), many short repetitions pair the
    /// policies more closely than a few long ones: `--reps 41 --requests 2000` put the file
    /// server's paired intervals within ±2 %, where five default runs spread ±15 %. Short runs
    /// weigh each policy's learning more, as short programs do.
    #[arg(long)]
    pub reps: Option<usize>,
    /// Transactions per SQLite run [default: 1000; 40 with --quick].
    #[arg(long)]
    pub txns: Option<usize>,
    /// Requests per file-server run [default: 20000; 200 with --quick].
    #[arg(long)]
    pub requests: Option<usize>,
    /// Batches of each hand-off row (min/median/max are over these) [default: 15; 3 with
    /// --quick]; 0 leaves the hand-off table out.
    #[arg(long)]
    pub handoff_reps: Option<usize>,
    /// Round trips per hand-off batch [default: 2000; 200 with --quick].
    #[arg(long)]
    pub handoff_batch: Option<usize>,
    /// After each workload's sweep, run `tuned` and the sweep's best fixed rule this many more
    /// times each, back to back, alternating which goes first (0: skip) [default: 5; 1 with
    /// --quick]. The rule that won the sweep won it partly on luck (it is the best of four
    /// noisy medians); measured again beside `tuned` it is a fair baseline.
    #[arg(long)]
    pub head_to_head: Option<usize>,
    /// CPU for the application (default: the first this process may use).
    #[arg(long)]
    pub app_cpu: Option<usize>,
    /// CPU for the service core (default: the last this process may use).
    #[arg(long)]
    pub service_cpu: Option<usize>,
    /// How long a caller spins for an offloaded result before sleeping on a futex, in µs (at
    /// most 1 000 000). Spinning is fastest when the application CPU has nothing else to run, but it steals
    /// the CPU from other application threads (the file server's client shares it). The
    /// tasks of files-tasks do not spin: they yield.
    #[arg(long, default_value_t = 10)]
    pub caller_spin_us: u64,
    /// How long an idle service core polls for work before sleeping, in µs (at most 1 000 000).
    #[arg(long, default_value_t = 50)]
    pub idle_spin_us: u64,
    /// Seed of the transaction and request streams (same seed, same work for every policy).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write each workload's profiling run (every call run locally, timed in ns) as a
    /// `corehop predict` CSV trace: PREFIX-sqlite.csv, PREFIX-files.csv.
    #[arg(long, value_name = "PREFIX")]
    pub record_trace: Option<PathBuf>,
    /// --quick, --json, --plot.
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PolicyChoice {
    Never,
    Always,
    Size,
    Static,
    Predicted,
    Measured,
    Tuned,
}

impl PolicyChoice {
    const ALL: [PolicyChoice; 7] = [
        PolicyChoice::Never,
        PolicyChoice::Always,
        PolicyChoice::Size,
        PolicyChoice::Static,
        PolicyChoice::Predicted,
        PolicyChoice::Measured,
        PolicyChoice::Tuned,
    ];

    fn name(self) -> &'static str {
        match self {
            PolicyChoice::Never => "never",
            PolicyChoice::Always => "always",
            PolicyChoice::Size => "size",
            PolicyChoice::Static => "static",
            PolicyChoice::Predicted => "predicted",
            PolicyChoice::Measured => "measured",
            PolicyChoice::Tuned => "tuned",
        }
    }

    /// A rule fixed before the run (it learns nothing while it runs): what an adaptive
    /// policy is held against.
    fn is_fixed(self) -> bool {
        matches!(self, PolicyChoice::Never | PolicyChoice::Always | PolicyChoice::Size | PolicyChoice::Static)
    }

    fn parse(name: &str) -> anyhow::Result<PolicyChoice> {
        PolicyChoice::ALL.into_iter().find(|p| p.name() == name.trim()).ok_or_else(|| {
            anyhow::anyhow!(
                "unknown policy {name:?} in --policies (expected some of: never, always, size, static, predicted, measured, tuned)"
            )
        })
    }

    /// The policy, given the measured empty round trip `hop_ns` and what a caller spends on
    /// an offloaded call besides waiting (`caller_spin_ns`: it spins that long before it
    /// sleeps, and its CPU does nothing else meanwhile). A call is worth moving when it runs
    /// longer than the two together: only then does the application CPU get time back.
    fn build(
        self,
        hop_ns: u64,
        caller_spin_ns: u64,
        profile: &StaticProfile,
    ) -> anyhow::Result<OffloadPolicy> {
        let n = hop_ns.saturating_add(caller_spin_ns).max(1);
        let measured = || -> anyhow::Result<OffloadPolicy> {
            let config = MeasuredConfig { move_prior: n, first_move_prior: n, ..MeasuredConfig::default() };
            Ok(OffloadPolicy::Measured(Box::new(Measured::new(config)?)))
        };
        Ok(match self {
            PolicyChoice::Never => OffloadPolicy::Never,
            PolicyChoice::Always => OffloadPolicy::Always,
            PolicyChoice::Size => {
                OffloadPolicy::SizeThreshold { bytes: corehop_policy::offload::DEFAULT_SIZE_THRESHOLD }
            }
            PolicyChoice::Static => OffloadPolicy::StaticProfile(profile.clone()),
            PolicyChoice::Predicted => {
                OffloadPolicy::Predicted(Box::new(Predicted::fixed(TableForm::TIMED, n)?))
            }
            PolicyChoice::Measured => measured()?,
            PolicyChoice::Tuned => {
                // The default of `corehop run --offload`: measured, sampled against never
                // and the fixed rules.
                let arms = vec![
                    measured()?,
                    OffloadPolicy::Always,
                    OffloadPolicy::SizeThreshold { bytes: corehop_policy::offload::DEFAULT_SIZE_THRESHOLD },
                    OffloadPolicy::StaticProfile(profile.clone()),
                    OffloadPolicy::Predicted(Box::new(Predicted::fixed(TableForm::TIMED, n)?)),
                ];
                OffloadPolicy::Adaptive(Box::new(Adaptive::new(arms, PayoffConfig::default())?))
            }
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    Sqlite,
    Files,
    FilesTasks,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Sqlite => "sqlite",
            Workload::Files => "files",
            Workload::FilesTasks => "files-tasks",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Workload::Sqlite => "txn",
            Workload::Files | Workload::FilesTasks => "req",
        }
    }

    /// What a caller of this workload spends on a moved call besides the hop, given how long
    /// a thread spins for the result (`spin_us`): a task yields its CPU instead.
    fn caller_spin_ns(self, spin_us: u64) -> u64 {
        match self {
            Workload::FilesTasks => 0,
            Workload::Sqlite | Workload::Files => spin_us.saturating_mul(1_000),
        }
    }

    fn parse(name: &str) -> anyhow::Result<Workload> {
        match name.trim() {
            "sqlite" => Ok(Workload::Sqlite),
            "files" => Ok(Workload::Files),
            "files-tasks" => Ok(Workload::FilesTasks),
            other => anyhow::bail!(
                "unknown workload {other:?} in --workloads (expected sqlite, files, files-tasks)"
            ),
        }
    }
}

/// What a workload run saw from the client side.
pub struct Run {
    /// Transactions or requests completed.
    pub ops: u64,
    /// Wall time of the run.
    pub wall_ns: u64,
    /// Each operation's latency as the client saw it, in ns.
    pub latencies_ns: Vec<f64>,
}

impl Run {
    /// Operations completed per second.
    fn per_s(&self) -> f64 {
        self.ops as f64 * 1e9 / self.wall_ns.max(1) as f64
    }
}

/// What the application side did during a run.
pub struct Served {
    /// The application thread's offloader counters.
    pub stats: OffloadStats,
    /// CPU time of the application threads.
    pub cpu_ns: u64,
    /// Every call of a profiling run with its run length.
    pub profile: Vec<(corehop_policy::offload::CallDesc, u64)>,
    /// Where an adaptive policy ended the run (`None`: not adaptive).
    pub ended_on: Option<Ended>,
}

/// Where an adaptive policy ended a run.
pub struct Ended {
    /// The arm it was in.
    pub arm: String,
    /// The sampling rounds it completed: none where the run ended before its first round (its
    /// warm-up and first run of epochs), so that it stayed in the arm it started in.
    pub rounds: u32,
}

/// Where an adaptive policy is now (`None`: not adaptive).
pub fn ended_on(policy: &OffloadPolicy) -> Option<Ended> {
    match policy {
        OffloadPolicy::Adaptive(a) => {
            Some(Ended { arm: a.arms()[a.sampler().incumbent()].label(), rounds: a.sampler().rounds().0 })
        }
        _ => None,
    }
}

#[derive(Serialize)]
struct Output {
    hop_round_trip_ns: u64,
    app_cpu: usize,
    service_cpu: usize,
    shared_cpu: bool,
    results: Vec<Row>,
    handoff: Option<uring::Handoffs>,
}

#[derive(Serialize)]
struct Row {
    workload: &'static str,
    policy: &'static str,
    ops: u64,
    throughput: Stats,
    vs_never: f64,
    /// Median over the repetitions of this policy's throughput over `never`'s in the same
    /// repetition.
    paired_vs_never: f64,
    /// For an adaptive policy: the fixed rule with the best median in this run, and this
    /// policy's median over it, plainly and paired by repetition.
    best_fixed: Option<BestFixed>,
    head_to_head: Option<HeadToHead>,
    p50_ns: f64,
    /// The mean latency: where it exceeds the median, a tail of units held up.
    mean_ns: f64,
    p99_ns: f64,
    offloaded: f64,
    app_busy: f64,
    service_busy: f64,
    service_thread_busy: Option<f64>,
    /// An adaptive policy: the arm each repetition ended in.
    ended_on: Vec<String>,
    /// An adaptive policy: the sampling rounds each repetition completed.
    sampling_rounds: Vec<u32>,
}

#[derive(Serialize, Clone, Copy)]
struct BestFixed {
    policy: &'static str,
    ratio: f64,
    paired_ratio: f64,
    /// Where the paired ratio's true value lies (`None` with one repetition).
    paired_interval: Option<report::Interval>,
}

/// `tuned` against the sweep's best fixed rule, measured again beside it.
#[derive(Serialize)]
struct HeadToHead {
    /// The fixed rule.
    policy: &'static str,
    pairs: usize,
    /// `tuned`'s throughput in these runs.
    throughput: Stats,
    fixed_throughput: Stats,
    /// `tuned`'s median over the rule's.
    ratio: f64,
    /// The median over pairs of `tuned`'s run over the rule's.
    paired_ratio: f64,
    /// Where that median's true value lies (`None` with one pair).
    paired_interval: Option<report::Interval>,
}

/// Median over the repetitions of `a`'s throughput over `b`'s in the same repetition.
fn paired(a: &[f64], b: &[f64]) -> f64 {
    report::paired_median(a, b).unwrap_or(f64::NAN)
}

#[derive(Default)]
struct Samples {
    throughput: Vec<f64>,
    latencies: Vec<f64>,
    ops: u64,
    wall_ns: u64,
    calls: u64,
    offloaded: u64,
    app_cpu_ns: u64,
    service_busy_ns: u64,
    service_thread_ns: Option<u64>,
    ended_on: Vec<String>,
    sampling_rounds: Vec<u32>,
}

struct Bench<'a> {
    counts: &'a Counts,
    seed: u64,
    cores: &'a ServiceCores,
    app_cpu: usize,
    dir: &'a Path,
}

impl Bench<'_> {
    fn one(
        &self,
        workload: Workload,
        policy: OffloadPolicy,
        profile: bool,
        data: &Path,
    ) -> anyhow::Result<(Run, Served)> {
        match workload {
            Workload::Sqlite => {
                let cpu0 = thread_cpu_ns(sys::gettid()).unwrap_or(0);
                let mut off =
                    Offloader::new(self.cores, policy).with_epochs(std::time::Duration::from_millis(20));
                if profile {
                    off = off.with_profile();
                }
                let run = sqlite::run(data, &mut off, self.counts.txns, self.seed)?;
                let cpu_ns = thread_cpu_ns(sys::gettid()).unwrap_or(0).saturating_sub(cpu0);
                let ended_on = ended_on(off.policy());
                Ok((run, Served { stats: off.stats(), cpu_ns, profile: off.take_profile(), ended_on }))
            }
            Workload::Files => files::run(
                self.dir,
                self.cores,
                policy,
                profile,
                self.app_cpu,
                self.counts.requests,
                self.seed,
            ),
            Workload::FilesTasks => {
                let service_cpu = self.cores.os_cpus()[0];
                tasks::run(
                    self.dir,
                    policy,
                    profile,
                    OsCpu(self.app_cpu),
                    service_cpu,
                    self.counts.requests,
                    self.seed,
                )
            }
        }
    }
}

/// The counts a run uses, after `--quick` and explicit values.
struct Counts {
    reps: usize,
    txns: usize,
    requests: usize,
    handoff_reps: usize,
    handoff_batch: usize,
    head_to_head: usize,
}

/// `corehop bench offload`: runs every policy on every workload, prints the table (or JSON).
pub fn run(args: Args) -> anyhow::Result<()> {
    let output = collect(&args)?;
    if args.output.json {
        report::print_json(&output)?;
    } else {
        println!("{}", table(&output).render());
        if let Some(handoff) = &output.handoff {
            println!("\n{}", uring::table(handoff, output.app_cpu, output.service_cpu).render());
        }
    }
    if let Some(path) = &args.output.plot {
        let bars: Vec<(String, f64)> =
            output.results.iter().map(|r| (format!("{} {}", r.workload, r.policy), r.vs_never)).collect();
        report::plot_bars(
            path,
            "Offload policies: throughput relative to never (same run)",
            "× never",
            &bars,
        )?;
        if !args.output.json {
            println!("plot written to {}", path.display());
        }
    }
    Ok(())
}

/// Transactions or requests per repetition at most.
const MAX_OPS: usize = 10_000_000;

/// Validates the arguments, starts the service core and measures every policy.
fn collect(args: &Args) -> anyhow::Result<Output> {
    let (reps, txns, requests, handoff_reps, handoff_batch, pairs) =
        if args.output.quick { (1, 40, 200, 3, 200, 1) } else { (5, 1000, 20000, 15, 2000, 5) };
    let counts = Counts {
        reps: args.reps.unwrap_or(reps),
        txns: args.txns.unwrap_or(txns),
        requests: args.requests.unwrap_or(requests),
        handoff_reps: args.handoff_reps.unwrap_or(handoff_reps),
        handoff_batch: args.handoff_batch.unwrap_or(handoff_batch),
        head_to_head: args.head_to_head.unwrap_or(pairs),
    };
    // Every transaction's and request's latency is kept: 8 bytes each.
    report::check_range("--reps", counts.reps, 1..=report::MAX_REPS)?;
    report::check_range("--txns", counts.txns, 1..=MAX_OPS)?;
    report::check_range("--requests", counts.requests, 1..=MAX_OPS)?;
    report::check_range("--handoff-reps", counts.handoff_reps, 0..=1000)?;
    report::check_range("--handoff-batch", counts.handoff_batch, 1..=1_000_000)?;
    report::check_range("--head-to-head", counts.head_to_head, 0..=report::MAX_REPS)?;
    // A second at most: past that a spin is a busy CPU, not a wait.
    report::check_range("--caller-spin-us", args.caller_spin_us, 0..=1_000_000)?;
    report::check_range("--idle-spin-us", args.idle_spin_us, 0..=1_000_000)?;
    let mut choices = vec![PolicyChoice::Never];
    for name in &args.policies {
        let choice = PolicyChoice::parse(name)?;
        if !choices.contains(&choice) {
            choices.push(choice);
        }
    }
    let workloads = report::each_once(
        args.workloads.iter().map(|w| Workload::parse(w)).collect::<anyhow::Result<Vec<_>>>()?,
    );
    anyhow::ensure!(!workloads.is_empty(), "--workloads is empty");

    let allowed: Vec<usize> = sys::affinity()?.into_iter().map(|cpu| cpu.0).collect();
    let app_cpu = args.app_cpu.unwrap_or(allowed[0]);
    let service_cpu = args.service_cpu.unwrap_or(*allowed.last().expect("a process runs somewhere"));
    anyhow::ensure!(
        allowed.contains(&app_cpu),
        "--app-cpu {app_cpu} is not one this process may use ({allowed:?})"
    );
    let shared_cpu = app_cpu == service_cpu;
    let mut config = ServiceConfig::on_cpus([OsCpu(service_cpu)]);
    config.caller_spin = std::time::Duration::from_micros(args.caller_spin_us);
    config.idle_spin = std::time::Duration::from_micros(args.idle_spin_us);
    let cores = config.build()?;
    let output = std::thread::scope(|scope| {
        // The application side runs on its own pinned thread so the caller's affinity is untouched.
        scope
            .spawn(|| -> anyhow::Result<Output> {
                sys::pin_current_thread(OsCpu(app_cpu))?;
                measure(args, &counts, &cores, &choices, &workloads, app_cpu, service_cpu)
            })
            .join()
            .map_err(|_| anyhow::anyhow!("benchmark thread panicked"))?
    })?;
    Ok(Output { shared_cpu, ..output })
}

fn measure(
    args: &Args,
    counts: &Counts,
    cores: &ServiceCores,
    choices: &[PolicyChoice],
    workloads: &[Workload],
    app_cpu: usize,
    service_cpu: usize,
) -> anyhow::Result<Output> {
    let hop_ns = cores.round_trip_ns(2000);
    // Removed on drop, errors included.
    let scratch = tempfile::Builder::new().prefix("corehop-bench-offload-").tempdir()?;
    let handoff = if counts.handoff_reps == 0 {
        None
    } else {
        Some(uring::measure(
            cores,
            app_cpu,
            service_cpu,
            counts.handoff_reps,
            counts.handoff_batch,
            scratch.path(),
        )?)
    };
    let bench = Bench { counts, seed: args.seed, cores, app_cpu, dir: scratch.path() };
    let pairs = if choices.contains(&PolicyChoice::Tuned) { counts.head_to_head } else { 0 };
    let bar =
        report::progress((workloads.len() * (1 + counts.reps * choices.len() + 2 * pairs)) as u64, "offload");
    let mut results = vec![];
    for &workload in workloads {
        let data = match workload {
            Workload::Sqlite => sqlite::create(scratch.path())?,
            Workload::Files | Workload::FilesTasks => {
                files::create(scratch.path())?;
                scratch.path().to_path_buf()
            }
        };
        // Profiling pass (also the warm-up): every call local, run lengths recorded.
        bar.set_message(format!("{} profile", workload.name()));
        let (_, served) = bench.one(workload, OffloadPolicy::Never, true, &data)?;
        if let Some(prefix) = &args.record_trace {
            let path = PathBuf::from(format!("{}-{}.csv", prefix.display(), workload.name()));
            write_trace(&path, &served.profile)?;
            eprintln!("trace of the {} profiling run written to {}", workload.name(), path.display());
        }
        let profile =
            StaticProfile::from_profile(served.profile.iter().map(|(call, run)| (call.kind, *run)), hop_ns);
        bar.inc(1);
        let caller_spin_ns = workload.caller_spin_ns(args.caller_spin_us);
        let run_once = |choice: PolicyChoice| -> anyhow::Result<(Run, Served)> {
            bar.set_message(format!("{} {}", workload.name(), choice.name()));
            bench.one(workload, choice.build(hop_ns, caller_spin_ns, &profile)?, false, &data)
        };
        let mut samples: Vec<Samples> = choices.iter().map(|_| Samples::default()).collect();
        for rep in 0..counts.reps {
            // The service core's polling state and the sockets of the run before carry over:
            // see `report::turn`.
            for k in 0..choices.len() {
                let i = report::turn(rep, k, choices.len());
                let before = cores.stats()[0];
                let (run, served) = run_once(choices[i])?;
                let after = cores.stats()[0];
                let s = &mut samples[i];
                s.throughput.push(run.per_s());
                s.latencies.extend(run.latencies_ns);
                s.ops += run.ops;
                s.wall_ns += run.wall_ns;
                s.calls += served.stats.calls;
                s.offloaded += served.stats.offloaded;
                s.app_cpu_ns += served.cpu_ns;
                if let Some(ended) = served.ended_on {
                    s.ended_on.push(ended.arm);
                    s.sampling_rounds.push(ended.rounds);
                }
                // The task server's moved calls run on its own runtime's worker, not here.
                s.service_busy_ns += match workload {
                    Workload::FilesTasks => served.stats.remote_run_ns,
                    _ => after.busy_ns - before.busy_ns,
                };
                s.service_thread_ns = match (after.thread_cpu_ns, before.thread_cpu_ns) {
                    (Some(a), Some(b)) => Some(s.service_thread_ns.unwrap_or(0) + a.saturating_sub(b)),
                    _ => None,
                };
                bar.inc(1);
            }
        }
        let median = |s: &Samples| Stats::of(&s.throughput).map_or(f64::NAN, |s| s.median);
        let never = samples[0].throughput.clone();
        let best = choices
            .iter()
            .zip(&samples)
            .filter(|(c, _)| c.is_fixed())
            .max_by(|a, b| median(a.1).total_cmp(&median(b.1)))
            .map(|(&c, s)| (c, median(s), s.throughput.clone()));
        let mut head_to_head = match best {
            Some((fixed, ..)) if pairs > 0 => {
                let (tuned, base) = report::back_to_back(
                    pairs,
                    || run_once(PolicyChoice::Tuned).map(|(run, _)| run.per_s()),
                    || run_once(fixed).map(|(run, _)| run.per_s()),
                    || bar.inc(1),
                )?;
                let stats = |runs: &[f64]| Stats::of(runs).context("pairs >= 1");
                let (tuned_stats, fixed_stats) = (stats(&tuned)?, stats(&base)?);
                Some(HeadToHead {
                    policy: fixed.name(),
                    pairs,
                    ratio: tuned_stats.median / fixed_stats.median.max(f64::MIN_POSITIVE),
                    paired_ratio: paired(&tuned, &base),
                    paired_interval: report::paired_interval(&tuned, &base),
                    throughput: tuned_stats,
                    fixed_throughput: fixed_stats,
                })
            }
            _ => None,
        };
        let never_median = median(&samples[0]);
        for (choice, s) in choices.iter().zip(samples) {
            let throughput = Stats::of(&s.throughput).ok_or_else(|| anyhow::anyhow!("no samples"))?;
            let best_fixed = best.as_ref().filter(|_| !choice.is_fixed()).map(|(fixed, m, reps)| BestFixed {
                policy: fixed.name(),
                ratio: throughput.median / m,
                paired_ratio: paired(&s.throughput, reps),
                paired_interval: report::paired_interval(&s.throughput, reps),
            });
            let wall = s.wall_ns.max(1) as f64;
            results.push(Row {
                workload: workload.name(),
                policy: choice.name(),
                ops: s.ops,
                throughput,
                vs_never: throughput.median / never_median,
                paired_vs_never: paired(&s.throughput, &never),
                best_fixed,
                head_to_head: if *choice == PolicyChoice::Tuned { head_to_head.take() } else { None },
                p50_ns: report::percentile(&s.latencies, 50.0).unwrap_or(f64::NAN),
                mean_ns: mean(&s.latencies),
                p99_ns: report::percentile(&s.latencies, 99.0).unwrap_or(f64::NAN),
                offloaded: if s.calls == 0 { 0.0 } else { s.offloaded as f64 / s.calls as f64 },
                app_busy: s.app_cpu_ns as f64 / wall,
                service_busy: s.service_busy_ns as f64 / wall,
                service_thread_busy: s.service_thread_ns.map(|ns| ns as f64 / wall),
                ended_on: s.ended_on,
                sampling_rounds: s.sampling_rounds,
            });
        }
    }
    bar.finish_and_clear();
    Ok(Output { hop_round_trip_ns: hop_ns, app_cpu, service_cpu, shared_cpu: false, results, handoff })
}

/// Writes calls as a `corehop predict` CSV trace (`call,fd,size,site,run_ns`).
fn write_trace(path: &Path, calls: &[(corehop_policy::offload::CallDesc, u64)]) -> anyhow::Result<()> {
    use std::fmt::Write as _;
    let mut text = String::from("call,fd,size,site,run_ns\n");
    for (call, run) in calls {
        let name = match call.kind.name() {
            Some(name) => name.to_string(),
            None => format!("{:?}", call.kind).to_lowercase().replace(['(', ')'], ""),
        };
        writeln!(text, "{name},{},{},{},{run}", call.fd, call.size, call.site)?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The mean of `values`; NaN for none.
fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

fn pct(x: f64) -> String {
    format!("{:.0}%", 100.0 * x)
}

fn table(out: &Output) -> Table {
    let mut t = Table::new([
        "workload",
        "policy",
        "ops/s median",
        "min–max",
        "×never",
        "paired",
        "p50",
        "mean",
        "p99",
        "offloaded",
        "app CPU",
        "svc work",
        "svc CPU",
    ])
    .title(format!(
        "Offload policies, app on cpu{} and service core on cpu{} — same-run baseline: `never`, and an empty offload round trip of {}",
        out.app_cpu,
        out.service_cpu,
        report::fmt_ns(out.hop_round_trip_ns as f64)
    ))
    .align(0, Align::Left)
    .align(1, Align::Left);
    for r in &out.results {
        let unit = if r.workload == Workload::Sqlite.name() {
            Workload::Sqlite.unit()
        } else {
            Workload::Files.unit()
        };
        t.row([
            r.workload.to_string(),
            r.policy.to_string(),
            format!("{:.0} {unit}/s", r.throughput.median),
            format!("{:.0}–{:.0}", r.throughput.min, r.throughput.max),
            format!("{:.2}", r.vs_never),
            format!("{:.2}", r.paired_vs_never),
            report::fmt_ns(r.p50_ns),
            report::fmt_ns(r.mean_ns),
            report::fmt_ns(r.p99_ns),
            pct(r.offloaded),
            pct(r.app_busy),
            pct(r.service_busy),
            r.service_thread_busy.map_or("-".into(), pct),
        ]);
    }
    t.note(
        "×never: median throughput over the same run's `never` median (the baseline measured in this run); paired: median over the repetitions of each one's throughput over `never`'s in the same repetition",
    );
    for r in &out.results {
        if let Some(b) = r.best_fixed {
            let interval =
                b.paired_interval.map_or(String::new(), |i| format!(" ({} {})", i.range(3), i.chance()));
            t.note(format!(
                "{} {}: {:.3}× the best fixed rule here ({}), paired {:.3}{interval}",
                r.workload, r.policy, b.ratio, b.policy, b.paired_ratio
            ));
        }
        if let Some(h) = &r.head_to_head {
            let interval =
                h.paired_interval.map_or(String::new(), |i| format!(" ({} {})", i.range(3), i.chance()));
            t.note(format!(
                "{} {} head to head with {}, {} of back-to-back runs: {:.3}× by the medians, paired {:.3}{interval}",
                r.workload,
                r.policy,
                h.policy,
                if h.pairs == 1 { "1 pair".to_string() } else { format!("{} pairs", h.pairs) },
                h.ratio,
                h.paired_ratio
            ));
        }
    }
    t.note("app CPU: CPU time of the app threads / wall; svc work: time offloaded calls ran (blocking included) / wall; svc CPU: service thread CPU time (idle polling included) / wall");
    for r in out.results.iter().filter(|r| !r.ended_on.is_empty()) {
        let mut arms: Vec<(&String, usize)> = Vec::new();
        for arm in &r.ended_on {
            match arms.iter_mut().find(|(a, _)| *a == arm) {
                Some((_, n)) => *n += 1,
                None => arms.push((arm, 1)),
            }
        }
        let arms: Vec<String> = arms.iter().map(|(arm, n)| format!("{arm} ×{n}")).collect();
        let rounds: Vec<String> = r.sampling_rounds.iter().map(u32::to_string).collect();
        let none = if r.sampling_rounds.iter().all(|&n| n == 0) {
            " (runs too short for a round: it stayed in the arm it starts in)"
        } else {
            ""
        };
        t.note(format!(
            "{} {} ended its repetitions in: {}, after {} sampling rounds{none}",
            r.workload,
            r.policy,
            arms.join(", "),
            rounds.join(", ")
        ));
    }
    if out.shared_cpu {
        t.note(
            "only one CPU available: the service core shares the application CPU, so offload can only cost",
        );
    }
    t
}

/// The front-door demo: a short run of both workloads. Three repetitions of 300 transactions
/// and 2000 requests, not `--quick`'s one of 40 and 200: in those the adaptive policies are
/// still sampling when the run ends, and one repetition is the host's as much as theirs.
pub fn tour() -> anyhow::Result<()> {
    let args = Args {
        policies: PolicyChoice::ALL.map(|p| p.name().to_string()).to_vec(),
        workloads: vec!["sqlite".into(), "files".into()],
        reps: Some(3),
        txns: Some(300),
        requests: Some(2000),
        handoff_reps: Some(0),
        handoff_batch: None,
        head_to_head: Some(0),
        app_cpu: None,
        service_cpu: None,
        caller_spin_us: 10,
        idle_spin_us: 50,
        seed: 1,
        record_trace: None,
        output: OutputArgs { quick: true, ..OutputArgs::default() },
    };
    let output = collect(&args)?;
    println!("{}", table(&output).render());
    println!("{}", takeaway(&output));
    Ok(())
}

/// One line: the best policy per workload against the same run's `never`.
fn takeaway(out: &Output) -> String {
    let mut parts = vec![];
    for workload in [Workload::Sqlite, Workload::Files] {
        let rows = out.results.iter().filter(|r| r.workload == workload.name() && r.policy != "never");
        if let Some(best) = rows.max_by(|a, b| a.vs_never.total_cmp(&b.vs_never)) {
            parts.push(format!(
                "{}: best {} at ×{:.2} of never",
                workload.name(),
                best.policy,
                best.vs_never
            ));
        }
    }
    format!(
        "takeaway: {} (one hop round trip = {}; offload pays only when the moved work outweighs it and the service core is free)",
        parts.join("; "),
        report::fmt_ns(out.hop_round_trip_ns as f64)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(workload: &'static str, policy: &'static str, vs_never: f64) -> Row {
        let throughput = Stats { min: 1.0, median: 1.0, max: 1.0, samples: 1 };
        Row {
            workload,
            policy,
            ops: 1,
            throughput,
            vs_never,
            paired_vs_never: vs_never,
            best_fixed: None,
            head_to_head: None,
            p50_ns: 1.0,
            mean_ns: 1.5,
            p99_ns: 2.0,
            offloaded: 0.0,
            app_busy: 0.5,
            service_busy: 0.0,
            service_thread_busy: None,
            ended_on: Vec::new(),
            sampling_rounds: Vec::new(),
        }
    }

    #[test]
    fn a_task_server_pays_the_hop_alone_for_a_move() {
        let profile = StaticProfile::from_profile([], 2_000);
        let n = |workload: Workload| match PolicyChoice::Predicted
            .build(2_000, workload.caller_spin_ns(10), &profile)
            .unwrap()
        {
            OffloadPolicy::Predicted(p) => p.effective_threshold(),
            other => panic!("{other:?}"),
        };
        // A thread spins up to 10 µs for a moved call's result; a task yields its CPU.
        assert_eq!(n(Workload::FilesTasks), 2_000);
        assert_eq!(n(Workload::Files), 12_000);
        assert_eq!(n(Workload::Sqlite), 12_000);
    }

    #[test]
    fn takeaway_names_the_best_policy_per_workload() {
        let out = Output {
            hop_round_trip_ns: 2_000,
            app_cpu: 0,
            service_cpu: 1,
            shared_cpu: false,
            handoff: None,
            results: vec![
                row("sqlite", "never", 1.0),
                row("sqlite", "size", 1.2),
                row("sqlite", "always", 0.7),
                row("files", "never", 1.0),
                row("files", "predicted", 0.4),
            ],
        };
        let line = takeaway(&out);
        assert!(line.contains("sqlite: best size at ×1.20 of never"), "{line}");
        assert!(line.contains("files: best predicted at ×0.40 of never"), "{line}");
        assert!(line.contains("2.00 µs"), "{line}");
        let text = table(&out).render();
        assert!(text.contains("size") && text.contains("1.20"), "{text}");
    }

    #[test]
    fn a_paired_ratio_compares_repetitions_with_their_own() {
        // The medians are 2 and 1, yet in two of three repetitions the two ran alike.
        assert_eq!(paired(&[2.0, 1.0, 3.0], &[1.0, 1.0, 3.0]), 1.0);
        assert_eq!(paired(&[2.0, 4.0, 6.0], &[1.0, 2.0, 3.0]), 2.0);
    }

    #[test]
    fn policy_and_workload_names_parse_or_name_the_problem() {
        assert!(PolicyChoice::parse("tuned").is_ok());
        let err = PolicyChoice::parse("fast").unwrap_err().to_string();
        assert!(err.contains("unknown policy \"fast\""), "{err}");
        assert!(Workload::parse("tpcc").is_err());
    }
}
