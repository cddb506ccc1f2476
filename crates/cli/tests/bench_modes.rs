//! `corehop bench modes`: refuses clearly without SMT, runs the live logic on a described SMT
//! layout, and rejects bad input with a message naming it.

mod common;
use std::process::Output;

use corehop_policy::smt::SmtLayout;

use common::corehop;

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "corehop failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

fn machine_file(dir: &tempfile::TempDir, name: &str, cores: &[usize]) -> String {
    let cpus: Vec<String> = cores
        .iter()
        .enumerate()
        .map(|(os_id, core)| {
            format!("{{ os_id = {os_id}, core = {core}, package = 0, class = \"uniform\", speed = 1.0 }}")
        })
        .collect();
    let path = dir.path().join(name);
    std::fs::write(&path, format!("name = \"{name}\"\ncpus = [{}]\n", cpus.join(", "))).unwrap();
    path.display().to_string()
}

fn usable_cpus() -> usize {
    corehop_runtime::sys::affinity().map_or(0, |c| c.len())
}

#[test]
fn without_smt_it_says_so_and_points_to_the_simulator() {
    let dir = tempfile::tempdir().unwrap();
    let two_cores = machine_file(&dir, "two-cores.toml", &[0, 1]);
    let v = json(&corehop(&["bench", "modes", "--machine", &two_cores, "--json"]));
    assert_eq!(v["supported"], false);
    assert_eq!(v["see"], "corehop sim scenarios/smt-modes.toml");
    assert!(v["reason"].as_str().unwrap().contains("no SMT core"), "{v}");
    let text = corehop(&["bench", "modes", "--machine", &two_cores]);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("cannot be measured live") && text.contains("corehop sim scenarios/smt-modes.toml"),
        "{text}"
    );
    // A plot asked for is not drawn, and that is said (on stderr: `--json` stays one document).
    let svg = dir.path().join("modes.svg");
    let out =
        corehop(&["bench", "modes", "--machine", &two_cores, "--json", "--plot", svg.to_str().unwrap()]);
    assert_eq!(json(&out)["supported"], false);
    assert!(!svg.exists());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no plot written to") && stderr.contains("modes.svg"), "{stderr}");
}

#[test]
fn on_this_host_without_smt_it_refuses_with_exit_0() {
    let host = corehop_topology::discover().expect("discover");
    if SmtLayout::from_machine(&host).has_smt() {
        common::skip("this host has SMT, so `bench modes` would measure live (about a minute)");
        return;
    }
    let v = json(&corehop(&["bench", "modes", "--json"]));
    assert_eq!(v["supported"], false);
}

#[test]
fn emulated_smt_layout_runs_every_mode() {
    if usable_cpus() < 2 {
        common::skip(&format!("needs 2 CPUs to declare siblings, this process may use {}", usable_cpus()));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let smt = machine_file(&dir, "emulated.toml", &[0, 0]);
    let v = json(&corehop(&["bench", "modes", "--machine", &smt, "--quick", "--json", "--irq-rate", "2000"]));
    assert_eq!((v["supported"].as_bool(), v["emulated"].as_bool()), (Some(true), Some(true)));
    let modes: Vec<&str> =
        v["modes"].as_array().unwrap().iter().map(|m| m["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["UP", "SMP", "AMP", "hybrid"]);
    for m in v["modes"].as_array().unwrap() {
        let makespan = &m["makespan_ms"];
        assert!(makespan["min"].as_f64().unwrap() > 0.0 && makespan["samples"] == 1, "{m}");
        assert!(m["fp_ms"].as_f64().unwrap() > 0.0 && m["chase_ms"].as_f64().unwrap() > 0.0, "{m}");
    }
    assert_eq!(v["modes"][0]["vs_up"].as_f64(), Some(1.0));
    let classes: Vec<&str> =
        v["classes"].as_array().unwrap().iter().map(|c| c["app"].as_str().unwrap()).collect();
    assert_eq!(classes, ["fp", "chase"]);
}

#[test]
fn bad_input_is_a_clear_error() {
    let cases: [(&[&str], &str); 4] = [
        (&["bench", "modes", "--reps", "0"], "--reps must be between 1 and 10000"),
        (&["bench", "modes", "--irq-rate=-5"], "--irq-rate must be >= 0"),
        (&["bench", "modes", "--work-ms", "0"], "--work-ms must be > 0"),
        (&["bench", "modes", "--machine", "/nonexistent/smt.toml"], "/nonexistent/smt.toml"),
    ];
    for (args, message) in cases {
        let out = corehop(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(message), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
