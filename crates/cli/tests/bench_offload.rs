//! `corehop bench offload` end to end on tiny runs: the JSON shape, the baseline, the
//! policies' offload shares, and clear errors for bad flags. No assertion on speed.

mod common;

use common::corehop;

/// `corehop bench offload` on a tiny run (2 repetitions of 8 transactions and 40 requests),
/// with `extra` arguments.
const TINY_OFFLOAD: [&str; 8] = ["bench", "offload", "--reps", "2", "--txns", "8", "--requests", "40"];

fn tiny_offload(extra: &[&str]) -> std::process::Output {
    corehop(&[&TINY_OFFLOAD[..], extra].concat())
}

#[test]
fn tiny_run_reports_every_policy_against_never() {
    let (stdout, _) =
        common::plotted(&[&TINY_OFFLOAD[..], &["--policies", "always,size,predicted", "--json"]].concat());
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(v["hop_round_trip_ns"].as_u64().unwrap() > 0);
    let rows = v["results"].as_array().unwrap();
    let names: Vec<String> = rows
        .iter()
        .map(|r| format!("{} {}", r["workload"].as_str().unwrap(), r["policy"].as_str().unwrap()))
        .collect();
    assert_eq!(
        names,
        [
            "sqlite never",
            "sqlite always",
            "sqlite size",
            "sqlite predicted",
            "files never",
            "files always",
            "files size",
            "files predicted",
            "files-tasks never",
            "files-tasks always",
            "files-tasks size",
            "files-tasks predicted"
        ]
    );
    for r in rows {
        let policy = r["policy"].as_str().unwrap();
        let offloaded = r["offloaded"].as_f64().unwrap();
        match policy {
            "never" => {
                assert_eq!(offloaded, 0.0);
                assert_eq!(r["vs_never"].as_f64().unwrap(), 1.0);
                assert_eq!(r["paired_vs_never"].as_f64().unwrap(), 1.0);
                assert_eq!(r["service_busy"].as_f64().unwrap(), 0.0);
            }
            "always" => assert_eq!(offloaded, 1.0),
            // SQLite: only COMMIT (1 of 6 statements) is a listed call; files: recv/openat/fstat/
            // send always, sendfile only from 4 KB.
            "size" if r["workload"] == "sqlite" => {
                assert!((offloaded - 1.0 / 6.0).abs() < 1e-9, "{offloaded}")
            }
            _ => assert!((0.0..=1.0).contains(&offloaded)),
        }
        // An adaptive policy is held against the best fixed rule of its workload.
        let best = &r["best_fixed"];
        if policy == "predicted" {
            let fixed: Vec<&serde_json::Value> = rows
                .iter()
                .filter(|f| f["workload"] == r["workload"] && f["policy"] != "predicted")
                .collect();
            let top = fixed.iter().map(|f| f["throughput"]["median"].as_f64().unwrap()).fold(0.0, f64::max);
            let named = fixed.iter().find(|f| f["policy"] == best["policy"]).expect("a fixed rule that ran");
            assert_eq!(named["throughput"]["median"].as_f64().unwrap(), top, "{best}");
            let ratio = r["throughput"]["median"].as_f64().unwrap() / top;
            assert!((best["ratio"].as_f64().unwrap() - ratio).abs() < 1e-9, "{best}");
            let paired = best["paired_ratio"].as_f64().unwrap();
            assert!(paired > 0.0);
            // Two repetitions: the interval is the range of their ratios, around their mean.
            let interval = &best["paired_interval"];
            let (low, high) = (interval["low"].as_f64().unwrap(), interval["high"].as_f64().unwrap());
            assert!(low <= paired && paired <= high, "{best}");
            assert_eq!(interval["coverage"], 0.5, "{best}");
        } else {
            assert!(best.is_null(), "a fixed rule is not held against itself: {best}");
        }
        assert!(r["head_to_head"].is_null(), "no tuned, no head-to-head runs: {r}");
        let t = &r["throughput"];
        assert_eq!(t["samples"], 2);
        assert!(t["min"].as_f64().unwrap() <= t["median"].as_f64().unwrap());
        assert!(r["p50_ns"].as_f64().unwrap() <= r["p99_ns"].as_f64().unwrap());
        let mean = r["mean_ns"].as_f64().unwrap();
        assert!(mean > 0.0 && mean.is_finite(), "the mean latency: {r}");
        let ops = if r["workload"] == "sqlite" { 16 } else { 80 };
        assert_eq!(r["ops"], ops, "every policy does the same work");
    }
}

#[test]
fn recorded_traces_replay_in_predict() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("run");
    common::stdout_of(&[
        "bench",
        "offload",
        "--quick",
        "--policies",
        "never",
        "--txns",
        "5",
        "--requests",
        "20",
        "--record-trace",
        prefix.to_str().unwrap(),
    ]);
    for (workload, calls) in [("sqlite", 5 * 6), ("files", 20 * 5)] {
        let trace = dir.path().join(format!("run-{workload}.csv"));
        let text = std::fs::read_to_string(&trace).unwrap();
        assert_eq!(text.lines().count(), 1 + calls, "{workload}: header + one line per call");
        let v = common::json_of(&["predict", "--trace", trace.to_str().unwrap(), "--json"]);
        assert_eq!(v[0]["calls"], calls);
        assert_eq!(v[0]["format"], "csv");
    }
}

#[test]
fn table_output_names_the_baseline() {
    let text = common::stdout_of(&[
        "bench",
        "offload",
        "--quick",
        "--workloads",
        "files",
        "--policies",
        "always",
        "--requests",
        "20",
    ]);
    assert!(text.contains("same-run baseline") && text.contains("×never"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("files") && l.contains("always")), "{text}");
}

