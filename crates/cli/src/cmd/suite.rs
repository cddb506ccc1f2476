//! `corehop bench run-suite`: real programs, each run plain and under `corehop run --offload`
//! (the default policy unless told otherwise), alternating, with their outputs compared.
//!
//! This is the check a new user makes: does putting corehop in front of an ordinary program
//! cost anything? The plain run is the same-run baseline; the table gives both wall times
//! (min/median/max over the repetitions), the ratio of the medians and the median of the
//! repetitions' own ratios (each offloaded run over the plain run next to it, which a slow
//! spell of the disk or the host hits alike), whether every run's
//! stdout, stderr and exit status matched an untimed plain run made first, and where the adaptive
//! policy of the offloaded processes settled (from one more run with a summary: the timed runs
//! write none, as a user's would not).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use anyhow::{bail, Context};
use corehop_runtime::sys;
use serde::Serialize;

use super::run::{find_library, program_path, Launch, Offload, PolicyArg};
use corehop_bench::report::{each_once, fmt_ns, Interval, OutputArgs, Stats, Table};

/// Real programs plain and under `corehop run --offload`, alternating, outputs compared.
///
/// Programs (all read-only on the system; each run writes only in an empty directory of its
/// own under $TMPDIR, default /tmp, and all are removed when the suite ends; set TMPDIR to
/// measure on another file system: on a tmpfs, sqlite3's commits reach no disk):
/// sqlite3 (150 durable transactions), tar-czf and tar-xzf (/usr/include/linux), cp-r (the same
/// tree), find-grep (find | xargs grep), git (init, add and commit the tree, with fixed dates so
/// the commit id is the same every run), python (imports and file I/O). Each prints a checksum
/// of what it wrote, so "same output" covers the files too. A program that is not installed is
/// skipped with a note.
///
/// The plain run is the program as a user would start it; the offloaded one is the program as
/// `corehop run --offload --policy POLICY -- PROGRAM` starts it, with its defaults: the same
/// environment, library and CPUs, started from this process. corehop's own start, which typing
/// `corehop run` adds, is measured apart and printed below the table. ×plain is the ratio of
/// the median wall times; the target for the default policy is at most 1.02. Before its timed
/// runs, each program runs once plain, untimed, to warm the page cache. paired is the
/// median over the repetitions of each offloaded run's time over its own plain run's (the two
/// run back to back, so a slow spell of the disk or the host weighs on both): the steadier
/// figure where a program's times swing from one repetition to the next. In brackets after it,
/// where its true value lies with 95 % chance (with at least 6 repetitions; fewer give the
/// range of the ratios, with the chance it holds): the order statistics of a sign test, which
/// assume nothing of how the times spread. An interval that holds 1 says the difference is
/// within this host's noise; add repetitions to narrow it.
///
/// --quick runs 2 repetitions. --plot draws the ratio per program as bars.
///
/// --json prints `{policy, reps, results: [{program, plain: {min, median, max}, offload: {min,
/// median, max}, ratio, paired_ratio, paired_interval: {low, high, coverage} | null,
/// same_output, settled, started_plainly}], skipped: [{program, reason}], load: {median_ns, min_ns} | null,
/// preloads, library_load: {median_ns, min_ns} | null, launcher: {median_ns, min_ns} | null}`
/// (times in ns; `settled` maps each arm an adaptive policy settled on to its
/// number of processes; `started_plainly` counts the processes of the offloaded runs the stub
/// started plainly, or is null without the stub's table; `load` is what preloading adds to one process, from `/bin/true` spawned
/// plain and with offload, alternating; `preloads` says what was preloaded, `stub` (the
/// start-up stub, under the default policy) or `library`; with the stub, `library_load` is what
/// the library itself would add, measured the same way;
/// `launcher` is what starting it through `corehop run --` adds, measured the same way).
#[derive(clap::Args, Clone)]
pub struct Args {
    /// Programs to run (comma-separated): sqlite3, tar-czf, tar-xzf, cp-r, find-grep, git,
    /// python.
    #[arg(long, value_delimiter = ',', default_values = PROGRAMS.map(|p| p.name))]
    pub programs: Vec<String>,
    /// Repetitions of each side [default: 11; 2 with --quick]. On a shared host a program's
    /// times swing by a few per cent from one run to the next: with eleven pairs the paired
    /// ratio's interval lies inside their range (with five it is the range).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub reps: Option<u32>,
    /// The offload policy under test.
    #[arg(long, value_enum, default_value_t = PolicyArg::Adaptive)]
    pub policy: PolicyArg,
    /// Also run each program once more under `--policy never --record-trace` and keep its
    /// trace as DIR/PROGRAM.csv, for `corehop predict --trace` (the directory is created).
    #[arg(long, value_name = "DIR")]
    pub record_traces: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// One program of the suite.
struct Program {
    name: &'static str,
    /// The executables it needs.
    needs: &'static [&'static str],
    /// The shell script that runs it, in an empty directory of its own inside the suite's
    /// (the inputs `prepare` makes are in `..`).
    script: &'static str,
}

