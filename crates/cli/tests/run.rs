//! `corehop run` on real programs: every program must give the same stdout, stderr, exit
//! status and output files with `--offload --policy always` (every intercepted call that may go
//! across does) as without the library, and the summary must show the calls really went across.
//!
//! The preload library is built here first (`cargo build -p corehop-preload`, same profile).
//! Tests that need a tool this machine lacks (cc, sqlite3, python3) say so and skip.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/run");

fn corehop() -> Command {
    common::offload_command()
}

use common::{have, text};

/// The outcome of one program run twice: without the library, and with it.
struct Pair {
    plain: Output,
    offload: Output,
    summary: Value,
}

impl Pair {
    fn assert_same(&self) {
        assert_eq!(text(&self.plain.stdout), text(&self.offload.stdout), "stdout differs");
        assert_eq!(text(&self.plain.stderr), text(&self.offload.stderr), "stderr differs");
        assert_eq!(self.plain.status.code(), self.offload.status.code(), "exit status differs");
    }

    fn calls(&self, name: &str, field: &str) -> u64 {
        self.summary["calls"][name][field].as_u64().unwrap_or(0)
    }

    fn total(&self, field: &str) -> u64 {
        self.summary["calls"]
            .as_object()
            .map_or(0, |calls| calls.values().map(|c| c[field].as_u64().unwrap_or(0)).sum())
    }
}

/// Runs `argv` in `plain_dir` and again in `offload_dir` (each its working directory) with
/// `--offload --policy always`.
fn run_pair(argv: &[&str], plain_dir: &Path, offload_dir: &Path) -> Pair {
    run_pair_with("always", argv, plain_dir, offload_dir, &[], &[])
}

/// [`run_pair`] with another policy, and `extra` flags and environment for the offload run.
fn run_pair_with(
    policy: &str,
    argv: &[&str],
    plain_dir: &Path,
    offload_dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Pair {
    let plain =
        corehop().arg("run").arg("--").args(argv).current_dir(plain_dir).output().expect("corehop run");
    let json = offload_dir.join("../summary.json");
    let offload = corehop()
        .args(["run", "--offload", "--policy", policy, "--stats-json"])
        .arg(&json)
        .args(extra)
        .arg("--")
        .args(argv)
        .envs(env.iter().copied())
        .current_dir(offload_dir)
        .output()
        .expect("corehop run --offload");
    let summary = std::fs::read_to_string(&json)
        .map_or(Value::Null, |s| serde_json::from_str(&s).expect("summary JSON"));
    Pair { plain, offload, summary }
}

/// Two fresh working directories, `plain/` and `offload/`, under one temporary directory.
fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let root = tempfile::tempdir().expect("tempdir");
    let plain = root.path().join("plain");
    let offload = root.path().join("offload");
    std::fs::create_dir(&plain).unwrap();
    std::fs::create_dir(&offload).unwrap();
    (root, plain, offload)
}

/// Writes the same input file into both directories.
fn input(plain: &Path, offload: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(plain.join(name), bytes).unwrap();
    std::fs::write(offload.join(name), bytes).unwrap();
}

/// Asserts that `out` contains every line of `expected`.
fn assert_prints(out: &str, expected: &[&str]) {
    for line in expected {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
}

fn assert_same_file(plain: &Path, offload: &Path, name: &str) {
    let a = std::fs::read(plain.join(name)).unwrap_or_else(|e| panic!("{name} (plain): {e}"));
    let b = std::fs::read(offload.join(name)).unwrap_or_else(|e| panic!("{name} (offload): {e}"));
    assert!(a == b, "{name} differs: {} vs {} bytes", a.len(), b.len());
}

fn lines(n: usize) -> Vec<u8> {
    let mut x: u64 = 88172645463325252;
    (0..n)
        .flat_map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{:x} row {i}\n", x % 1_000_000_007).into_bytes()
        })
        .collect()
}

#[test]
fn coreutils_give_identical_results_and_files() {
    let (_root, plain, offload) = dirs();
    input(&plain, &offload, "in.txt", &lines(60_000));
    let programs: [&[&str]; 7] = [
        &["cat", "in.txt", "missing.txt"],
        &["cp", "in.txt", "copy.txt"],
        &["sort", "-o", "sorted.txt", "in.txt"],
        &["wc", "in.txt", "missing.txt"],
        &["dd", "if=in.txt", "of=dd.txt", "bs=7000", "status=none"],
        // Short reads: a pipe hands dd at most what was written so far.
        &["sh", "-c", "cat in.txt | dd of=pipe.txt bs=1M status=none && wc -c < pipe.txt"],
        &["sh", "-c", "dd if=in.txt bs=4096 skip=3 count=20 status=none | md5sum"],
    ];
    for argv in programs {
        let pair = run_pair(argv, &plain, &offload);
        pair.assert_same();
        assert!(pair.total("offloaded") > 0, "{argv:?}: nothing went across: {}", pair.summary);
    }
    for name in ["copy.txt", "sorted.txt", "dd.txt", "pipe.txt"] {
        assert_same_file(&plain, &offload, name);
    }
}

/// Builds `fixtures/run/calls.c` into `dir`.
fn call_exerciser(dir: &Path) -> PathBuf {
    compile("calls.c", &["-pthread"], &dir.join("calls"))
}

/// Compiles `fixtures/run/SOURCE` with `flags` into `out`.
fn compile(source: &str, flags: &[&str], out: &Path) -> PathBuf {
    try_compile(source, flags, out).unwrap_or_else(|stderr| panic!("cc failed: {stderr}"))
}

/// [`compile`], or what `cc` said when it failed.
fn try_compile(source: &str, flags: &[&str], out: &Path) -> Result<PathBuf, String> {
    let built = Command::new("cc")
        .arg("-O1")
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(Path::new(FIXTURES).join(source))
        .output()
        .expect("cc");
    if built.status.success() {
        Ok(out.to_path_buf())
    } else {
        Err(text(&built.stderr))
    }
}

#[test]
fn the_call_exerciser_sees_identical_results_and_errno() {
    if !have("cc") {
        return;
    }
    let (root, plain, offload) = dirs();
    let exe = call_exerciser(root.path());
    let exe = exe.to_str().unwrap();
    let pair = run_pair(&[exe, "."], &plain, &offload);
    pair.assert_same();
    // The cases the equivalence must include (the output is compared line by line above).
    assert_prints(
        &text(&pair.offload.stdout),
        &[
            "read 1M (short)                    ret=20003",
            "read at EOF                        ret=0",
            "read -1                            ret=-1 errno=EBADF",
            "open missing                       ret=-1 errno=ENOENT",
            "open bad pointer                   ret=-1 errno=EFAULT",
            "read empty pipe, alarm             ret=-1 errno=EINTR",
            "write closed nonblocking pipe      ret=-1 errno=EPIPE",
            "sigpipes 1",
            "tmpfile mode 604",
            "comm calls",
            "child size 5000",
            "done",
        ],
    );
    for name in ["data", "copy", "new", "child", "thread-0", "thread-3"] {
        assert_same_file(&plain, &offload, name);
    }
    // Every kind of call went across at least once; the blocking ones stayed.
    for call in [
        "read", "write", "pread64", "pwrite64", "readv", "writev", "open", "openat", "stat", "fstat", "lstat",
    ] {
        assert!(pair.calls(call, "offloaded") > 0, "{call} never went across: {}", pair.summary);
    }
    for call in
        ["newfstatat", "statx", "fsync", "fdatasync", "sendfile", "sendto", "recvfrom", "poll", "select"]
    {
        assert!(pair.calls(call, "offloaded") > 0, "{call} never went across: {}", pair.summary);
    }
    assert!(pair.calls("read", "kept") >= 2, "pipe reads must stay with their thread: {}", pair.summary);
    assert!(pair.calls("open", "kept") >= 1, "/proc/thread-self must stay: {}", pair.summary);
    assert!(pair.summary["processes"].as_u64() >= Some(2), "the forked child reports too: {}", pair.summary);
}

#[test]
fn sqlite3_gives_identical_results_and_database() {
    if !have("sqlite3") {
        return;
    }
    let (_root, plain, offload) = dirs();
    let script = "PRAGMA journal_mode=DELETE; PRAGMA synchronous=FULL;\n\
        CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, v REAL);\n\
        WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 3000)\n\
        INSERT INTO t(name, v) SELECT printf('name-%05d', i), i * 0.5 FROM n;\n\
        BEGIN; UPDATE t SET v = v * 2 WHERE id % 7 = 0; COMMIT;\n\
        CREATE INDEX t_name ON t(name);\n\
        SELECT count(*), sum(v), min(name), max(name) FROM t;\n\
        SELECT * FROM missing_table;\n";
    input(&plain, &offload, "script.sql", script.as_bytes());
    let pair = run_pair(
        &["sh", "-c", "sqlite3 db.sqlite < script.sql; sqlite3 db.sqlite .dump | md5sum"],
        &plain,
        &offload,
    );
    pair.assert_same();
    assert!(text(&pair.plain.stderr).contains("missing_table"), "the error case ran");
    assert!(pair.calls("pwrite64", "offloaded") + pair.calls("write", "offloaded") > 0, "{}", pair.summary);
    assert!(pair.calls("fsync", "offloaded") + pair.calls("fdatasync", "offloaded") > 0, "{}", pair.summary);
    assert_same_file(&plain, &offload, "db.sqlite");
}

