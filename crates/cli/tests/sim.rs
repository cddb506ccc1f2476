//! `corehop sim` end to end: tables, JSON, CSV, plots, overrides, sweeps and bad input.

mod common;

use std::path::{Path, PathBuf};

fn scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios").join(name)
}

use common::{error_of, stdout_of};

#[test]
fn micro_benchmark_prints_the_table_and_the_pivot() {
    let micro = scenario("switch-micro.toml");
    let (out, bars) = common::plotted(&["sim", micro.to_str().unwrap(), "--set", "workload.iterations=50"]);
    assert!(bars.contains("switch-cs-quarter / wakeup"), "one labelled bar per run");
    assert!(out.contains("switch-micro"), "{out}");
    assert!(out.contains("ns per call by machine.preset and workload.mechanism"), "{out}");
    // The pivot comes last: one row per machine, one column per mechanism.
    let pivot = out.lines().rfind(|l| l.starts_with("switch-cs-quarter ")).unwrap();
    assert_eq!(pivot.split_whitespace().count(), 7, "{pivot}");
}

#[test]
fn json_is_deterministic_and_complete() {
    let mix = scenario("switch-syscall-mix.toml");
    let args = ["sim", mix.to_str().unwrap(), "--set", "workload.iterations=100", "--json"];
    let a = stdout_of(&args);
    assert_eq!(a, stdout_of(&args), "same seed, same output");
    let v: serde_json::Value = serde_json::from_str(&a).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 16);
    assert_eq!(runs[0]["settings"][0]["key"], "machine.preset");
    assert_eq!(runs[0]["settings"][1]["value"], "none");
    let report = &runs[5]["report"];
    assert_eq!(report["ops"], 100);
    assert_eq!(report["cpus"].as_array().unwrap().len(), 2);
    assert_eq!(report["model"]["metrics"][0]["name"], "ns per call");
    assert!(report["hops"].as_u64().unwrap() > 0);

    let other_seed = stdout_of(&[
        "sim",
        mix.to_str().unwrap(),
        "--set",
        "workload.iterations=100",
        "--json",
        "--seed",
        "9",
    ]);
    assert_ne!(a, other_seed, "a different seed changes random lengths");
}