const PROGRAMS: [Program; 7] = [
    Program {
        name: "sqlite3",
        needs: &["sqlite3"],
        script: "sqlite3 db.sqlite < ../txns.sql",
    },
    Program {
        name: "tar-czf",
        needs: &["tar", "gzip", "md5sum"],
        script: "tar cf - -C /usr/include linux | gzip -n | md5sum",
    },
    Program {
        name: "tar-xzf",
        needs: &["tar", "gzip", "md5sum"],
        script: "mkdir x && tar xzf ../linux.tgz -C x && find x -type f | LC_ALL=C sort | xargs cat | md5sum",
    },
    Program { name: "cp-r", needs: &["cp"], script: "cp -r /usr/include/linux c && find c -type f | wc -l" },
    Program {
        name: "find-grep",
        needs: &["find", "xargs", "grep", "md5sum"],
        script: "find /usr/include/linux -name '*.h' | LC_ALL=C sort | xargs grep -c define | md5sum",
    },
    Program {
        name: "git",
        needs: &["git"],
        script: "export GIT_DIR=r.git GIT_WORK_TREE=/usr/include/linux \
                 GIT_AUTHOR_DATE='2026-01-01T00:00:00Z' GIT_COMMITTER_DATE='2026-01-01T00:00:00Z' \
                 GIT_CONFIG_NOSYSTEM=1 HOME=. && git init -q && git add -A && \
                 git -c user.name=corehop -c user.email=corehop@localhost commit -qm suite && git rev-parse HEAD",
    },
    Program { name: "python", needs: &["python3"], script: "python3 ../files.py" },
];

const PYTHON: &str = r#"
import csv, decimal, email.message, hashlib, http.client, json, os, xml.etree.ElementTree as ET
out = "py"
os.makedirs(out, exist_ok=True)
digest = hashlib.sha256()
for i in range(300):
    path = os.path.join(out, f"f{i}.json")
    with open(path, "w") as f:
        json.dump({"i": i, "d": str(decimal.Decimal(i) / 7), "xml": ET.tostring(ET.Element("e", n=str(i))).decode()}, f)
for i in range(300):
    with open(os.path.join(out, f"f{i}.json"), "rb") as f:
        digest.update(f.read())
    os.stat(os.path.join(out, f"f{i}.json"))
print(digest.hexdigest())
"#;

#[derive(Serialize)]
struct Side {
    min: f64,
    median: f64,
    max: f64,
}

impl From<Stats> for Side {
    fn from(s: Stats) -> Side {
        Side { min: s.min, median: s.median, max: s.max }
    }
}

#[derive(Serialize)]
struct Result {
    program: &'static str,
    plain: Side,
    offload: Side,
    ratio: f64,
    /// The median of the repetitions' own offload / plain ratios.
    paired_ratio: f64,
    /// Where that median lies, with the chance it does (`None` with one repetition).
    paired_interval: Option<Interval>,
    same_output: bool,
    settled: std::collections::BTreeMap<String, usize>,
    /// Processes of the offloaded runs that the start-up stub started plainly, having seen
    /// their programs end before it could do anything for them (`None`: no stub, or no table).
    started_plainly: Option<u64>,
}

#[derive(Serialize)]
struct Skipped {
    program: String,
    reason: String,
}

#[derive(Serialize)]
struct Report {
    policy: String,
    reps: u32,
    results: Vec<Result>,
    skipped: Vec<Skipped>,
    /// What loading the library adds to one process's start and exit, measured in this run.
    load: Option<Added>,
    /// What `corehop run --offload` preloads for this policy: `stub` (the start-up stub, which
    /// loads the library in a process that outlives its first epoch) or `library`.
    preloads: &'static str,
    /// With the stub: what preloading the library itself adds, measured the same way in this
    /// run (what the stub saves short processes).
    library_load: Option<Added>,
    /// What starting a program through the `corehop` command adds to a run (not in the table).
    launcher: Option<Added>,
}