#[test]
fn a_python_script_gives_identical_output_and_errors() {
    if !have("python3") {
        return;
    }
    let (_root, plain, offload) = dirs();
    let script = Path::new(FIXTURES).join("fileio.py");
    let script = script.to_str().unwrap();
    let pair = run_pair(&["python3", script, "."], &plain, &offload);
    pair.assert_same();
    assert_prints(
        &text(&pair.offload.stdout),
        &[
            "read closed fd: OSError EBADF",
            "open missing: FileNotFoundError ENOENT",
            "read at EOF: b''",
            "done",
        ],
    );
    assert!(pair.calls("read", "offloaded") > 0 && pair.calls("write", "offloaded") > 0, "{}", pair.summary);
    for name in ["text.txt", "bin.dat"] {
        assert_same_file(&plain, &offload, name);
    }
}

#[test]
fn fork_and_exec_carry_the_library_to_every_process() {
    let (_root, plain, offload) = dirs();
    input(&plain, &offload, "x.txt", &lines(20_000));
    let pair =
        run_pair(&["sh", "-c", "cat x.txt | wc -l; cat x.txt x.txt > y.txt; wc -c y.txt"], &plain, &offload);
    pair.assert_same();
    assert!(
        pair.summary["processes"].as_u64() >= Some(3),
        "sh, cat, wc and cat each report: {}",
        pair.summary
    );
    assert_same_file(&plain, &offload, "y.txt");
}

#[test]
fn a_stalled_service_thread_falls_back_to_local_calls_with_identical_results() {
    let (_root, plain, offload) = dirs();
    input(&plain, &offload, "in.txt", &lines(30_000));
    // Test-only knob: the service thread sleeps 3 ms before taking each batch, while callers
    // give up after 1 ms; some calls are withdrawn and run locally, some are taken late.
    let pair = run_pair_with(
        "always",
        &["dd", "if=in.txt", "of=out.txt", "bs=2048", "status=none"],
        &plain,
        &offload,
        &["--stall-timeout-us", "1000"],
        &[("COREHOP_TEST_SERVICE_STALL_NS", "3000000")],
    );
    pair.assert_same();
    assert_same_file(&plain, &offload, "out.txt");
    assert!(pair.total("withdrawn") > 0, "no call fell back: {}", pair.summary);
    let seen = pair.total("seen");
    let accounted =
        ["offloaded", "local", "kept", "withdrawn", "busy"].iter().map(|f| pair.total(f)).sum::<u64>();
    assert_eq!(seen, accounted, "every call ran exactly once: {}", pair.summary);
}

#[test]
fn calls_that_pass_the_library_by_give_identical_results() {
    // Without a summary to write, a call goes straight to libc while the policy keeps
    // everything local (all of them under `never`; all but the few `adaptive` times).
    if !have("cc") {
        return;
    }
    for policy in ["never", "adaptive"] {
        let (root, plain, offload) = dirs();
        let exe = call_exerciser(root.path());
        let run = |dir: &Path, offload: bool| {
            let mut command = corehop();
            command.arg("run");
            if offload {
                command.args(["--offload", "--policy", policy]);
            }
            command.arg("--").arg(&exe).arg(".").current_dir(dir).output().expect("corehop run")
        };
        let (a, b) = (run(&plain, false), run(&offload, true));
        assert_eq!(text(&a.stdout), text(&b.stdout), "{policy}: stdout differs");
        assert_eq!(text(&a.stderr), text(&b.stderr), "{policy}: stderr differs");
        assert_eq!(a.status.code(), b.status.code(), "{policy}: exit status differs");
        assert!(text(&b.stdout).contains("done"), "{policy}: {}", text(&b.stdout));
        for name in ["data", "copy", "new", "child", "thread-0", "thread-3"] {
            assert_same_file(&plain, &offload, name);
        }
    }
}

#[test]
fn a_program_that_waits_on_a_pipe_starts_no_service_thread() {
    // Waiting for a writer is no kernel work a move could take off the reader's CPU: the
    // waits must not fund the measured policy's probes (the first of which starts a service
    // thread), and the pipe's reads are never moved.
    if !have("python3") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let writer = dir.path().join("writer.py");
    // One byte at a time, so that every read of the reader waits.
    let lines = "import sys, time\nfor i in range(400):\n    time.sleep(0.003)\n    sys.stdout.write('x')\n    sys.stdout.flush()\n";
    std::fs::write(&writer, lines).unwrap();
    let reader = dir.path().join("reader.py");
    std::fs::write(&reader, "import os\nn = 0\nwhile os.read(0, 1):\n    n += 1\nprint(n)\n").unwrap();
    // The interpreter itself, not a version manager's shell shim in front of it.
    let python = Command::new("python3").args(["-c", "import sys; print(sys.executable)"]).output().unwrap();
    let python = text(&python.stdout).trim().to_string();
    let stats = dir.path().join("stats.txt");
    let script = format!("{python} {} | {python} {}", writer.display(), reader.display());
    // The library by hand: `corehop run` offers the adaptive policy, whose trials of other
    // arms are another matter; this is the measured policy's probe budget alone.
    let out = Command::new("sh")
        .args(["-c", &script])
        .env("LD_PRELOAD", common::library())
        .env("COREHOP_POLICY", "measured")
        .env("COREHOP_STATS_FILE", &stats)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "400");
    let lines = std::fs::read_to_string(&stats).unwrap();
    assert!(lines.lines().count() >= 2, "{lines}");
    for line in lines.lines() {
        assert!(line.contains(" polled_ns=0 "), "a service thread ran: {line}");
    }
}

#[test]
fn calls_the_service_would_refuse_start_no_service_thread() {
    // Reads and writes of character devices must stay with their caller. Even under `always`,
    // they must not start a service thread only to be refused by it: a second thread makes
    // glibc toggle cancellation around every later call of the process.
    if !have("dd") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats.txt");
    let out = Command::new("dd")
        .args(["if=/dev/zero", "of=/dev/null", "bs=1", "count=2000", "status=none"])
        .env("LD_PRELOAD", common::library())
        .env("COREHOP_POLICY", "always")
        .env("COREHOP_STATS_FILE", &stats)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = std::fs::read_to_string(&stats).unwrap();
    assert!(line.contains(" polled_ns=0 "), "a service thread ran: {line}");
    for call in ["read", "write"] {
        let counts = line.split(' ').find_map(|field| field.strip_prefix(&format!("{call}="))).unwrap_or("");
        assert!(counts.starts_with("2000:0:0:2000:"), "{call}s must all be kept: {line}");
    }
}

#[test]
fn every_policy_gives_identical_results() {
    let (_root, plain, offload) = dirs();
    input(&plain, &offload, "in.txt", &lines(30_000));
    for policy in ["never", "size", "predicted"] {
        let pair = run_pair_with(policy, &["cat", "in.txt"], &plain, &offload, &[], &[]);
        pair.assert_same();
        assert!(pair.total("seen") > 0, "{policy}: the library saw nothing: {}", pair.summary);
        if policy == "never" {
            assert_eq!(pair.total("offloaded"), 0, "never moves nothing: {}", pair.summary);
        }
    }
}

#[test]
fn exit_status_and_signals_are_passed_on() {
    for offload in [false, true] {
        let flags: &[&str] = if offload { &["--offload"] } else { &[] };
        let status = corehop().arg("run").args(flags).args(["--", "sh", "-c", "exit 7"]).status().unwrap();
        assert_eq!(status.code(), Some(7));
        let status =
            corehop().arg("run").args(flags).args(["--", "sh", "-c", "kill -TERM $$"]).status().unwrap();
        // Killed by a signal: corehop is killed by the same one (a shell then says 128 + 15).
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(15));
    }
}

#[test]
fn the_program_finds_its_own_path_in_underscore_as_from_a_shell() {
    // A shell puts the path of the program it starts in `_`: started from one, corehop holds
    // its own there, and the program must see its own, as it would if the shell started it.
    let path = std::env::var_os("PATH").unwrap();
    let printenv = std::env::split_paths(&path).map(|d| d.join("printenv")).find(|p| p.is_file()).unwrap();
    for offload in [false, true] {
        let flags: &[&str] = if offload { &["--offload"] } else { &[] };
        let run = |program: &str, underscore: Option<&str>| {
            let mut command = corehop();
            command.arg("run").args(flags).args(["--", program, "_"]);
            match underscore {
                Some(value) => command.env("_", value),
                None => command.env_remove("_"),
            };
            command.output().unwrap()
        };
        let out = run("printenv", Some("/usr/local/bin/corehop"));
        assert!(out.status.success());
        assert_eq!(text(&out.stdout).trim_end(), printenv.to_str().unwrap());
        let by_path = printenv.to_str().unwrap();
        assert_eq!(text(&run(by_path, Some("/x/corehop")).stdout).trim_end(), by_path);
        // Not started from a shell: no `_` to put right, and none is made up.
        let out = run("printenv", None);
        assert_eq!((out.status.code(), text(&out.stdout)), (Some(1), String::new()));
    }
}

#[test]
fn the_program_starts_with_the_signals_ignored_and_blocked_that_corehop_started_with() {
    // A shell that ignores SIGPIPE and SIGHUP (`trap '' PIPE HUP`, `nohup`) and a parent that
    // blocks SIGUSR1 pass that on to the program they start; so must corehop, although Rust's
    // runtime ignores SIGPIPE itself and `Command` resets both. With SIGPIPE ignored, `yes |
    // head -1` has `yes` report EPIPE and exit 1; under corehop it used to die by the signal.
    if !have("python3") {
        return;
    }
    let launcher = "import os, signal, sys; \
        signal.signal(signal.SIGPIPE, signal.SIG_IGN); signal.signal(signal.SIGHUP, signal.SIG_IGN); \
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1}); os.execvp(sys.argv[1], sys.argv[1:])";
    let status_lines = |prefix: &[&str]| {
        let mut command = Command::new("python3");
        command.args(["-c", launcher]).args(prefix).args([
            "grep",
            "-E",
            "^Sig(Blk|Ign)",
            "/proc/self/status",
        ]);
        text(&command.output().unwrap().stdout)
    };
    common::library();
    let plain = status_lines(&[]);
    assert_eq!(plain.lines().count(), 2, "{plain}");
    let exe = env!("CARGO_BIN_EXE_corehop");
    for flags in [&[][..], &["--offload"], &["--offload", "--stats"]] {
        let prefix: Vec<&str> = [&[exe, "run"][..], flags, &["--"]].concat();
        assert_eq!(status_lines(&prefix), plain, "corehop run {flags:?}");
    }
}

