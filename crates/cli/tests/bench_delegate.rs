//! `corehop bench delegate` end to end: the stable JSON shape, the plot, the table and clear
//! errors. (Checks shape and sanity, never speed.)

mod common;

use common::corehop;

#[test]
fn quick_json_has_the_documented_shape() {
    if !common::two_cpus("bench delegate") {
        return;
    }
    let v = common::json_of(&["bench", "delegate", "--quick", "--json"]);
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["best_batch", "machine", "ops_per_rep", "reps", "results"]);
    for key in ["name", "source", "cpus", "from_cpu", "to_cpu", "from_os_cpu", "to_os_cpu", "clock"] {
        assert!(v["machine"].get(key).is_some(), "machine.{key} missing");
    }
    assert_eq!((v["ops_per_rep"].as_u64(), v["reps"].as_u64()), (Some(2_048), Some(2)));
    let results = v["results"].as_array().unwrap();
    let names: Vec<&str> = results.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "on",
            "submit+wait",
            "submit-64",
            "batch-1",
            "batch-4",
            "batch-16",
            "batch-64",
            "batch-256",
            "ring-64"
        ]
    );
    let ring = results.iter().find(|r| r["name"] == "ring-64").unwrap();
    for r in results {
        let (min, med, max) =
            (r["min_ns"].as_f64().unwrap(), r["median_ns"].as_f64().unwrap(), r["max_ns"].as_f64().unwrap());
        assert!(min > 0.0 && min <= med && med <= max, "{r}");
        assert!(
            (r["mops_per_s"].as_f64().unwrap() - 1e3 / med).abs() < 1e-6 * r["mops_per_s"].as_f64().unwrap()
        );
        assert!(r["ratio_to_ring"].as_f64().unwrap() > 0.0, "{r}");
        // The floor printed next to every row is the ring's own median.
        assert_eq!(r["ring_median_ns"], ring["median_ns"]);
        assert!(r["in_flight"].as_u64().unwrap() >= 1);
    }
    let best = &v["best_batch"];
    assert!(best["name"].as_str().unwrap().starts_with("batch-"), "{best}");
    let best_row = results.iter().find(|r| r["name"] == best["name"]).unwrap();
    for r in results.iter().filter(|r| r["name"].as_str().unwrap().starts_with("batch-")) {
        assert!(r["mops_per_s"].as_f64() <= best_row["mops_per_s"].as_f64(), "{r} beats the best {best}");
    }
}

#[test]
fn quick_table_and_plot() {
    if !common::two_cpus("bench delegate") {
        return;
    }
    let (text, _) = common::plotted(&["bench", "delegate", "--quick"]);
    for needle in ["batch-256", "ring floor", "x ring", "M ops/s", "takeaway"] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
}

#[test]
fn bad_arguments_are_clear_errors() {
    let out = corehop(&["bench", "delegate", "--quick", "--to", "4096"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--to 4096"));
    let out = corehop(&["bench", "delegate", "--from", "1", "--to", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("two different CPUs"));
    let out = corehop(&["bench", "delegate", "--ops", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be between 1 and"));
    let out = corehop(&["bench", "delegate", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("ring-64") && help.contains("--json"), "{help}");
}