/// What one way of starting `/bin/true` adds to another (the library, the `corehop` command),
/// from [`LOAD_SPAWNS`] alternating spawns of each.
#[derive(Serialize)]
struct Added {
    /// Median of the spawns with it minus median of those without, ns.
    median_ns: f64,
    /// Fastest minus fastest, ns.
    min_ns: f64,
}

/// Spawns per side of each added cost.
const LOAD_SPAWNS: usize = 60;

/// Times `/bin/true` plain and under `offload`, alternating: the cost of loading the library
/// that every process a program starts pays, whatever the policy decides.
fn load_floor(offload: &Offload) -> anyhow::Result<Option<Added>> {
    let with_library =
        |command| Launch { command, cpus: None, offload: Some(offload.clone()), capture: true };
    added_cost(|command| Launch { offload: None, ..with_library(command) }, with_library)
}

/// Times `/bin/true` started directly and through `corehop run --`, alternating: corehop's own
/// start (its process image, its parsing, the `exec`), which the table leaves out.
fn launcher_cost() -> anyhow::Result<Option<Added>> {
    let corehop = std::env::current_exe().context("finding the corehop binary")?;
    let direct = |command| Launch { command, cpus: None, offload: None, capture: true };
    let via_corehop = |command: Vec<OsString>| {
        direct([vec![corehop.clone().into_os_string(), "run".into(), "--".into()], command].concat())
    };
    added_cost(direct, via_corehop)
}

/// What starting `/bin/true` as `with` adds to starting it as `base`, over [`LOAD_SPAWNS`]
/// alternating spawns each (`None` without `/bin/true`).
fn added_cost(
    base: impl Fn(Vec<OsString>) -> Launch,
    with: impl Fn(Vec<OsString>) -> Launch,
) -> anyhow::Result<Option<Added>> {
    let program = Path::new("/bin/true");
    if !program.is_file() {
        return Ok(None);
    }
    let command = vec![OsString::from(program)];
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for rep in 0..2 * LOAD_SPAWNS {
        let side = rep % 2;
        let launch = if side == 0 { base(command.clone()) } else { with(command.clone()) };
        let finished = launch.run().context("timing /bin/true")?;
        anyhow::ensure!(finished.status.success(), "/bin/true failed: {}", finished.status);
        times[side].push(finished.wall_ns as f64);
    }
    let base = Stats::of(&times[0]).context("no spawn")?;
    let with = Stats::of(&times[1]).context("no spawn")?;
    Ok(Some(Added { median_ns: with.median - base.median, min_ns: with.min - base.min }))
}

/// Runs of one program whose outputs stay on disk at once; past that, the oldest is removed
/// before the next run (about 20 MB a run of git, cp-r and tar-xzf together).
const KEPT_RUNS: usize = 64;

/// A fresh, empty directory for each run of a program, each in a block group of its own (the
/// suite's directory is marked as the top of a hierarchy). ext4 without a journal (as on this
/// project's dev VM) skips, when it allocates an inode, every inode of the group freed in the
/// last minutes: with a `rm -rf` of the last run's repository first, `git` ran 3-4 times
/// slower, and its time grew with the runs (and anything else deleted) before it
/// (docs/performance.md, forty-first session). What a run wrote is removed when the suite
/// ends.
struct RunDirs {
    root: std::path::PathBuf,
    program: &'static Program,
    made: usize,
    kept: VecDeque<std::path::PathBuf>,
}

impl RunDirs {
    fn new(root: &Path, program: &'static Program) -> RunDirs {
        RunDirs { root: root.to_path_buf(), program, made: 0, kept: VecDeque::new() }
    }

    /// The command that runs the program in a fresh directory.
    fn command(&mut self) -> anyhow::Result<Vec<OsString>> {
        if self.kept.len() >= KEPT_RUNS {
            if let Some(oldest) = self.kept.pop_front() {
                std::fs::remove_dir_all(&oldest).with_context(|| format!("removing {}", oldest.display()))?;
            }
        }
        let dir = self.root.join(format!("{}-{}", self.program.name, self.made));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        self.made += 1;
        // Quoted for sh: $TMPDIR may hold any byte, a `'` too.
        let mut script = b"cd '".to_vec();
        for &byte in dir.as_os_str().as_bytes() {
            match byte {
                b'\'' => script.extend_from_slice(br"'\''"),
                _ => script.push(byte),
            }
        }
        script.extend_from_slice(b"' && ");
        script.extend_from_slice(self.program.script.as_bytes());
        self.kept.push_back(dir);
        Ok(vec!["sh".into(), "-c".into(), OsString::from_vec(script)])
    }
}