#[test]
fn the_program_starts_with_the_standard_descriptors_closed_that_corehop_started_with() {
    // Rust's runtime opens /dev/null on a closed descriptor 0, 1 or 2 before `main`: `cat <&-`
    // then read nothing and succeeded where the plain run fails with EBADF.
    let exe = env!("CARGO_BIN_EXE_corehop");
    common::library();
    let closed = |close: &str, prefix: &[&str], program: &[&str]| {
        let script = format!("exec {close}; exec \"$@\"");
        let out = Command::new("sh").args(["-c", &script, "sh"]).args(prefix).args(program).output().unwrap();
        (out.status.code(), text(&out.stderr))
    };
    for (close, program) in
        [("0<&-", &["cat"][..]), ("1>&-", &["ls", "/"]), ("0<&- 1>&-", &["ls", "/proc/self/fd"])]
    {
        let plain = closed(close, &[], program);
        assert_ne!(plain.0, Some(0), "{close} {program:?}: the plain run fails");
        for flags in [&[][..], &["--offload"], &["--offload", "--stats"]] {
            let prefix: Vec<&str> = [&[exe, "run"][..], flags, &["--"]].concat();
            let (code, stderr) = closed(close, &prefix, program);
            assert_eq!(code, plain.0, "{close} corehop run {flags:?} {program:?}: {stderr}");
            if flags.len() < 2 {
                assert_eq!(stderr, plain.1, "{close} corehop run {flags:?} {program:?}");
            }
        }
    }
}

#[test]
fn a_script_without_an_interpreter_line_runs_as_from_a_shell() {
    // The kernel cannot run a script without `#!` (ENOEXEC); a shell and `execvp` have
    // `/bin/sh` run it. With a summary to collect, corehop spawns the program, and said
    // "Exec format error" instead.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("greet");
    std::fs::write(&script, "echo \"hello $1\"\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let script = script.to_str().unwrap();
    for flags in [&[][..], &["--offload"], &["--offload", "--stats"]] {
        let out = corehop().arg("run").args(flags).args(["--", script, "you"]).output().unwrap();
        assert!(out.status.success(), "{flags:?}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "hello you\n", "{flags:?}");
    }
}

#[test]
fn stats_print_a_summary_on_stderr_only() {
    let out = corehop()
        .args(["run", "--offload", "--policy", "always", "--stats", "--", "cat", "/etc/hostname"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("corehop offload summary") && stderr.contains("read"), "{stderr}");
    assert_eq!(out.stdout, std::fs::read("/etc/hostname").unwrap());
}

/// A program that sleeps between two calls: its service thread must not burn the service CPU
/// meanwhile (it polls only for a budget fitted to the gaps between calls, then sleeps), and
/// `--stats-json` carries the hand-off histogram and the same-run `on()` round trip.
#[test]
fn a_sleeping_program_does_not_keep_its_service_thread_polling() {
    if !common::two_cpus("the idle service thread test") || !have("python3") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("stats.json");
    let sleep_ns = 1_500_000_000u64;
    let script =
        "import time, os\nos.stat('/')\ntime.sleep(1.5)\nos.stat('/')\nprint(open('/etc/hostname').read())";
    let out = corehop()
        .args(["run", "--offload", "--policy", "always", "--stats-json"])
        .arg(&json)
        .args(["--", "python3", "-c", script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    // The program's service thread is idle for the whole sleep: polling through it would
    // count about `sleep_ns` (it does with `--spin-us 5000000`).
    let polled = summary["polled_ns"].as_u64().unwrap();
    assert!(polled < sleep_ns / 5, "service threads polled {polled} ns while the program slept: {summary}");
    let handoffs = summary["handoff"]["read"].as_array().expect("a read hand-off histogram");
    assert!(handoffs.iter().all(|b| b[0].as_u64() < b[1].as_u64() && b[2].as_u64() > Some(0)), "{summary}");
    let hop = &summary["on_round_trip"];
    assert!(hop["round_trip_ns"]["median"].as_f64().is_some_and(|ns| ns > 0.0), "{summary}");
    assert_eq!(hop["round_trip_ns"]["samples"], 15, "{summary}");
}

#[test]
fn bad_arguments_are_clear_errors() {
    let cases: [(&[&str], &str); 6] = [
        (&["run", "--offload", "--service-cpus", "4096", "--", "true"], "does not exist"),
        (&["run", "--offload", "--service-cpus", "x", "--", "true"], "--service-cpus"),
        (&["run", "--cpus", "3-1", "--", "true"], "--cpus"),
        (&["run", "--offload", "--policy", "always", "--threshold", "5", "--", "true"], "--threshold"),
        (&["run", "--", "/no/such/program"], "starting /no/such/program"),
        (&["run", "--policy", "always", "--", "true"], "--offload"),
    ];
    for (args, expected) in cases {
        let out = corehop().args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(expected), "{args:?}: expected {expected:?} in {stderr}");
    }
    let out = corehop()
        .args(["run", "--offload", "--", "true"])
        .env("COREHOP_PRELOAD", "/no/such.so")
        .output()
        .unwrap();
    assert!(text(&out.stderr).contains("COREHOP_PRELOAD"), "{}", text(&out.stderr));
}

/// A program that cannot start ends corehop as it ends a shell or `env`: 127 if it is not
/// there, 126 if it cannot be run; an option corehop does not know, before the program's name,
/// is a usage error, not a program. Errors are one line, also where backtraces are asked for.
#[test]
fn a_program_that_cannot_start_gives_the_shells_exit_status() {
    let not_runnable = std::env::temp_dir().join(format!("corehop-not-runnable-{}", std::process::id()));
    std::fs::write(&not_runnable, "not a program\n").unwrap();
    let not_runnable = not_runnable.to_str().unwrap().to_string();
    let cases: [(&[&str], i32, &str); 5] = [
        (&["run", "--", "/no/such/program"], 127, "corehop: starting /no/such/program: No such file"),
        (&["run", "--offload", "--", "/no/such/program"], 127, "starting /no/such/program"),
        (&["run", "--offload", "--stats", "--", "/no/such/program"], 127, "starting /no/such/program"),
        (&["run", "--", &not_runnable], 126, "Permission denied"),
        (
            &["run", "--offload", "--no-such-option", "--", "true"],
            2,
            "unexpected argument '--no-such-option'",
        ),
    ];
    for (args, code, expected) in cases {
        let out = corehop().args(args).env("RUST_BACKTRACE", "1").output().unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: expected {expected:?} in {stderr}");
        assert!(!stderr.contains("backtrace"), "{args:?}: {stderr}");
    }
    let _ = std::fs::remove_file(&not_runnable);
}

#[test]
fn a_bad_environment_turns_offload_off_and_the_program_still_runs() {
    let out = Command::new("cat")
        .arg("/etc/hostname")
        .env("LD_PRELOAD", common::library())
        .env("COREHOP_POLICY", "sometimes")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, std::fs::read("/etc/hostname").unwrap());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("COREHOP_POLICY") && stderr.contains("offload is off"), "{stderr}");
}

#[test]
fn compare_runs_both_ways_and_checks_the_outputs() {
    let out = corehop()
        .args(["run", "--offload", "--policy", "always", "--compare", "2", "--", "wc", "-c", "/etc/hostname"])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("plain (baseline)") && stdout.contains("offload always"), "{stdout}");
    assert!(stdout.contains("paired") && stdout.contains("after an untimed plain run"), "{stdout}");
    assert!(!stdout.contains("NO"), "{stdout}");
    assert!(!stdout.contains("offload summary"), "a summary without --stats: {stdout}");
    // The timed runs collect no summary; with --stats one more run prints it.
    let out = corehop()
        .args([
            "run",
            "--offload",
            "--policy",
            "always",
            "--compare",
            "1",
            "--stats",
            "--",
            "wc",
            "-c",
            "/etc/hostname",
        ])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("corehop offload summary") && stdout.contains("read"), "{stdout}");
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("cmp.svg");
    let out = corehop()
        .args(["run", "--offload", "--compare", "1", "--json", "--plot"])
        .arg(&svg)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).expect("--json prints JSON");
    assert_eq!(json["reps"], 1);
    assert_eq!(json["plain"]["same_output"], true);
    assert!(json["ratio"].as_f64().is_some_and(|r| r > 0.0), "{json}");
    assert!(json["paired_ratio"].as_f64().is_some_and(|r| r > 0.0), "{json}");
    assert!(json["paired_interval"].is_null(), "one repetition has no interval: {json}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    // A program whose output differs from run to run (its pid) is caught, and so named.
    let out =
        corehop().args(["run", "--offload", "--compare", "2", "--", "sh", "-c", "echo $$"]).output().unwrap();
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("plain runs' own stdout differed"), "{}", text(&out.stderr));
    // One whose output differs only when offloaded (it finds corehop's code mapped) is told
    // apart.
    let out = corehop()
        .args([
            "run",
            "--offload",
            "--compare",
            "2",
            "--",
            "sh",
            "-c",
            "grep -q corehop /proc/$$/maps && echo on; true",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("offloaded runs' stdout differed"), "{}", text(&out.stderr));
    // One that prints its environment prints the same list both ways, with the library
    // preloaded itself and through the stub (corehop's variables hidden in their places).
    // Its variables out of key order, as a shell may hand them on.
    for policy in ["adaptive", "always"] {
        let out = corehop_under_env_i(
            &["Z=1", "A=2", "PATH=/usr/bin:/bin"],
            &["run", "--offload", "--policy", policy, "--compare", "2", "--json", "--", "env"],
        );
        assert!(out.status.success(), "{policy}: {}", text(&out.stderr));
        let json: Value = serde_json::from_slice(&out.stdout).expect("--json prints JSON");
        assert_eq!(json["offload"]["same_output"], true, "{json}");
    }
}