#[test]
fn bad_flags_are_clear_errors() {
    for (args, needle) in [
        (vec!["--policies", "sometimes"], "unknown policy \"sometimes\""),
        (vec!["--workloads", "tpcc"], "unknown workload \"tpcc\""),
        (vec!["--reps", "0"], "--reps must be between 1 and 10000"),
        (vec!["--head-to-head", "99999"], "--head-to-head must be between 0 and 10000"),
        (vec!["--app-cpu", "4000"], "--app-cpu 4000 is not one this process may use"),
        (vec!["--service-cpu", "4000"], "service CPU 4000 is not one this process may run on"),
    ] {
        let mut full = vec!["bench", "offload"];
        full.extend(args);
        let out = corehop(&full);
        assert!(!out.status.success(), "{full:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{full:?}: {err}");
    }
}

/// The hand-off table: corehop's service core next to io_uring (SQPOLL and plain enter) for
/// the same calls, or a skip line naming why io_uring is missing. Shapes only, never speed.
#[test]
fn handoff_rows_put_the_service_core_next_to_io_uring_or_say_why_not() {
    // A workload named twice runs once.
    let quick = [
        "bench",
        "offload",
        "--quick",
        "--workloads",
        "files,files",
        "--policies",
        "never",
        "--requests",
        "10",
    ];
    let mut json = quick.to_vec();
    json.push("--json");
    let out = corehop(&json);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["results"].as_array().unwrap().len(), 1, "{v}");
    let handoff = &v["handoff"];
    let rows = handoff["rows"].as_array().unwrap();
    let skipped: Vec<&str> =
        handoff["skipped"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
    let has =
        |mechanism: &str, call: &str| rows.iter().any(|r| r["mechanism"] == mechanism && r["call"] == call);
    for call in ["empty", "fstat", "pread 4 KiB"] {
        assert!(has("offload", call), "offload {call} missing: {rows:?}");
    }
    for mechanism in ["sqpoll", "enter"] {
        let measured = ["empty", "pread 4 KiB"].iter().all(|call| has(mechanism, call));
        let said_why = skipped.iter().any(|s| s.contains(mechanism) && s.contains("skipped"));
        assert!(measured || said_why, "{mechanism}: neither rows nor a skip line: {handoff}");
        if !measured {
            common::skip(&format!("io_uring {mechanism} unavailable here: {skipped:?}"));
        }
    }
    for r in rows {
        let t = &r["round_trip_ns"];
        assert_eq!(t["samples"], 3, "--quick runs three batches of each row");
        assert!(t["min"].as_f64().unwrap() > 0.0 && t["min"].as_f64().unwrap() <= t["max"].as_f64().unwrap());
        if has("sqpoll", r["call"].as_str().unwrap()) {
            assert!(r["vs_sqpoll"].as_f64().is_some(), "{r}");
        }
    }

    let out = corehop(&quick);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("Hand-off round trips") && text.contains("same-run baseline: io_uring SQPOLL"),
        "{text}"
    );
    assert!(text.lines().any(|l| l.starts_with("empty") && l.contains("offload")), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("empty") && l.contains("sqpoll"))
            || text.contains("sqpoll: skipped"),
        "{text}"
    );
}

#[test]
fn tuned_says_which_arm_each_repetition_ended_in_and_meets_the_best_rule_again() {
    let out = tiny_offload(&[
        "--workloads",
        "sqlite,files",
        "--policies",
        "always,tuned",
        "--handoff-reps",
        "0",
        "--head-to-head",
        "3",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for r in v["results"].as_array().unwrap() {
        let ended: Vec<&str> =
            r["ended_on"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        match r["policy"].as_str().unwrap() {
            "tuned" => {
                assert_eq!(ended.len(), 2, "{r}");
                assert!(ended.iter().all(|arm| !arm.is_empty()), "{r}");
                assert_eq!(r["sampling_rounds"].as_array().map(Vec::len), Some(2), "{r}");
                // Measured again beside the rule that won the sweep, three pairs.
                let h = &r["head_to_head"];
                assert_eq!(h["policy"], r["best_fixed"]["policy"], "{r}");
                assert_eq!(h["pairs"], 3);
                assert_eq!(h["throughput"]["samples"], 3);
                assert_eq!(h["fixed_throughput"]["samples"], 3);
                let medians = h["throughput"]["median"].as_f64().unwrap()
                    / h["fixed_throughput"]["median"].as_f64().unwrap();
                assert!((h["ratio"].as_f64().unwrap() - medians).abs() < 1e-9, "{h}");
                let interval = &h["paired_interval"];
                let paired = h["paired_ratio"].as_f64().unwrap();
                assert!(interval["low"].as_f64().unwrap() <= paired, "{h}");
                assert!(paired <= interval["high"].as_f64().unwrap(), "{h}");
            }
            _ => {
                assert!(ended.is_empty(), "{r}");
                assert_eq!(r["sampling_rounds"].as_array().map(Vec::len), Some(0), "{r}");
                assert!(r["head_to_head"].is_null(), "{r}");
            }
        }
    }
    // Without pairs, no head-to-head.
    let v = common::json_of(
        &[
            &TINY_OFFLOAD[..],
            &["--workloads", "files", "--policies", "tuned", "--head-to-head", "0", "--json"],
        ]
        .concat(),
    );
    assert!(v["results"].as_array().unwrap().iter().all(|r| r["head_to_head"].is_null()), "{v}");
}