/// The inputs the programs read: the SQLite script, the tarball, the Python script.
fn prepare(dir: &Path) -> anyhow::Result<()> {
    let mut sql = String::from("PRAGMA journal_mode=DELETE;\nPRAGMA synchronous=FULL;\n");
    sql.push_str("CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER, s TEXT);\n");
    for i in 0..150 {
        sql.push_str(&format!(
            "BEGIN;\nINSERT INTO t(v, s) VALUES ({i}, printf('%0200d', {i}));\nUPDATE t SET v = v + 1 WHERE id % 7 = {};\nCOMMIT;\n",
            i % 7
        ));
    }
    sql.push_str("SELECT count(*), sum(v) FROM t;\n");
    std::fs::write(dir.join("txns.sql"), sql)?;
    std::fs::write(dir.join("files.py"), PYTHON)?;
    if program_path("tar".as_ref()).is_some() && program_path("gzip".as_ref()).is_some() {
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg("tar cf - -C /usr/include linux | gzip -n > linux.tgz")
            .current_dir(dir)
            .status()
            .context("making the tarball for tar-xzf")?;
        anyhow::ensure!(status.success(), "making the tarball for tar-xzf failed");
    }
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let reps = args.reps.unwrap_or(if args.output.quick { 2 } else { 11 });
    let mut chosen = Vec::new();
    for name in each_once(args.programs.iter().map(|n| n.trim())) {
        match PROGRAMS.iter().find(|p| p.name == name) {
            Some(p) => chosen.push(p),
            None => bail!(
                "unknown program {:?} in --programs (expected some of: {})",
                corehop_topology::excerpt(name, corehop_topology::VALUE_CHARS),
                PROGRAMS.map(|p| p.name).join(", ")
            ),
        }
    }
    if !Path::new("/usr/include/linux").is_dir() {
        bail!("the suite reads /usr/include/linux, which this machine lacks (Debian: linux-libc-dev)");
    }
    let library = find_library()?;
    if let Some(traces) = &args.record_traces {
        std::fs::create_dir_all(traces).with_context(|| format!("creating {}", traces.display()))?;
    }
    let allowed = super::run::kernel_numbers(sys::affinity().context("reading this process's CPU affinity")?);
    let service = *allowed.last().context("this process may run on no CPU")?;
    let policy = args.policy.spec(None)?;
    let tmp = tempfile::Builder::new().prefix("corehop-suite-").tempdir()?;
    let dir = tmp.path();
    // Best effort: elsewhere than ext4 there is nothing to spread (see `RunDirs`).
    let _ = std::fs::File::open(dir).and_then(|d| sys::mark_top_directory(&d));
    prepare(dir)?;
    let mut report = Report {
        policy: policy.clone(),
        reps,
        results: Vec::new(),
        skipped: Vec::new(),
        load: None,
        preloads: "library",
        library_load: None,
        launcher: None,
    };
    let runnable: Vec<&Program> = chosen
        .into_iter()
        .filter(|p| match p.needs.iter().find(|n| program_path(n.as_ref()).is_none()) {
            Some(missing) => {
                report
                    .skipped
                    .push(Skipped { program: p.name.into(), reason: format!("{missing} is not installed") });
                false
            }
            None => true,
        })
        .collect();
    // What `corehop run --offload` does by default for this policy.
    let offload = Offload {
        library,
        service_cpus: vec![service],
        policy: policy.clone(),
        stall_timeout_ns: super::run::DEFAULT_STALL_TIMEOUT_US * 1_000,
        spin_ns: super::run::DEFAULT_SPIN_US * 1_000,
        stats_file: None,
        trace_file: None,
    };
    let bar = corehop_bench::report::progress(runnable.len() as u64 * u64::from(reps) * 2, "runs");
    for program in runnable {
        let mut dirs = RunDirs::new(dir, program);
        let cpus = args.policy.program_cpus(&allowed, &[service]);
        let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let mut settled = std::collections::BTreeMap::new();
        // An untimed plain run first: it fills the page cache with what the program reads, which
        // the first timed run would otherwise pay alone, and its output is the reference.
        let warm_up = Launch { command: dirs.command()?, cpus: None, offload: None, capture: true };
        let finished = warm_up.run().with_context(|| format!("running {}", program.name))?;
        let reference = (finished.status, finished.output.unwrap_or_default());
        let (status, (_, stderr)) = &reference;
        if !status.success() {
            bail!(
                "{} failed when run plain ({status}), so there is nothing to compare: {}",
                program.name,
                String::from_utf8_lossy(stderr).trim()
            );
        }
        let mut same = true;
        let table_before = offload.stub().and_then(|_| super::run::read_lifetimes());
        for rep in 0..reps {
            // Alternate which side goes first, so drifts hit both alike.
            let order = if rep % 2 == 0 { [false, true] } else { [true, false] };
            for with_offload in order {
                // Timed as a user runs it: no summary file (its write at each process's exit
                // is not the library's cost); one more run below says where the policy settled.
                let launch = Launch {
                    command: dirs.command()?,
                    cpus: if with_offload { cpus.clone() } else { None },
                    offload: with_offload.then(|| offload.clone()),
                    capture: true,
                };
                let finished = launch.run().with_context(|| format!("running {}", program.name))?;
                times[usize::from(with_offload)].push(finished.wall_ns as f64);
                same &= reference == (finished.status, finished.output.unwrap_or_default());
                bar.inc(1);
            }
        }
        let started_plainly = table_before.zip(super::run::read_lifetimes()).map(|(before, after)| {
            before.iter().zip(&after).map(|(&b, &a)| corehop_sys::lifetimes::plain_starts_between(b, a)).sum()
        });
        let launch = Launch {
            command: dirs.command()?,
            cpus: cpus.clone(),
            offload: Some(Offload { stats_file: Some(super::run::stats_path()), ..offload.clone() }),
            capture: true,
        };
        let finished = launch.run().with_context(|| format!("running {} for its summary", program.name))?;
        for (arm, s) in finished.summary.into_iter().flat_map(|summary| summary.settled) {
            *settled.entry(arm).or_insert(0) += s.processes;
        }
        if let Some(traces) = &args.record_traces {
            let trace = std::path::absolute(traces.join(format!("{}.csv", program.name)))?;
            std::fs::write(&trace, super::run::TRACE_HEADER)
                .with_context(|| format!("creating {}", trace.display()))?;
            let launch = Launch {
                command: dirs.command()?,
                cpus: None,
                offload: Some(Offload { policy: "never".into(), trace_file: Some(trace), ..offload.clone() }),
                capture: true,
            };
            launch.run().with_context(|| format!("recording a trace of {}", program.name))?;
        }
        let paired = corehop_bench::report::paired_median(&times[1], &times[0]).context("no repetition")?;
        let paired_interval = corehop_bench::report::paired_interval(&times[1], &times[0]);
        let plain = Stats::of(&times[0]).context("no plain run")?;
        let offloaded = Stats::of(&times[1]).context("no offloaded run")?;
        report.results.push(Result {
            program: program.name,
            ratio: offloaded.median / plain.median,
            paired_ratio: paired,
            paired_interval,
            plain: plain.into(),
            offload: offloaded.into(),
            same_output: same,
            settled,
            started_plainly,
        });
    }
    report.load = load_floor(&offload)?;
    if offload.stub().is_some() {
        report.preloads = "stub";
        // `never` preloads the library itself and moves nothing: its load alone.
        report.library_load = load_floor(&Offload { policy: "never".into(), ..offload.clone() })?;
    }
    report.launcher = launcher_cost()?;
    bar.finish_and_clear();
    print(&report, &args.output, service)?;
    if report.results.iter().any(|r| !r.same_output) {
        bail!("a program's output under offload differed from its plain run (see the table)");
    }
    Ok(())
}

