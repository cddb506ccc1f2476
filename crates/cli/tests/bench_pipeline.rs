//! `corehop bench pipeline` end to end on tiny runs: the JSON shape, the same-run baseline,
//! intact frames, the controller row, and clear errors for bad flags. No assertion on speed.

mod common;

use common::corehop;

#[test]
fn tiny_run_reports_every_configuration_against_the_first() {
    let (stdout, _) = common::plotted(&[
        "bench",
        "pipeline",
        "--placements",
        "one-core,split,smt",
        "--speeds",
        "1,0.5",
        "--idle",
        "park,poll-then-park",
        "--duration-ms",
        "30",
        "--reps",
        "2",
        "--epoch-ms",
        "10",
        "--head-to-head",
        "3",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let cpus = v["cpus"].as_u64().unwrap();
    let rows = v["rows"].as_array().unwrap();
    let fixed = if cpus >= 2 { 2 } else { 1 } * 2 * 2;
    assert_eq!(rows.len(), fixed + 1, "placements × speeds × idle modes, then the controller");
    assert_eq!(rows[0]["placement"], "one-core");
    assert_eq!(rows[0]["idle"], "park");
    assert_eq!(rows[0]["vs_baseline"].as_f64().unwrap(), 1.0);
    for r in rows {
        assert_eq!(r["bad_frames"], 0, "every frame passed the checksum and order checks: {r}");
        assert_eq!(r["throughput_fps"]["samples"], 2);
        assert_eq!(r["layout"].as_array().unwrap().len(), 4);
        for c in ["driver", "ip", "tcp", "app"] {
            assert!(r["utilisation"][c].as_f64().unwrap() >= 0.0);
        }
    }
    assert_eq!(rows[1]["speeds"][0].as_f64().unwrap(), 1.0);
    assert_eq!(rows[2]["speeds"][0].as_f64().unwrap(), 0.5);
    assert_eq!(rows.last().unwrap()["placement"], "controller");
    let best =
        rows[..fixed].iter().map(|r| r["throughput_fps"]["median"].as_f64().unwrap()).fold(0.0, f64::max);
    let controller = rows[fixed]["throughput_fps"]["median"].as_f64().unwrap();
    let ratio = v["controller_vs_best_fixed"].as_f64().unwrap();
    assert!((ratio - controller / best).abs() < 1e-9, "{ratio} vs {controller} / {best}");
    let paired = v["controller_paired_vs_best_fixed"].as_f64().unwrap();
    assert!(paired > 0.0);
    // Two repetitions: the interval is the range of their two ratios, around their mean.
    let interval = &v["controller_paired_interval"];
    assert!(interval["low"].as_f64().unwrap() <= paired && paired <= interval["high"].as_f64().unwrap());
    assert_eq!(interval["coverage"], 0.5, "{interval}");
    let settled = v["controller_settled"].as_array().unwrap();
    assert_eq!(settled.len(), 2, "one layout a repetition: {settled:?}");
    assert_eq!(settled[1]["layout"], rows[fixed]["layout"], "the row shows the last repetition's");
    let h = &v["head_to_head"];
    let best_row =
        rows[..fixed].iter().find(|r| r["throughput_fps"]["median"].as_f64().unwrap() == best).unwrap();
    assert_eq!(h["placement"], best_row["placement"], "the sweep's best row is measured again: {h}");
    assert_eq!(h["idle"], best_row["idle"]);
    assert_eq!(h["speed"], best_row["speeds"][0]);
    assert_eq!(h["controller_fps"]["samples"], 3);
    assert_eq!(h["fixed_fps"]["samples"], 3);
    assert_eq!(h["controller_settled"].as_array().unwrap().len(), 3);
    let (c, f) =
        (h["controller_fps"]["median"].as_f64().unwrap(), h["fixed_fps"]["median"].as_f64().unwrap());
    assert!((h["ratio"].as_f64().unwrap() - c / f).abs() < 1e-9, "{h}");
    let paired = h["paired_ratio"].as_f64().unwrap();
    assert!(paired > 0.0);
    // Three pairs: the range of their ratios holds the median with chance 3/4.
    let interval = &h["paired_interval"];
    assert!(interval["low"].as_f64().unwrap() <= paired && paired <= interval["high"].as_f64().unwrap());
    assert_eq!(interval["coverage"], 0.75, "{interval}");
    let skipped = v["skipped"].as_array().unwrap();
    assert!(skipped.iter().any(|s| s["placement"] == "smt") || cpus >= 2, "{skipped:?}");
}

#[test]
fn the_table_names_the_baseline_and_skipped_placements() {
    let text = common::stdout_of(&[
        "bench",
        "pipeline",
        "--placements",
        "one-core,dedicated",
        "--speeds",
        "1",
        "--idle",
        "poll",
        "--duration-ms",
        "20",
        "--reps",
        "1",
        "--no-controller",
    ]);
    assert!(text.contains("×base"), "{text}");
    assert!(text.contains("refused by a checksum or order check: 0"), "{text}");
    assert!(!text.contains("controller"), "no controller row, no comparison: {text}");
    assert!(!text.contains("Head to head"), "no controller, no head-to-head runs: {text}");
}

#[test]
fn bad_flags_are_clear_errors() {
    for (args, expect) in [
        (&["--speeds", "0"][..], "outside [0.001, 1]"),
        (&["--speeds", "1.5"][..], "outside [0.001, 1]"),
        (&["--placements", "everywhere"][..], "unknown placement \"everywhere\""),
        (&["--idle", "nap"][..], "unknown idle mode \"nap\""),
        (&["--reps", "0"][..], "--reps must be between 1 and 10000"),
        (&["--capacity", "0"][..], "--capacity must be between 1 and"),
        (&["--rate=-5"][..], "--rate must be a positive"),
        (&["--head-to-head", "99999"][..], "--head-to-head must be between 0 and 10000"),
    ] {
        let mut all = vec!["bench", "pipeline", "--duration-ms", "5"];
        all.extend_from_slice(args);
        let out = corehop(&all);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