#[test]
fn several_service_cpus_serve_a_multi_threaded_program() {
    if !common::two_cpus("the multi-threaded offload test") || !have("python3") {
        return;
    }
    let (_root, plain, offload) = dirs();
    let script = "import threading\n\
        def work(i):\n    data = bytes([i]) * 300000\n    with open(f't{i}.bin', 'wb') as f:\n        f.write(data)\n    \
        with open(f't{i}.bin', 'rb') as f:\n        assert f.read() == data\n\
        ts = [threading.Thread(target=work, args=(i,)) for i in range(6)]\n\
        [t.start() for t in ts]\n[t.join() for t in ts]\nprint('ok')\n";
    input(&plain, &offload, "threads.py", script.as_bytes());
    let pair = run_pair_with(
        "always",
        &["python3", "threads.py"],
        &plain,
        &offload,
        &["--service-cpus", "0,1"],
        &[],
    );
    pair.assert_same();
    assert!(pair.total("offloaded") > 0, "{}", pair.summary);
    for i in 0..6 {
        assert_same_file(&plain, &offload, &format!("t{i}.bin"));
    }
}

#[test]
fn the_default_adaptive_offload_leaves_the_program_on_every_cpu() {
    // `adaptive` moves nothing until moving pays, and `never` nothing at all: neither may take
    // a CPU from the program (a `never` run is the baseline, as plain as it gets).
    let mask = "grep Cpus_allowed_list /proc/self/status";
    let plain = Command::new("sh").args(["-c", mask]).output().unwrap();
    for policy in [&[][..], &["--policy", "never"][..]] {
        let offloaded = corehop()
            .args(["run", "--offload"])
            .args(policy)
            .args(["--", "sh", "-c", mask])
            .output()
            .unwrap();
        assert!(offloaded.status.success(), "{policy:?}: {}", text(&offloaded.stderr));
        assert_eq!(text(&offloaded.stdout), text(&plain.stdout), "{policy:?}");
    }
    // A policy that moves calls from the start keeps the program off the service CPU.
    let always =
        corehop().args(["run", "--offload", "--policy", "always", "--", "sh", "-c", mask]).output().unwrap();
    let cpus =
        corehop_topology::parse_cpu_list(text(&plain.stdout).split(':').nth(1).unwrap().trim()).unwrap();
    if cpus.len() > 1 {
        assert_ne!(text(&always.stdout), text(&plain.stdout));
    }
}

/// Minor page faults of `cat /etc/hostname` with the library loaded and `policy` in force,
/// the fewest of a few runs (address-space layout moves the count by a page or two).
fn page_faults_of_a_short_process(policy: &str) -> i64 {
    let library = common::library();
    (0..5)
        .map(|_| {
            // Reaped by wait4 below, which also gives its resource usage.
            #[allow(clippy::zombie_processes)]
            let child = Command::new("cat")
                .arg("/etc/hostname")
                .env("LD_PRELOAD", library)
                .env("COREHOP_POLICY", policy)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let mut status = 0;
            // SAFETY: rusage is plain integers, for which all zeros is a value.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: both pointers are to live locals; wait4 reaps our own child.
            let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
            assert_eq!(pid, child.id() as i32);
            assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
            usage.ru_minflt
        })
        .min()
        .unwrap()
}

#[test]
fn a_short_process_pays_no_more_page_faults_for_adaptive_than_for_never() {
    // A process that ends inside the default policy's first epoch, as most of a shell
    // pipeline do, never builds it (its tables cost 5-10 page faults, 12-25 µs here); one
    // that outlives it gets it (below). Writing the tables at start-up cost 30-odd faults.
    let never = page_faults_of_a_short_process("never");
    let adaptive = page_faults_of_a_short_process("adaptive");
    assert!(adaptive <= never + 4, "adaptive: {adaptive} page faults, never: {never}");
}

#[test]
fn a_process_that_outlives_the_first_epoch_gets_the_adaptive_policy() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("stats.json");
    let status = corehop()
        .args(["run", "--offload", "--stats-json"])
        .arg(&json)
        .args(["--", "dd", "if=/dev/zero", "of=/dev/null", "bs=1", "count=1000000", "status=none"])
        .status()
        .unwrap();
    assert!(status.success());
    let stats: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let settled = stats["settled"].as_object().expect("an adaptive policy reports where it settled");
    let rounds: u64 = settled.values().map(|arm| arm["rounds"].as_u64().unwrap()).sum();
    assert!(rounds >= 1, "the policy sampled no round: {settled:?}");
}

/// The names a shared library exports (`nm -D --defined-only`).
fn exported(library: &Path) -> std::collections::BTreeSet<String> {
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(library).output().expect("running nm");
    assert!(out.status.success(), "nm {}: {}", library.display(), text(&out.stderr));
    text(&out.stdout).lines().filter_map(|line| line.split_whitespace().nth(2)).map(String::from).collect()
}

#[test]
#[cfg_attr(not(target_arch = "x86_64"), ignore = "the start-up stub is built for x86-64 only")]
fn the_stub_routes_every_name_the_library_interposes() {
    let mut library = exported(common::library());
    assert!(library.remove("corehop_preload_handover"), "the library lacks its hand-over");
    assert!(library.remove("corehop_preload_next_after_stub"), "the library lacks its hand-over");
    // The ends that run no `atexit` handlers matter only to a run that asks for a summary or a
    // trace, which preloads the library itself.
    for end in ["_exit", "_Exit"] {
        assert!(library.remove(end), "the library lacks {end}");
    }
    assert_eq!(exported(common::stub()), library);
}

/// A program sees the environment it would see plainly (corehop's variables out of sight, the
/// values they had before in their places), under the start-up stub and with the library
/// preloaded itself; and what it starts through the exec family or `posix_spawn` sees what it
/// passed, and runs under corehop, as do the shells of `system` and `popen`.
#[test]
fn programs_see_their_own_environment_and_what_they_start_runs_under_corehop() {
    if !have("cc") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile("exec_family.c", &[], &dir.path().join("exec_family"));
    let before =
        [("LD_PRELOAD", "libm.so.6"), ("ASAN_OPTIONS", "detect_leaks=0"), ("COREHOP_STATS_FILE", "/nowhere")];
    let run = |flags: &[&str]| {
        let out = corehop().arg("run").args(flags).arg("--").arg(&exe).envs(before).env_remove("_").output();
        let out = out.expect("corehop run");
        assert!(out.status.success(), "{flags:?}: {}", text(&out.stderr));
        out
    };
    let plain = run(&[]);
    let seen = text(&plain.stdout);
    assert!(seen.contains("LD_PRELOAD=libm.so.6\n") && !seen.contains("COREHOP_ENV_WAS"), "{seen}");
    // The words of `execl` and `execle` past the registers came from the stack.
    assert!(seen.contains("== execl 1 2 3 4 5\n") && seen.contains("== execle 1 2 3 4 5 6\n"), "{seen}");
    assert!(!text(&plain.stderr).contains("mapped=1"), "{}", text(&plain.stderr));
    for flags in [&["--offload"][..], &["--offload", "--policy", "always"]] {
        let offload = run(flags);
        assert_eq!(text(&plain.stdout), text(&offload.stdout), "{flags:?}: the environments differ");
        let report = text(&offload.stderr);
        for way in [
            "self",
            "execl",
            "execlp",
            "execle",
            "execv",
            "execvp",
            "execve",
            "execvpe",
            "fexecve",
            "execveat",
            "posix_spawn",
            "posix_spawnp",
            "changed",
            "system",
            "popen",
        ] {
            assert!(
                report.contains(&format!("{way} mapped=1\n")),
                "{flags:?}: {way} ran without corehop:\n{report}"
            );
        }
    }
}