fn print(report: &Report, output: &OutputArgs, service: usize) -> anyhow::Result<()> {
    if output.json {
        corehop_bench::report::print_json(report)?;
    } else {
        let mut table = Table::new([
            "program",
            "plain (min/med/max)",
            "offload (min/med/max)",
            "×plain",
            "paired (interval)",
            "same output",
            "settled on",
            "plain starts",
        ])
        .title(format!(
            "corehop bench run-suite: plain vs offload --policy {}, {} runs each",
            report.policy, report.reps
        ));
        let span = |s: &Side| format!("{} / {} / {}", fmt_ns(s.min), fmt_ns(s.median), fmt_ns(s.max));
        for r in &report.results {
            let settled: Vec<String> = r.settled.iter().map(|(arm, n)| format!("{arm} ×{n}")).collect();
            table.row([
                r.program.to_string(),
                span(&r.plain),
                span(&r.offload),
                format!("{:.3}", r.ratio),
                match r.paired_interval {
                    Some(i) => format!("{:.3} ({})", r.paired_ratio, i.range(2)),
                    None => format!("{:.3}", r.paired_ratio),
                },
                if r.same_output { "yes" } else { "NO" }.to_string(),
                if settled.is_empty() { "-".to_string() } else { settled.join(", ") },
                r.started_plainly
                    .map_or("-".to_string(), |n| format!("{:.1}", n as f64 / f64::from(report.reps))),
            ]);
        }
        let chance = match report.results.iter().find_map(|r| r.paired_interval) {
            Some(i) if i.coverage >= 0.95 => i.chance(),
            Some(i) => format!("{} (6 repetitions or more give 95 %)", i.chance()),
            None => "(one repetition gives no interval)".to_string(),
        };
        table.note(format!(
            "same run, alternating (the side that goes first alternates too), after an untimed plain run of each \
             program, each run in a fresh directory; service CPU {service}; ×plain = offload \
             median / plain median; paired = median over the repetitions of offload / plain, each pair run back to \
             back, and in brackets where its true value lies, {chance} (distribution-free: the order statistics \
             of a sign test); same output = stdout, stderr and exit status of every run equal to the untimed \
             plain run's (each program prints a checksum of the files it wrote); settled on = the arms the \
             adaptive policy's processes ended in, in one more run with a summary (where every process loads the \
             library at its start); plain starts = processes an offloaded run started as they start plainly, \
             without the stub (a run's mean): their programs had ended before the stub's 40 ms, starting \
             nothing, in the runs before (corehop run's table of lifetimes)"
        ));
        if let Some(load) = &report.load {
            let what = match report.preloads {
                "stub" => "the start-up stub (which loads the library in a process that outlives 40 ms)",
                _ => "the library",
            };
            let library = report.library_load.as_ref().map_or(String::new(), |l| {
                format!(
                    "; the library itself, preloaded the same way, {} ({})",
                    fmt_ns(l.median_ns),
                    fmt_ns(l.min_ns)
                )
            });
            table.note(format!(
                "preloading {what} adds {} to each process a program starts (median; {} fastest against \
                 fastest; /bin/true, {LOAD_SPAWNS} alternating spawns a side, this run), whatever the policy \
                 decides{library}",
                fmt_ns(load.median_ns),
                fmt_ns(load.min_ns)
            ));
        }
        if let Some(launcher) = &report.launcher {
            table.note(format!(
                "each program here starts as `corehop run` starts it, from this process; typing `corehop run` \
                 adds corehop's own start to that, {} a run (median; {} fastest against fastest; /bin/true \
                 direct and through `corehop run --`, {LOAD_SPAWNS} alternating spawns a side, this run)",
                fmt_ns(launcher.median_ns),
                fmt_ns(launcher.min_ns)
            ));
        }
        for s in &report.skipped {
            table.note(format!("skipped {}: {}", s.program, s.reason));
        }
        print!("{}", table.render());
    }
    if let Some(path) = &output.plot {
        let bars: Vec<(String, f64)> =
            report.results.iter().map(|r| (r.program.to_string(), r.ratio)).collect();
        corehop_bench::report::plot_bars(path, "offload / plain median wall time", "ratio", &bars)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    static PWD: Program = Program { name: "pwd", needs: &[], script: "pwd" };

    #[test]
    fn each_run_starts_in_a_fresh_directory_whatever_the_name_of_its_parent() {
        let parent = tempfile::tempdir().unwrap();
        let root = parent.path().join("it's a \"dir\" $HOME");
        std::fs::create_dir(&root).unwrap();
        let mut dirs = RunDirs::new(&root, &PWD);
        for run in 0..2 {
            let command = dirs.command().unwrap();
            let out = std::process::Command::new(&command[0]).args(&command[1..]).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let expected = root.join(format!("pwd-{run}"));
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), expected.to_str().unwrap());
            assert_eq!(std::fs::read_dir(&expected).unwrap().count(), 0, "not empty");
        }
    }
}