#[test]
fn csv_plot_and_numeric_sweeps() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("out.csv");
    let svg = dir.path().join("out.svg");
    let micro = scenario("switch-micro.toml");
    let out = stdout_of(&[
        "sim",
        micro.to_str().unwrap(),
        "--set",
        "machine.preset=switch-cs-quarter",
        "--set",
        "workload.iterations=20",
        "--sweep",
        "machine.preset=switch-cs-quarter",
        "--sweep",
        "workload.mechanism=fastpath,wakeup",
        "--sweep",
        "costs.wake_delay_cycles=0,1000",
        "--csv",
        csv.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(out.contains("wake_delay_cycles"), "{out}");
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(lines[0].starts_with("machine.preset,workload.mechanism,costs.wake_delay_cycles,scenario"));
    // The wake-up delay shows on V3 (IPI to a sleeping core) by about 333 + 1333 ns per call.
    let ns = |line: &str| -> f64 {
        line.split(',')
            .nth(lines[0].split(',').position(|h| h == "ns per call (ns)").unwrap())
            .unwrap()
            .parse()
            .unwrap()
    };
    let v3 = ns(lines[2]) - ns(lines[1]);
    assert!((v3 - 1666.0).abs() < 2.0, "{v3}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
}

#[test]
fn list_shows_models_and_presets() {
    let out = stdout_of(&["sim", "--list"]);
    assert!(
        out.contains("switch") && out.contains("switch-cs-quarter") && out.contains("o2-16core"),
        "{out}"
    );
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

const GOOD: &str = "[machine]\npreset = \"switch-cs\"\n[workload]\nkind = \"switch\"\nmechanism = \"spin\"\niterations = 5\n";

#[test]
fn bad_input_names_file_key_and_problem() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("unknown.toml", format!("{GOOD}colour = \"red\"\n"), "workload.colour: unknown key"),
        (
            "negative.toml",
            format!("{GOOD}[costs]\nmem_latency_ns = -25\n"),
            "costs.mem_latency_ns: must not be negative",
        ),
        (
            "cpu.toml",
            format!("{GOOD}service_cpus = [7]\n"),
            "workload.service_cpus[0]: CPU 7 is out of range",
        ),
        ("preset.toml", GOOD.replace("switch-cs", "cray-1"), "machine.preset: bad machine"),
        ("syntax.toml", "[machine\n".to_string(), "line 1: not valid TOML"),
        ("kind.toml", GOOD.replace("\"switch\"", "\"warp\""), "workload.kind: unknown workload kind"),
    ];
    for (name, text, expected) in cases {
        let path = write(dir.path(), name, &text);
        let err = error_of(&["sim", path.to_str().unwrap()]);
        assert!(err.contains(path.to_str().unwrap()), "{name}: {err}");
        assert!(err.contains(expected), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
    let good = write(dir.path(), "good.toml", GOOD);
    let single = stdout_of(&["sim", good.to_str().unwrap()]);
    assert!(single.contains("1 run") && single.contains("calls hopped: 1.0000 fraction"), "{single}");
    let err = error_of(&["sim", good.to_str().unwrap(), "--set", "workload.tasks=-1"]);
    assert!(err.contains("workload.tasks"), "{err}");
    let err = error_of(&["sim", good.to_str().unwrap(), "--sweep", "nothing"]);
    assert!(err.contains("key=a,b,c"), "{err}");
    let err = error_of(&["sim", "/nonexistent/scenario.toml"]);
    assert!(err.contains("/nonexistent/scenario.toml: (file): cannot read the file"), "{err}");
}

#[test]
fn set_overrides_a_swept_key_and_is_validated() {
    let mix = scenario("switch-syscall-mix.toml");
    let mix = mix.to_str().unwrap();
    // The file sweeps workload.mechanism: --set replaces the sweep, and a bad value is an error.
    let err = error_of(&["sim", mix, "--set", "workload.mechanism=teleport"]);
    assert!(err.contains("workload.mechanism") && err.contains("teleport"), "{err}");
    let out: serde_json::Value = serde_json::from_str(&stdout_of(&[
        "sim",
        mix,
        "--set",
        "workload.mechanism=spin",
        "--set",
        "workload.iterations=20",
        "--json",
    ]))
    .unwrap();
    // Four presets, one mechanism: the file's sweep of four mechanisms is pinned to `spin`.
    let runs = out["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "{out}");
    for run in runs {
        let mechanism = run["settings"].as_array().unwrap().iter().find(|s| s["key"] == "workload.mechanism");
        assert_eq!(mechanism.map(|s| &s["value"]), Some(&serde_json::json!("spin")), "{run}");
    }
}

#[test]
fn impossible_workloads_are_errors_not_wrong_answers() {
    let micro = scenario("switch-micro.toml");
    let micro = micro.to_str().unwrap();
    let err = error_of(&["sim", micro, "--set", "workload.iterations=0"]);
    assert!(err.contains("workload.iterations: must be at least 1"), "{err}");
    let err = error_of(&["sim", micro, "--set", "workload.calls=[{name=\"x\",length={fixed=1e18}}]"]);
    assert!(err.contains("workload.calls[0].length") && err.contains("too large"), "{err}");
    let err =
        error_of(&["sim", micro, "--set", "workload.app_cpus=[0]", "--set", "workload.service_cpus=[0]"]);
    assert!(err.contains("CPU 0 is also in workload.app_cpus"), "{err}");
    let offload = scenario("offload-threshold.toml");
    let err = error_of(&["sim", offload.to_str().unwrap(), "--set", "workload.iterations=0"]);
    assert!(err.contains("workload.iterations: must be at least 1"), "{err}");
}

#[test]
fn parallel_sweeps_print_exactly_what_serial_ones_do() {
    let threshold = scenario("offload-threshold.toml");
    let dir = tempfile::tempdir().unwrap();
    let run = |jobs: &str, json: bool| {
        let csv = dir.path().join(format!("j{jobs}.csv"));
        let mut args = vec![
            "sim",
            threshold.to_str().unwrap(),
            "--set",
            "workload.iterations=400",
            "--sweep",
            "seed=1,2",
            "--jobs",
            jobs,
            "--csv",
            csv.to_str().unwrap(),
        ];
        if json {
            args.push("--json");
        }
        (stdout_of(&args), std::fs::read_to_string(&csv).unwrap())
    };
    let (serial_json, serial_csv) = run("1", true);
    assert_eq!(serial_json.matches("\"settings\"").count(), 48, "3 latencies x 8 thresholds x 2 seeds");
    for jobs in ["2", "7"] {
        assert_eq!(run(jobs, true), (serial_json.clone(), serial_csv.clone()), "--jobs {jobs} --json");
    }
    assert_eq!(run("1", false), run("2", false), "the tables too");
    // The first failing point in point order is the error, whatever the thread count.
    let bad = ["sim", threshold.to_str().unwrap(), "--sweep", "workload.app_cpus=[0],[9]"];
    let serial = error_of(&[&bad[..], &["--jobs", "1"]].concat());
    assert!(serial.contains("workload.app_cpus[0]: CPU 9 is out of range"), "{serial}");
    assert_eq!(serial, error_of(&[&bad[..], &["--jobs", "2"]].concat()));
}