/// Runs the C fixture `source` plainly and under two offload policies: the output is the same
/// each time and holds every line of `expected`, and the fixture's shell (which reports on
/// stderr whether corehop's library is mapped in it) runs under corehop exactly when the
/// program does. Returns the plain output.
fn shells_run_as_plainly_and_under_corehop(
    source: &str,
    cflags: &[&str],
    expected: &[&str],
) -> Option<String> {
    if !have("cc") {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile(source, cflags, &dir.path().join("fixture"));
    let run = |flags: &[&str]| {
        let out = corehop().arg("run").args(flags).arg("--").arg(&exe).output().expect("corehop run");
        assert!(out.status.success(), "{source} {flags:?}: {}", text(&out.stderr));
        out
    };
    let plain = run(&[]);
    let seen = text(&plain.stdout);
    for line in expected {
        assert!(seen.contains(line), "{source}: {line:?} missing:\n{seen}");
    }
    assert!(text(&plain.stderr).contains("shell mapped=0"), "{source}: {}", text(&plain.stderr));
    for flags in [&["--offload"][..], &["--offload", "--policy", "always"]] {
        let offload = run(flags);
        assert_eq!(seen, text(&offload.stdout), "{source} {flags:?}");
        assert!(
            text(&offload.stderr).contains("shell mapped=1"),
            "{source} {flags:?}: {}",
            text(&offload.stderr)
        );
    }
    Some(seen)
}

/// `system` under corehop returns what it returns plainly (exit statuses, a shell killed by a
/// signal or missing its program, several threads at once), ignores SIGINT while its shell
/// runs and leaves the caller's signal actions and mask as they were; and its shell runs under
/// corehop.
#[test]
fn system_behaves_as_plainly_and_its_shell_runs_under_corehop() {
    let expected = ["[exit 3] -> 768 exit 3", "signal 15", "caller still here", "exit 127", "exit 13"];
    shells_run_as_plainly_and_under_corehop("system.c", &["-pthread"], &expected);
}

/// `popen` under corehop returns and leaves what it does plainly (what a stream reads and
/// writes, `pclose` and `fclose` statuses, no stream's descriptor in a later shell, `e` for
/// close-on-exec, bad modes refused), and its shell runs under corehop.
#[test]
fn popen_behaves_as_plainly_and_its_shell_runs_under_corehop() {
    let expected =
        ["read -> 1024 exit 4", "WRITTEN", "signal 15", "fclose -> 1280 exit 5", "shell lacks", "errno 22"];
    if let Some(seen) = shells_run_as_plainly_and_under_corehop("popen.c", &[], &expected) {
        assert!(!seen.contains("shell has"), "{seen}");
    }
}

/// A child forked while another thread is inside `popen` gets its own shells under corehop:
/// the lock the wrappers hold while they start a shell belongs to a thread the child lacks.
#[test]
fn a_child_forked_during_popen_opens_shells_of_its_own() {
    if !have("cc") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile("fork_popen.c", &["-pthread"], &dir.path().join("fork_popen"));
    for flags in [&["--offload"][..], &["--offload", "--policy", "always"]] {
        let out = corehop().arg("run").args(flags).arg("--").arg(&exe).output().expect("corehop run");
        assert!(out.status.success(), "{flags:?}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), "ok 60 hung 0 of 60", "{flags:?}");
    }
}

/// A panic path in the stub (a bounds check the compiler cannot drop, say) links the
/// formatting code of the standard library's `core`, built to unwind: the stub then needs
/// `rust_eh_personality`, which no process has, and every program under it fails to start.
#[test]
#[cfg_attr(not(target_arch = "x86_64"), ignore = "the start-up stub is built for x86-64 only")]
fn the_stub_needs_nothing_but_libc() {
    let out = Command::new("nm").args(["-D", "--undefined-only"]).arg(common::stub()).output().expect("nm");
    assert!(out.status.success(), "nm: {}", text(&out.stderr));
    let undefined = text(&out.stdout);
    for line in undefined.lines() {
        assert!(line.contains("@GLIBC_"), "the stub needs {line:?}, which libc does not define: {undefined}");
    }
}

#[test]
#[cfg_attr(not(target_arch = "x86_64"), ignore = "the start-up stub is built for x86-64 only")]
fn a_call_reaches_a_library_preloaded_after_the_stub_before_and_after_the_stub_loads_ours() {
    if !have("cc") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let next = compile("next_close.c", &["-shared", "-fPIC"], &dir.path().join("next_close.so"));
    // `: 9</etc/hostname` opens the file as descriptor 9 and closes it. The shell does so once
    // on the stub alone, then reads until the stub has loaded our library (past its 40 ms),
    // then once more.
    let script = ": 9</etc/hostname; echo first >&2; \
        n=0; while ! grep -q libcorehop_preload.so /proc/$$/maps && [ $n -lt 100 ]; do \
            i=0; while [ $i -lt 1000 ]; do read x < /etc/hostname; i=$((i+1)); done; n=$((n+1)); \
        done; \
        grep -q libcorehop_preload.so /proc/$$/maps && echo loaded >&2; : 9</etc/hostname";
    let mut preload = common::stub().as_os_str().to_owned();
    preload.push(" ");
    preload.push(&next);
    let reached = "next_close: close(9) reached the library after the stub";
    for walk in [true, false] {
        let mut command = Command::new("sh");
        common::through_the_stub(&mut command, "adaptive").env("LD_PRELOAD", &preload);
        if !walk {
            // The stub then asks `dlsym` for every name.
            command.env("LD_DYNAMIC_WEAK", "1");
        }
        let out = command.args(["-c", script]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let stderr = text(&out.stderr);
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.starts_with("corehop-preload: ")).collect();
        assert_eq!(lines, [reached, "first", "loaded", reached], "walk {walk}: {stderr}");
    }
}

#[test]
#[cfg_attr(not(target_arch = "x86_64"), ignore = "the start-up stub is built for x86-64 only")]
fn a_short_process_under_the_default_policy_loads_only_the_stub() {
    let out = corehop().args(["run", "--offload", "--", "cat", "/proc/self/maps"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let maps = text(&out.stdout);
    assert!(maps.contains("libcorehop_preload_stub.so"), "{maps}");
    assert!(!maps.contains("libcorehop_preload.so"), "{maps}");
    // Anything that counts or records every call gets the library from the start, as does
    // a user who asks for it.
    let out =
        corehop().args(["run", "--offload", "--stats", "--", "cat", "/proc/self/maps"]).output().unwrap();
    let maps = text(&out.stdout);
    assert!(maps.contains("libcorehop_preload.so") && !maps.contains("stub"), "{maps}");
    let mut none = corehop();
    none.env("COREHOP_STUB", "none").args(["run", "--offload", "--", "cat", "/proc/self/maps"]);
    let maps = text(&none.output().unwrap().stdout);
    assert!(maps.contains("libcorehop_preload.so") && !maps.contains("stub"), "{maps}");
}

/// Runs `script` with `sh` under the default policy, with the table of lifetimes in a fresh
/// directory, and says of each line it printed (a `grep -c` of some process's map for the stub)
/// whether that process had the stub.
fn stub_in_each(script: &str) -> Vec<bool> {
    let cache = tempfile::tempdir().unwrap();
    let out = corehop()
        .env("XDG_CACHE_HOME", cache.path())
        .args(["run", "--offload", "--", "sh", "-c", script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(cache.path().join("corehop/lifetimes-v1").is_file(), "no table made");
    text(&out.stdout).lines().map(|count| count.trim() != "0").collect()
}

/// A program whose processes end within the stub's wait, starting nothing, twice, is started
/// plainly from then on (one start in 16 with the stub, to check): the stub only cost it its
/// loading. The first two starts have the stub; later ones mostly not.
#[test]
#[cfg_attr(not(target_arch = "x86_64"), ignore = "the start-up stub is built for x86-64 only")]
fn a_program_seen_to_end_short_twice_is_started_plainly() {
    // `grep` reads its own map and ends in a few ms; a machine so loaded that one lasts past
    // the stub's 40 ms marks it long for good, so a run where that happened is tried again.
    let script =
        "i=0; while [ $i -lt 40 ]; do grep -c libcorehop_preload_stub.so /proc/self/maps; i=$((i+1)); done";
    let mut seen = Vec::new();
    for _ in 0..3 {
        let stubbed = stub_in_each(script);
        assert_eq!(stubbed.len(), 40, "{stubbed:?}");
        assert!(stubbed[0] && stubbed[1], "the first two starts had no stub: {stubbed:?}");
        // The 16th and 32nd starts after those check, and only they.
        let checks: Vec<usize> = (2..40).filter(|&i| stubbed[i]).collect();
        if checks == [17, 33] {
            return;
        }
        seen.push(stubbed);
    }
    panic!("no run started grep plainly after two short ends, but the checks: {seen:?}");
}

/// A program once seen to start another is never started plainly, however often it ends
/// short: what it starts would lose corehop with it. Here a copy of `xargs` under a name of its
/// own starts a shell that reads the copy's map, then ends short three times starting nothing
/// (`-r` with no input), then starts the shell again.
#[test]
#[cfg_attr(not(target_arch = "x86_64"), ignore = "the start-up stub is built for x86-64 only")]
fn a_program_seen_to_start_others_keeps_its_stub() {
    if !have("xargs") {
        return;
    }
    let xargs = Command::new("sh").args(["-c", "command -v xargs"]).output().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let starter = dir.path().join("starter-xargs");
    std::fs::copy(text(&xargs.stdout).trim(), &starter).unwrap();
    let starter = starter.display();
    let starts = format!("{starter} sh -c 'grep -c libcorehop_preload_stub.so /proc/$PPID/maps' < /dev/null");
    let script = format!("{starts}; for i in 1 2 3; do {starter} -r true < /dev/null; done; {starts}");
    assert_eq!(stub_in_each(&script), [true, true]);
}

/// Each library a process maps costs it system calls and page faults; `cat` links libc alone,
/// and the preload library brings nothing else (libm, libgcc_s) with it.
#[test]
fn the_library_brings_no_other_library_into_the_program() {
    let out =
        corehop().args(["run", "--offload", "--stats", "--", "cat", "/proc/self/maps"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let maps = text(&out.stdout);
    assert!(maps.contains("libcorehop_preload.so"), "{maps}");
    for unwanted in ["libm.so", "libgcc_s.so", "libstdc++"] {
        assert!(!maps.contains(unwanted), "{unwanted} mapped: {maps}");
    }
}

#[test]
#[cfg_attr(not(target_arch = "x86_64"), ignore = "the start-up stub is built for x86-64 only")]
fn a_process_that_outlives_its_first_epoch_on_the_stub_loads_the_library() {
    // The shell's own `read` calls, then its own map, read by a child it starts (dash starts
    // it with vfork: a child sharing its memory, which alone does not load the library).
    let maps_after = |reads: u32| {
        let script = format!(
            "i=0; while [ $i -lt {reads} ]; do read x < /etc/hostname; i=$((i+1)); done; cat /proc/$$/maps"
        );
        let out = corehop().args(["run", "--offload", "--", "sh", "-c", &script]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let short = maps_after(1);
    assert!(
        short.contains("libcorehop_preload_stub.so") && !short.contains("libcorehop_preload.so"),
        "{short}"
    );
    // Past the stub's 40 ms however fast the machine runs the loop: 4000 reads once took less.
    let long = maps_after(40_000);
    assert!(long.contains("libcorehop_preload_stub.so") && long.contains("libcorehop_preload.so"), "{long}");
}

#[test]
#[cfg_attr(not(target_arch = "x86_64"), ignore = "the start-up stub is built for x86-64 only")]
fn a_child_forked_past_the_first_epoch_starts_an_epoch_of_its_own() {
    // The shell makes its first calls, then waits past the stub's 40 ms making none. A subshell
    // it forks then makes `reads` rounds of calls, and a child of the subshell reads the
    // subshell's map (the `:` keeps dash from running that child in the subshell's place).
    let subshell_map_after = |reads: u32| {
        let script = format!(
            "read x < /etc/hostname; sleep 0.1; \
             ( i=0; while [ $i -lt {reads} ]; do read x < /etc/hostname; i=$((i+1)); done; \
               sh -c 'if grep -q libcorehop_preload.so /proc/$PPID/maps; then echo loaded; else echo short; fi'; : )"
        );
        let out = corehop().args(["run", "--offload", "--", "sh", "-c", &script]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    // The subshell inherited the shell's first call, but like a shell's child before an exec it
    // has just begun: loading the library there would cost it the load for nothing.
    assert_eq!(subshell_map_after(100), "short\n");
    // One that goes on past an epoch of its own gets the library (40 000 rounds: see above).
    assert_eq!(subshell_map_after(40_000), "loaded\n");
}

#[test]
#[cfg_attr(not(target_arch = "x86_64"), ignore = "the start-up stub is built for x86-64 only")]
fn the_library_the_stub_loads_moves_calls_and_results_stay_the_same() {
    // The stub's route with a policy that moves every call, and a summary to count them: the
    // calls of the first epoch ran on libc, the later ones on the library the stub loaded.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::write(&input, lines(5_000)).unwrap();
    let run = |preload: bool| {
        let mut command = Command::new("dd");
        command.arg(format!("if={}", input.display())).args(["bs=1", "status=none"]);
        if preload {
            common::through_the_stub(&mut command, "always");
        }
        command.output().unwrap()
    };
    let (plain, offload) = (run(false), run(true));
    assert!(plain.status.success() && offload.status.success(), "{}", text(&offload.stderr));
    assert_eq!(plain.stdout, offload.stdout);
    // dd makes one read a byte (and one at the end).
    let summary = common::summary_on(&offload.stderr);
    let read = &summary.calls["read"];
    let bytes = lines(5_000).len() as u64;
    assert!(read.seen > 0 && read.seen < bytes, "reads seen by the library: {read:?}");
    assert!(read.offloaded > 0, "no read moved: {read:?}");
}

#[test]
fn the_run_suite_compares_real_programs_and_their_outputs() {
    let out = corehop()
        // A program named twice runs once.
        .args(["bench", "run-suite", "--programs", "cp-r,find-grep,sqlite3,cp-r", "--reps", "2", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["policy"], "adaptive");
    let results = report["results"].as_array().unwrap();
    let skipped = report["skipped"].as_array().unwrap();
    assert_eq!(results.len() + skipped.len(), 3, "{report}");
    for r in results {
        assert_eq!(r["same_output"], true, "{r}");
        assert!(r["plain"]["median"].as_f64().unwrap() > 0.0);
        assert!(r["ratio"].as_f64().unwrap() > 0.0);
        // Two repetitions: the paired figure is the mean of their two ratios, and its interval
        // their range, which holds the median with chance one half.
        let paired = r["paired_ratio"].as_f64().unwrap();
        let interval = &r["paired_interval"];
        let (low, high) = (interval["low"].as_f64().unwrap(), interval["high"].as_f64().unwrap());
        assert!(low <= paired && paired <= high && (paired - (low + high) / 2.0).abs() < 1e-9, "{r}");
        assert_eq!(interval["coverage"], 0.5, "{r}");
        for arm in r["settled"].as_object().unwrap().keys() {
            assert!(["never", "measured", "always", "size", "predicted"].contains(&arm.as_str()), "{arm}");
        }
        // Counted from the stub's table of lifetimes (in the harness's cache directory).
        assert_eq!(r["started_plainly"].is_u64(), cfg!(target_arch = "x86_64"), "{r}");
    }
    // The library's load floor and corehop's own start are measured in the same run (timings
    // are not judged).
    assert!(report["load"]["median_ns"].is_number(), "{report}");
    assert!(report["launcher"]["median_ns"].is_number(), "{report}");
    // The default policy's processes start on the start-up stub (built for x86-64).
    let expected = if cfg!(target_arch = "x86_64") { "stub" } else { "library" };
    assert_eq!(report["preloads"], expected, "{report}");
    // With the stub, what the library itself would cost is measured beside it.
    assert_eq!(report["library_load"]["median_ns"].is_number(), expected == "stub", "{report}");
    let bad = corehop().args(["bench", "run-suite", "--programs", "doom"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(text(&bad.stderr).contains("unknown program \"doom\""), "{}", text(&bad.stderr));
}

#[test]
fn the_run_suite_writes_under_any_tmpdir_and_leaves_nothing_there() {
    // A `'` and a space in the name: the suite's scripts `cd` there through sh.
    let parent = tempfile::tempdir().unwrap();
    let tmpdir = parent.path().join("it's here");
    std::fs::create_dir(&tmpdir).unwrap();
    let out = corehop()
        .env("TMPDIR", &tmpdir)
        .args(["bench", "run-suite", "--programs", "cp-r", "--quick", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["results"][0]["same_output"], true, "{report}");
    assert_eq!(std::fs::read_dir(&tmpdir).unwrap().count(), 0, "the suite left files in TMPDIR");
}

#[test]
fn an_empty_recording_says_which_programs_the_library_cannot_see() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    // `true` ends without one call through libc's exported functions.
    let out = corehop()
        .args(["run", "--offload", "--record-trace"])
        .arg(&trace)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("recorded 0 calls of 0 process(es)"), "{err}");
    assert!(err.contains("statically linked") && err.contains("fread"), "{err}");
    // A program whose calls were seen gets no such hint.
    let out = corehop()
        .args(["run", "--offload", "--record-trace"])
        .arg(&trace)
        .args(["--", "sh", "-c", "cat /etc/hostname >/dev/null"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("no process reported"), "{}", text(&out.stderr));
}

#[test]
fn record_trace_writes_every_call_with_its_site_for_predict() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    std::fs::write(dir.path().join("a"), vec![7u8; 10_000]).unwrap();
    // Two processes (sh forks cat), each reading and writing through the library.
    let script = format!("cd '{}' && cat a a > b && cat b > c && wc -c c", dir.path().display());
    let out = corehop()
        .args(["run", "--offload", "--policy", "always", "--record-trace"])
        .arg(&trace)
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "20000 c");
    assert!(text(&out.stderr).contains("corehop: recorded"), "{}", text(&out.stderr));
    let csv = std::fs::read_to_string(&trace).unwrap();
    assert!(csv.lines().filter(|l| l.starts_with("# pid")).count() >= 2, "{csv}");
    let calls: Vec<Vec<&str>> = csv
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("call,"))
        .map(|l| l.split(',').collect())
        .collect();
    assert!(calls.iter().all(|c| c.len() == 5), "{csv}");
    // cat opens `a` twice: every call has a run length, and a call site (the entry points with
    // six arguments, sendto and recvfrom, carry none).
    assert!(calls.iter().filter(|c| c[0] == "open" || c[0] == "openat").count() >= 3, "{csv}");
    assert!(calls.iter().all(|c| c[4].parse::<u64>().is_ok()), "{csv}");
    let sited = |c: &&Vec<&str>| c[0] == "sendto" || c[0] == "recvfrom" || c[3].parse::<u64>().unwrap() > 0;
    assert!(calls.iter().all(|c| sited(&c)), "every call has its call site: {csv}");
    let predicted = common::corehop(&["predict", "--trace", trace.to_str().unwrap(), "--json"]);
    assert!(predicted.status.success(), "{}", text(&predicted.stderr));
    let report: Value = serde_json::from_slice(&predicted.stdout).unwrap();
    assert_eq!(report[0]["calls"].as_u64().unwrap() as usize, calls.len());
}

#[test]
fn the_processes_of_a_run_hand_on_what_their_predictors_learned() {
    let dir = tempfile::tempdir().unwrap();
    let (copy, json) = (dir.path().join("learned"), dir.path().join("summary.json"));
    // `ls` learns, ends and hands on; the second `ls` starts from it, and `cat`, started after
    // both, copies the run's file out. `sh` and the first `ls` start before anything is handed on.
    // The file's name is out of the shell's sight; the kernel's copy of its environment has it.
    let script = format!(
        "ls -la / > /dev/null; ls -la / > /dev/null; \
         cat \"$(tr '\\0' '\\n' < /proc/$$/environ | sed -n 's/^COREHOP_LEARNED=//p')\" > '{}'",
        copy.display()
    );
    let out = corehop()
        .args(["run", "--offload", "--policy", "predicted", "--threshold", "1000000", "--stats-json"])
        .arg(&json)
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let summary: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let (inherited, processes) =
        (summary["inherited"].as_u64().unwrap(), summary["processes"].as_u64().unwrap());
    assert!(
        (2..processes).contains(&inherited),
        "{inherited} of {processes} processes started from the run's"
    );
    let bytes = std::fs::read(&copy).unwrap();
    let words: Vec<u32> = bytes.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
    // A header (what it is, its length, a checksum), then each call kind's recent runs.
    assert_eq!(words.len(), 3 + corehop_policy::offload::LEARNED_WORDS, "{} bytes", bytes.len());
    assert_eq!(&bytes[..4], b"lrnd", "the file's magic word");
    assert!(corehop_policy::offload::Learned::from_words(&words[3..]).is_some());
    let kinds = &words[3..words.len() - 2];
    assert!(kinds.iter().any(|&w| w != 0), "ls's runs were handed on");
    // A program corehop execs (nothing to collect) gets no such file.
    let out = corehop()
        .args(["run", "--offload", "--policy", "predicted", "--", "sh", "-c", "echo \"[$COREHOP_LEARNED]\""])
        .output()
        .unwrap();
    assert_eq!(text(&out.stdout).trim(), "[]");
}

#[test]
fn record_trace_needs_offload_and_a_writable_file() {
    let out = corehop().args(["run", "--record-trace", "t.csv", "--", "true"]).output().unwrap();
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--offload"), "{}", text(&out.stderr));
    let out = corehop()
        .args(["run", "--offload", "--record-trace", "/nonexistent-dir/t.csv", "--", "true"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("there is no folder /nonexistent-dir"), "{}", text(&out.stderr));
}

#[test]
fn without_a_summary_to_collect_corehop_becomes_the_program() {
    // No --stats: `corehop run` execs the program, which keeps corehop's process id (so a
    // signal sent to that id reaches the program itself).
    let child = corehop()
        .args(["run", "--offload", "--", "sh", "-c", "echo $$; exit 7"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(text(&out.stdout).trim(), pid.to_string());
    // With --stats corehop stays the parent, to read the summary when the program ends.
    let child = corehop()
        .args(["run", "--offload", "--stats", "--", "sh", "-c", "echo $$"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert_ne!(text(&out.stdout).trim(), pid.to_string());
}

/// `corehop ARGS` started by `env -i VARS`: with exactly those variables, in that order.
fn corehop_under_env_i(vars: &[&str], args: &[&str]) -> Output {
    common::library();
    let corehop = env!("CARGO_BIN_EXE_corehop");
    Command::new("/usr/bin/env").arg("-i").args(vars).arg(corehop).args(args).output().unwrap()
}

/// `corehop run -- PROGRAM` under `env -i` with the variables out of key order, `_` among
/// them (a shell's, which corehop sets to the program's path): its lines.
fn env_lines_through_corehop(extra: &[&str], program: &[&str]) -> Vec<String> {
    let args: Vec<&str> = ["run"].iter().chain(extra).chain(&["--"]).chain(program).copied().collect();
    let out = corehop_under_env_i(&["Z=1", "_=/bin/sh", "A=2", "PATH=/usr/bin:/bin"], &args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).lines().map(str::to_string).collect()
}

#[test]
fn the_program_gets_the_environment_in_its_order() {
    // Plain: only `_` changes, in its place (`Command` sorted the whole list once one changed).
    let plain = env_lines_through_corehop(&[], &["env"]);
    assert_eq!(plain, ["Z=1", "_=/usr/bin/env", "A=2", "PATH=/usr/bin:/bin"]);
    // Offload: the program sees the same (corehop's variables out of its sight), also where
    // corehop waits for it to collect a summary or a trace (`Command` sorted the list there)...
    assert_eq!(env_lines_through_corehop(&["--offload"], &["env"]), plain);
    assert_eq!(env_lines_through_corehop(&["--offload", "--stats"], &["env"])[..4], plain);
    let trace = tempfile::NamedTempFile::new().unwrap();
    let traced = ["--offload", "--record-trace", trace.path().to_str().unwrap()];
    assert_eq!(env_lines_through_corehop(&traced, &["env"]), plain);
    // ...and the kernel's copy of what it started with has the library's settings after the
    // program's own variables, and the marker of what they held before.
    let started = ["sh", "-c", "tr '\\0' '\\n' < /proc/$$/environ"];
    let offload = env_lines_through_corehop(&["--offload"], &started);
    assert_eq!([&offload[0], &offload[2], &offload[3]], ["Z=1", "A=2", "PATH=/usr/bin:/bin"]);
    assert!(offload[1].starts_with("_=") && offload[1].ends_with("/sh"), "{offload:?}");
    assert!(offload[4..].iter().any(|l| l.starts_with("LD_PRELOAD=")), "{offload:?}");
    assert!(offload.last().is_some_and(|l| l.starts_with("COREHOP_ENV_WAS=LD_PRELOAD,")), "{offload:?}");
    let offload = &offload[..offload.len() - 1];
    // And AddressSanitizer's leave to start after the library (see `asan_options`).
    let ours = |l: &&String| {
        l.starts_with("LD_PRELOAD=")
            || l.starts_with("COREHOP_")
            || *l == "ASAN_OPTIONS=verify_asan_link_order=0"
    };
    assert!(offload[4..].iter().all(|l| ours(&l)), "{offload:?}");
}

#[test]
fn a_sanitized_program_runs_and_reports_as_it_does_plain() {
    if !have("cc") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile("sanitized_read.c", &["-g", "-fsanitize=address"], &dir.path().join("sanitized_read"));
    let exe = exe.to_str().unwrap();
    let overflow = "stack-buffer-overflow";
    let plain = Command::new(exe).arg("overflow").output().unwrap();
    assert_eq!(plain.status.code(), Some(1), "{}", text(&plain.stderr));
    assert!(text(&plain.stderr).contains(overflow), "{}", text(&plain.stderr));
    for policy in ["adaptive", "always"] {
        // AddressSanitizer's runtime starts although the library comes before it, and its
        // interceptor still sees the call: the library moved none of them.
        let run = |args: &[&str]| {
            corehop().args(["run", "--offload", "--policy", policy]).args(args).arg(exe).output().unwrap()
        };
        let out = run(&["--"]);
        assert!(out.status.success(), "{policy}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "clean\n", "{policy}");
        let out =
            corehop().args(["run", "--offload", "--policy", policy, "--", exe, "overflow"]).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{policy}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains(overflow), "{policy}: {}", text(&out.stderr));
    }
    // Where a call was to move, the summary says why none did.
    let stats =
        corehop().args(["run", "--offload", "--policy", "always", "--stats", "--", exe]).output().unwrap();
    assert!(stats.status.success(), "{}", text(&stats.stderr));
    let summary = text(&stats.stderr);
    assert!(summary.contains("1 of 1 process(es) kept every call with its caller: a sanitizer"), "{summary}");
}

#[test]
fn a_process_that_ends_with_exit_reports_and_a_vfork_child_does_not() {
    if !have("cc") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = compile("ends_with_exit.c", &[], &dir.path().join("ends_with_exit"));
    let exe = exe.to_str().unwrap();
    let plain = Command::new(exe).output().unwrap();
    assert_eq!(text(&plain.stdout), "fork child 3, vfork child 4\n");
    let json = dir.path().join("stats.json");
    let trace = dir.path().join("trace.csv");
    for policy in ["adaptive", "always"] {
        let out = corehop()
            .args(["run", "--offload", "--policy", policy, "--stats-json"])
            .arg(&json)
            .arg("--record-trace")
            .arg(&trace)
            .args(["--", exe])
            .output()
            .unwrap();
        assert!(out.status.success(), "{policy}: {}", text(&out.stderr));
        assert_eq!(out.stdout, plain.stdout, "{policy}");
        // The parent and the forked child, which left with `_exit`; not the `vfork` child,
        // whose memory was the parent's.
        let stats: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(stats["processes"], 2, "{policy}: {stats}");
        let recorded = std::fs::read_to_string(&trace).unwrap();
        let processes = recorded.lines().filter(|l| l.starts_with("# pid ")).count();
        assert_eq!(processes, 2, "{policy}: {recorded}");
        // The child's reads of its own file: 50 opens, and one read past each end.
        assert!(stats["calls"]["read"]["seen"].as_u64().unwrap() >= 100, "{policy}: {stats}");
    }
}

/// A program that lowers its file size limit below what the run's report file has reached
/// runs as it does plainly: the library's line at its exit neither kills it with SIGXFSZ nor,
/// where the hard limit allows, goes missing.
#[test]
fn a_program_that_lowers_its_file_size_limit_is_not_killed_by_the_report() {
    if !have("python3") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("stats.json");
    let run = |limit: &str| {
        let program = format!(
            "cat /etc/hostname > /dev/null; cat /etc/hostname > /dev/null; exec python3 -c \
             'import resource; resource.setrlimit(resource.RLIMIT_FSIZE, {limit}); print(\"bye\")'"
        );
        let out = corehop()
            .args(["run", "--offload", "--stats-json"])
            .arg(&report)
            .args(["--", "sh", "-c", &program])
            .output()
            .unwrap();
        assert!(out.status.success(), "{limit}: {:?} {}", out.status, text(&out.stderr));
        assert_eq!(text(&out.stdout), "bye\n", "{limit}");
        let summary: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        summary["processes"].as_u64().unwrap()
    };
    let unlimited = run("(resource.RLIM_INFINITY, resource.RLIM_INFINITY)");
    assert_eq!(run("(100, resource.RLIM_INFINITY)"), unlimited, "the soft limit alone loses no line");
    // Past the hard limit the line is left out, and the program still ends as it does plainly.
    assert!(run("(100, 100)") < unlimited);
    let out = corehop()
        .args(["run", "--offload", "--record-trace"])
        .arg(dir.path().join("trace.csv"))
        .args(["--", "sh", "-c", "cat /etc/hostname; exec python3 -c 'import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (10, 10)); print(1)'"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?} {}", out.status, text(&out.stderr));
}

/// What a run under a memory limit came to: exit status, stdout, and stderr up to corehop's
/// summary. Never a signal, and never a failed allocation of the library's.
fn limited_outcome(what: &str, out: &Output) -> (Option<i32>, String, String) {
    use std::os::unix::process::ExitStatusExt;
    let stderr = text(&out.stderr);
    let stderr = stderr.split("corehop offload summary").next().unwrap_or_default().to_string();
    assert_eq!(out.status.signal(), None, "{what}: killed by a signal; stderr: {stderr}");
    assert!(!stderr.contains("memory allocation"), "{what}: the library's allocation failed: {stderr}");
    (out.status.code(), text(&out.stdout), stderr)
}

/// `sh -c 'ulimit LIMIT; cat FILE'` runs under every way corehop runs a program as it does
/// plainly: the library, which took room of its own at start-up, aborted `cat` at
/// `ulimit -v 3300` ("memory allocation of 1 bytes failed"), where it runs plainly. Now it
/// stays out of a process with a memory limit and allocates nothing. Its image still takes
/// room, so where plain succeeds a run under it may instead fail, but only exactly as plain
/// fails at a lower limit (plain is not monotonic here: `cat` fails at 3000 KB and succeeds
/// at 2800 here).
#[test]
fn a_program_under_a_memory_limit_runs_as_at_some_limit_plainly() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file.txt");
    std::fs::write(&file, "some text\n").unwrap();
    let run = |limit: &str, flags: &[&str]| {
        let program = format!("ulimit {limit}; cat {}", file.display());
        let out = corehop().arg("run").args(flags).args(["--", "sh", "-c", &program]).output().unwrap();
        limited_outcome(&format!("{limit} {flags:?}"), &out)
    };
    let modes: [&[&str]; 3] =
        [&["--offload", "--policy", "always"], &["--offload"], &["--offload", "--stats"]];
    let mut differ = Vec::new();
    // The old library aborted `cat` at -v 3300 to 3500 and 4100, and at -d 400.
    for (option, plain_kb, under_kb, step) in
        [("-v", 1000..=6000, 2800..=6000, 200), ("-d", 0..=1000, 300..=1000, 100)]
    {
        let plain: Vec<_> =
            plain_kb.step_by(100).map(|kb| (kb, run(&format!("{option} {kb}"), &[]))).collect();
        for kb in under_kb.step_by(step) {
            let here = &plain.iter().find(|(k, _)| *k == kb).expect("a plain run at this limit").1;
            for flags in modes {
                let under = run(&format!("{option} {kb}"), flags);
                let as_lower = plain.iter().any(|(k, p)| *k < kb && p.0 != Some(0) && *p == under);
                if here.0 == Some(0) && under != *here && !as_lower {
                    differ.push(format!("ulimit {option} {kb} {flags:?}: {under:?}, plainly {here:?}"));
                }
            }
        }
        // With room to spare every way prints the file.
        let top = &plain.last().unwrap().1;
        assert_eq!(top.1, "some text\n", "{option}: plainly {top:?}");
        for flags in modes {
            assert_eq!(
                run(&format!("{option} {}", plain.last().unwrap().0), flags),
                *top,
                "{option} {flags:?}"
            );
        }
    }
    assert!(differ.is_empty(), "not as at any limit plainly:\n{}", differ.join("\n"));
}

/// A program that lowers its own address-space limit mid-run, to what it maps then, goes on
/// as it does plainly: its small allocations come from its heap, a large one fails, and the
/// library, which built the default policy's tables after that (and aborted the program:
/// "memory allocation of 12288 bytes failed"), allocates nothing more. The limit is set with
/// `setrlimit`, `prlimit` and a raw `syscall(SYS_prlimit64)`.
#[test]
fn a_program_that_lowers_its_own_memory_limit_keeps_running() {
    if !have("cc") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let program = compile("lowers_its_memory_limit.c", &[], &dir.path().join("lowers"));
    let file = dir.path().join("file.txt");
    std::fs::write(&file, lines(50)).unwrap();
    // Before the default policy's first epoch ends (20 ms), and after the stub loads (40 ms).
    for (before_ms, how) in [("5", "setrlimit"), ("5", "prlimit"), ("5", "syscall"), ("60", "setrlimit")] {
        let args = [file.to_str().unwrap(), before_ms, "100", how];
        let plain = corehop().arg("run").arg("--").arg(&program).args(args).output().unwrap();
        let plain = limited_outcome(how, &plain);
        assert_eq!(plain.0, Some(0), "{plain:?}");
        assert!(plain.1.contains("after: 0 small allocations failed"), "{plain:?}");
        for flags in [&["--offload", "--policy", "always"][..], &["--offload"], &["--offload", "--stats"]] {
            let out = corehop().arg("run").args(flags).arg("--").arg(&program).args(args).output().unwrap();
            assert_eq!(
                limited_outcome(&format!("{how} {flags:?}"), &out),
                plain,
                "{how} after {before_ms} ms {flags:?}"
            );
        }
    }
}

/// An exec whose arguments and environment only just fit the kernel's limit starts as it
/// does plainly: the variables corehop adds back for the child would tip it over, so the
/// child starts without them (and without corehop) instead of failing with E2BIG.
#[test]
fn an_exec_that_only_just_fits_starts_as_it_does_plainly() {
    if !have("python3") {
        return;
    }
    // The most arguments of 999 bytes, then the longest last argument, that still start, each
    // found by halving (an argument alone may not pass 128 KiB: the total is what is tested).
    let script = r#"
import os, subprocess
def starts(n, extra):
    try:
        subprocess.run(["/bin/true"] + ["x" * 999] * n + ["y" * extra], check=True)
        return True
    except OSError:
        return False
def longest(fits, hi):
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo
n = longest(lambda n: starts(n, 0), 1 << 16)
extra = longest(lambda extra: starts(n, extra), 4000)
# What the kernel counted, the environment included (strings and their pointers), so that
# a run whose `_` names another path finds the same room.
env = sum(len(k) + len(v) + 2 + 8 for k, v in os.environb.items())
print(n * (1000 + 8) + extra + env)
"#;
    let plain = Command::new("python3").args(["-c", script]).output().unwrap();
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    for policy in ["adaptive", "always"] {
        let under = corehop()
            .args(["run", "--offload", "--policy", policy, "--", "python3", "-c", script])
            .output()
            .unwrap();
        assert!(under.status.success(), "{}", text(&under.stderr));
        assert_eq!(text(&under.stdout), text(&plain.stdout), "{policy}");
    }
}

/// A statically linked program loads no library, so corehop's variables would only show in
/// its environment: it starts with the environment it has plainly.
#[test]
fn a_static_program_sees_its_plain_environment() {
    if !have("cc") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = match try_compile("environ.c", &["-static"], &dir.path().join("environ")) {
        Ok(out) => out,
        Err(stderr) => {
            eprintln!("skipped: cc cannot link statically here: {stderr}");
            return;
        }
    };
    // Without --offload, with the environment the runs below have.
    let plain = corehop().args(["run", "--"]).arg(&out).output().unwrap();
    for policy in ["adaptive", "always"] {
        let under =
            corehop().args(["run", "--offload", "--policy", policy, "--"]).arg(&out).output().unwrap();
        assert!(under.status.success(), "{}", text(&under.stderr));
        assert_eq!(text(&under.stdout), text(&plain.stdout), "{policy}");
    }
    // A dynamically linked one is preloaded, and sees the same.
    let dynamic = compile("environ.c", &[], &dir.path().join("environ-dynamic"));
    let under = corehop().args(["run", "--offload", "--"]).arg(&dynamic).output().unwrap();
    assert_eq!(text(&under.stdout), text(&plain.stdout));
}

/// While corehop waits to collect a report, a signal sent to it reaches the program as if sent
/// to the program: one it handles, and a SIGCONT after it stopped itself.
#[test]
fn signals_sent_to_corehop_reach_the_program_it_waits_for() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats.json");
    let start = |script: &str| {
        corehop()
            .args(["run", "--offload", "--stats-json"])
            .arg(&stats)
            .args(["--", "sh", "-c", script])
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap()
    };
    let signal = |pid: u32, name: &str| {
        Command::new("kill").args(["-s", name, &pid.to_string()]).status().unwrap();
    };
    // Each program gives up after about 10 s, and the waker below ends its process group, so
    // a signal that does not get through fails the test instead of hanging it.
    let mut child =
        start("trap 'echo got; exit 3' USR1; echo ready; for i in $(seq 200); do sleep 0.05; done; exit 9");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    signal(child.id(), "USR1");
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "got\n");
    assert_eq!(child.wait().unwrap().code(), Some(3));

    let mut child = start("echo ready; kill -STOP $$; echo resumed");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    line.clear();
    out.read_line(&mut line).unwrap();
    // Until the program is running again (a SIGCONT before it stopped changes nothing).
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waker = std::thread::spawn({
        let (pid, done) = (child.id(), std::sync::Arc::clone(&done));
        move || {
            for _ in 0..200 {
                if done.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                signal(pid, "CONT");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            if !done.load(std::sync::atomic::Ordering::SeqCst) {
                signal(pid, "KILL");
                Command::new("kill").args(["-s", "KILL", "--", &format!("-{pid}")]).status().unwrap();
            }
        }
    });
    line.clear();
    out.read_line(&mut line).unwrap();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(line, "resumed\n");
    assert!(child.wait().unwrap().success());
    waker.join().unwrap();
}
