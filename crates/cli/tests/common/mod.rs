//! What the command's integration tests share: running `corehop`, and the preload library
//! it loads into programs.
// Each test file uses only some of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The `corehop` command with an environment that changes nothing it does: no inherited
/// `LD_PRELOAD` or `COREHOP_PRELOAD`, no backtraces, no progress bars (`CI`), and the cache
/// (`corehop run`'s table of programs' lifetimes) in the build's own temporary directory, not
/// the user's.
pub fn command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_corehop"));
    command.env_remove("LD_PRELOAD").env_remove("COREHOP_PRELOAD").env("RUST_BACKTRACE", "0").env("CI", "1");
    command.env("XDG_CACHE_HOME", Path::new(env!("CARGO_TARGET_TMPDIR")).join("cache"));
    command
}

/// Runs `corehop ARGS` and collects its output.
pub fn corehop(args: &[&str]) -> Output {
    command().args(args).output().expect("running corehop")
}

/// Runs `corehop ARGS`, which must succeed, and returns its stdout.
pub fn stdout_of(args: &[&str]) -> String {
    let out = corehop(args);
    assert!(out.status.success(), "corehop {args:?} failed: {}", text(&out.stderr));
    text(&out.stdout)
}

/// Runs `corehop ARGS`, which must succeed and print JSON, and returns it.
pub fn json_of(args: &[&str]) -> serde_json::Value {
    let stdout = stdout_of(args);
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("corehop {args:?} printed no JSON ({e}): {stdout}"))
}

/// Runs `corehop ARGS --plot FILE.svg`, which must succeed and write an SVG there; returns its
/// stdout and the SVG.
pub fn plotted(args: &[&str]) -> (String, String) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let svg = dir.path().join("plot.svg");
    let stdout = stdout_of(&[args, &["--plot", svg.to_str().expect("a UTF-8 path")]].concat());
    let plot = std::fs::read_to_string(&svg).expect("--plot wrote its file");
    assert!(plot.contains("<svg"), "not an SVG: {plot}");
    (stdout, plot)
}

/// Runs `corehop ARGS`, which must fail, and returns its stderr.
pub fn error_of(args: &[&str]) -> String {
    let out = corehop(args);
    assert!(!out.status.success(), "corehop {args:?} should fail");
    text(&out.stderr)
}

/// Output as text (lossy: a test prints it when it fails).
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether this process may use two CPUs; records a skip for `what` if not.
pub fn two_cpus(what: &str) -> bool {
    let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    if n < 2 {
        skip(&format!("{what} needs two CPUs, this process may use {n}"));
    }
    n >= 2
}

/// Whether `tool` is on the PATH; records a skip if not.
pub fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        skip(&format!("{tool} is not installed (scripts/test.sh installs it)"));
    }
    found
}

/// [`command`], with the preload library built next to the binary first.
pub fn offload_command() -> Command {
    library();
    command()
}

/// Builds the preload library next to the corehop binary, once per test process.
pub fn library() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let bin_dir =
            Path::new(env!("CARGO_BIN_EXE_corehop")).parent().expect("binary directory").to_path_buf();
        let target_dir = bin_dir.parent().expect("target directory");
        let mut cargo = Command::new(env!("CARGO"));
        cargo.args(["build", "-q", "-p", "corehop-preload", "--target-dir"]).arg(target_dir);
        if bin_dir.ends_with("release") {
            cargo.arg("--release");
        }
        let status = cargo.status().expect("running cargo build -p corehop-preload");
        assert!(status.success(), "cargo build -p corehop-preload failed");
        let library = bin_dir.join("libcorehop_preload.so");
        assert!(library.is_file(), "{} missing after the build", library.display());
        library
    })
}

/// The preload library's start-up stub the build made (`crates/cli/build.rs`).
pub fn stub() -> &'static Path {
    let stub = Path::new(env!("COREHOP_STUB_BUILT"));
    assert!(stub.is_file(), "the build made no start-up stub (COREHOP_STUB_BUILT={stub:?})");
    stub
}

/// Preloads the start-up stub into `command` as `corehop run --offload` does, but under
/// `policy` (service CPU 0) and with each process's summary line on stderr.
pub fn through_the_stub<'c>(command: &'c mut Command, policy: &str) -> &'c mut Command {
    command
        .env("LD_PRELOAD", stub())
        .env("COREHOP_LIBRARY", library())
        .env("COREHOP_POLICY", policy)
        .env("COREHOP_SERVICE_CPUS", "0")
        .env("COREHOP_STATS_FILE", "-")
}

/// The summary lines on `stderr`, added up (the other lines are the program's).
pub fn summary_on(stderr: &[u8]) -> corehop_sys::wire::Summary {
    let stderr = text(stderr);
    let lines: String = stderr
        .lines()
        .filter(|l| l.starts_with(corehop_sys::wire::SUMMARY_TAG))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(!lines.is_empty(), "no summary line: {stderr}");
    corehop_sys::wire::Summary::parse(&lines).expect("a summary line")
}

/// Records that the calling test could not run here, and why: the line goes to stdout and to
/// `skipped-tests.txt` in cargo's scratch directory for tests, which `scripts/test.sh` prints
/// and counts at the end, so a skip is never mistaken for a pass.
pub fn skip(reason: &str) {
    use std::io::Write;
    println!("skipped: {reason}");
    // The test harness names each test's thread after the test.
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.txt");
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(file, "{} {test}: {reason}", env!("CARGO_PKG_NAME"));
    }
}
