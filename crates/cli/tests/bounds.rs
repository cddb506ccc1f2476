//! Sizes from the command line and from files are bounded before anything that size is
//! allocated (issue 19 item 10): each case must end quickly with a clear error, never abort,
//! panic or grow until the machine runs out of memory.

mod common;

use std::path::Path;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

use common::corehop;

/// The command failed with exit status 1 (an error, not a panic's 101 nor an abort's signal)
/// and said `expected`.
fn assert_refused(args: &[&str], expected: &str) {
    let out = corehop(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {:?}\n{stderr}", out.status);
    assert!(stderr.contains(expected), "{args:?}: expected {expected:?} in:\n{stderr}");
}

#[test]
fn service_cpu_ranges_are_bounded() {
    for list in ["0-18446744073709551615", "0-4000000000", "9999"] {
        assert_refused(&["run", "--offload", "--service-cpus", list, "--", "true"], "at most 8192 CPUs");
    }
}

#[test]
fn machine_files_with_billions_of_cpus_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("huge.toml");
    std::fs::write(&file, "name = \"huge\"\n[[cores]]\ncount = 1000000000\nthreads = 1000\n").unwrap();
    assert_refused(&["topo", "--machine", file.to_str().unwrap()], "at most 8192 CPUs");
}

#[test]
fn predictor_tables_are_bounded() {
    for entries in ["1000000000", "18446744073709551615"] {
        assert_refused(&["predict", "--dm-entries", entries, "--trace", "no-such-trace.csv"], "at most");
    }
    // The timed form keeps a predictor per threshold.
    let thresholds: Vec<String> = (1..=65).map(|n| n.to_string()).collect();
    let thresholds = thresholds.join(",");
    assert_refused(&["predict", "--thresholds", &thresholds, "--trace", "no-such-trace.csv"], "at most 64");
    // A trace larger than 1 GiB is refused before it is read (a sparse file: nothing written).
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("huge.csv");
    std::fs::File::create(&huge).unwrap().set_len((1 << 30) + 1).unwrap();
    assert_refused(&["predict", "--trace", huge.to_str().unwrap()], "split it");
}

#[test]
fn files_that_never_end_are_refused_at_their_bound() {
    // A device has no size to check first: it is read up to the bound, then refused.
    assert_refused(&["sim", "/dev/zero"], "read at most");
    assert_refused(&["topo", "--machine", "/dev/zero"], "read at most");
    assert_refused(&["predict", "--trace", "/dev/zero"], "read at most");
}

#[test]
fn simulated_task_counts_are_bounded() {
    let scenario = Path::new(ROOT).join("scenarios/switch-micro.toml");
    for tasks in ["100000000", "18446744073709551615"] {
        let set = format!("workload.tasks={tasks}");
        let out = corehop(&["sim", scenario.to_str().unwrap(), "--set", &set]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "tasks = {tasks}: {:?}\n{stderr}", out.status);
        assert!(stderr.contains("workload.tasks"), "tasks = {tasks}: {stderr}");
    }
}

#[test]
fn simulated_threads_and_objects_are_bounded() {
    let o2 = Path::new(ROOT).join("scenarios/o2-16core.toml");
    let o2 = o2.to_str().unwrap();
    for threads in ["100000", "4000000000"] {
        let set = format!("workload.threads_per_cpu={threads}");
        assert_refused(&["sim", o2, "--set", &set], "workload.threads_per_cpu");
    }
    // One-byte directories: millions of objects at the sweep's larger sizes, refused before
    // the smaller sizes run.
    assert_refused(&["sim", o2, "--set", "workload.object_bytes=1"], "workload.total_kib");
    let dir = tempfile::tempdir().unwrap();
    let smt = dir.path().join("smt.toml");
    let text = std::fs::read_to_string(Path::new(ROOT).join("scenarios/smt-modes.toml")).unwrap();
    std::fs::write(&smt, text.replacen("threads = 4", "threads = 4000000000", 1)).unwrap();
    assert_refused(&["sim", smt.to_str().unwrap()], "threads in all is too many");
}

#[test]
fn benchmark_counts_are_bounded() {
    // Each of these sizes a buffer (latencies, round-trip times, a channel's queue, task
    // stacks) or a run; past its bound it is refused before anything is measured.
    let cases: [(&[&str], &str); 11] = [
        (&["bench", "offload", "--txns", "99999999999"], "--txns must be between 1 and 10000000"),
        (&["bench", "offload", "--requests", "99999999999"], "--requests must be between 1"),
        (&["bench", "offload", "--reps", "100000000"], "--reps must be between 1 and 10000"),
        (&["bench", "o2", "--tasks-per-cpu", "100000000"], "--tasks-per-cpu must be between 1 and 256"),
        (&["bench", "o2", "--ms", "99999999999"], "--ms must be between 1 and 600000"),
        (&["bench", "o2", "--sizes", "100G"], "--sizes: 100G is more than this run may allocate"),
        (&["bench", "switch", "--iters", "99999999999999"], "--iters must be between 1"),
        (&["bench", "pipeline", "--capacity", "99999999999"], "--capacity must be between 1 and 1048576"),
        (&["bench", "pipeline", "--duration-ms", "0"], "--duration-ms must be between 1"),
        (&["bench", "pipeline", "--speeds", "1e-300"], "outside [0.001, 1]"),
        (&["bench", "delegate", "--reps", "0"], "--reps must be between 1 and 10000"),
    ];
    for (args, expected) in cases {
        assert_refused(args, expected);
    }
}

#[test]
fn an_output_that_cannot_be_written_is_refused_before_the_run() {
    for (args, expected) in [
        (&["bench", "switch", "--plot", "/no/such/folder/s.svg"][..], "there is no folder /no/such/folder"),
        (&["bench", "o2", "--plot", "o2.png"][..], "name the file .svg"),
        (
            &["run", "--offload", "--stats-json", "/no/such/folder/s.json", "--", "echo", "ran"][..],
            "no folder",
        ),
        (&["sim", "no-such.toml", "--csv", "/no/such/folder/runs.csv"][..], "no folder"),
    ] {
        let out = corehop(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}"); // clap's usage error
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?} measured before refusing");
    }
}
