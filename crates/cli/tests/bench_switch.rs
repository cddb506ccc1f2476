//! `corehop bench switch` end to end: the stable JSON shape, the plot, and clear errors.
//! (Checks shape and sanity, never speed.)

mod common;

use common::corehop;

#[test]
fn quick_json_has_the_documented_shape() {
    if !common::two_cpus("bench switch") {
        return;
    }
    let v = common::json_of(&["bench", "switch", "--quick", "--json"]);
    let obj = v.as_object().unwrap();
    assert_eq!(obj.keys().collect::<Vec<_>>(), ["machine", "results"]);
    for key in ["name", "source", "cpus", "from_cpu", "to_cpu", "from_os_cpu", "to_os_cpu", "clock"] {
        assert!(v["machine"].get(key).is_some(), "machine.{key} missing");
    }
    let results = v["results"].as_array().unwrap();
    let names: Vec<&str> = results.iter().map(|r| r["name"].as_str().unwrap()).collect();
    for required in [
        "floor",
        "floor-with-state",
        "gettid",
        "yield",
        "affinity",
        "handoff+spin",
        "handoff+park",
        "handoff+spin-then-park",
        "handoff+park-after-idle",
        "handoff+spin-after-idle",
        "handoff+spin-then-park-after-idle",
        "on",
    ] {
        assert!(names.contains(&required), "{required} missing from {names:?}");
    }
    for r in results {
        let (min, med, max) =
            (r["min_ns"].as_f64().unwrap(), r["median_ns"].as_f64().unwrap(), r["max_ns"].as_f64().unwrap());
        assert!(min > 0.0 && min <= med && med <= max, "{r}");
        assert!(r["ratio_to_floor"].as_f64().unwrap() > 0.0);
        assert_eq!(r.get("calls_per_s").is_some(), r["name"] == "on", "{r}");
    }
    let floor = results.iter().find(|r| r["name"] == "floor").unwrap();
    assert!((floor["ratio_to_floor"].as_f64().unwrap() - 1.0).abs() < 1e-9);
}

#[test]
fn table_and_plot() {
    if !common::two_cpus("bench switch") {
        return;
    }
    let (text, _) = common::plotted(&["bench", "switch", "--quick"]);
    assert!(text.contains("handoff+spin-then-park") && text.contains("x floor") && text.contains("takeaway"));
    assert!(text.contains("after 20 µs idle: spin-then-park"), "{text}");
}

#[test]
fn the_adaptive_spin_after_idle_is_shown_against_both_of_its_arms() {
    if !common::two_cpus("bench switch") {
        return;
    }
    let rows = "handoff+park-after-idle,handoff+spin-after-idle,handoff+spin-then-park-after-idle";
    let out = corehop(&["bench", "switch", "--quick", "--rows", rows, "--idle-gap-us", "50"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("after 50 µs idle:")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("x sleeping at once") && line.contains("x polling throughout"), "{line}");
    // Without one of the arms there is nothing to hold the adaptive row against.
    let out = corehop(&["bench", "switch", "--quick", "--rows", "handoff+spin-then-park-after-idle"]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("idle: spin-then-park"));
}

#[test]
fn bad_cpus_are_clear_errors() {
    let out = corehop(&["bench", "switch", "--quick", "--to", "4096"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--to 4096"), "{err}");
    let out = corehop(&["bench", "switch", "--quick", "--from", "1", "--to", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("two different CPUs"));
}

#[test]
fn rows_measures_only_the_named_rows_and_the_floor() {
    if !common::two_cpus("bench switch") {
        return;
    }
    let v = common::json_of(&["bench", "switch", "--quick", "--json", "--rows", "yield,on"]);
    let names: Vec<&str> =
        v["results"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["floor", "yield", "on"]);
    let out = corehop(&["bench", "switch", "--quick", "--rows", "handoff+nothing"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("handoff+spin"),
        "the error lists the rows there are"
    );
}
