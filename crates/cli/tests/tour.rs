//! `corehop tour`, the README's main job, runs every part and says so.
mod common;

use common::{offload_command, text, two_cpus};

#[test]
fn the_tour_runs_every_part_and_each_says_what_it_found() {
    if !two_cpus("the tour's live parts") {
        return;
    }
    let out = offload_command().arg("tour").output().expect("running corehop tour");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "tour failed: {stdout}\n{}", text(&out.stderr));
    for part in ["machine", "switch", "offload", "predict", "run", "o2", "pipeline", "modes", "sim"] {
        assert!(stdout.contains(&format!("━━ {part}: ")), "no {part} part: {stdout}");
    }
    assert!(stdout.contains("9 of 9 parts ok"), "{stdout}");
    assert!(!stdout.contains("!! "), "a part failed: {stdout}");
    // The unmodified programs printed what they print plain.
    let run = &stdout[stdout.find("━━ run: ").unwrap()..stdout.find("━━ o2: ").unwrap()];
    let rows: Vec<_> = run.lines().filter(|l| l.starts_with("sort") || l.starts_with("dd")).collect();
    assert_eq!(rows.len(), 2, "{run}");
    assert!(rows.iter().all(|r| r.contains(" yes ")), "{run}");
}

#[test]
fn the_tour_sets_the_timed_predictor_beside_the_papers_form_and_the_constant_rule() {
    let stdout = common::stdout_of(&["tour", "--only", "predict"]);
    let row = |name: &str| -> Vec<f64> {
        let line =
            stdout.lines().find(|l| l.trim_start().starts_with(name)).unwrap_or_else(|| panic!("{stdout}"));
        line.split_whitespace().filter_map(|w| w.strip_suffix('%')?.parse().ok()).take(4).collect()
    };
    let (timed, constant) = (row("timed"), row("best constant"));
    assert_eq!((timed.len(), row("the paper's form").len(), constant.len()), (4, 4, 4), "{stdout}");
    // The recorded trace is fixed and the predictor deterministic: the timed form decides
    // better than either constant rule at every N (as `corehop predict` shows on all traces).
    assert!(timed.iter().zip(&constant).all(|(t, c)| t >= c), "{stdout}");
    assert!(stdout.contains("1 of 1 parts ok"), "{stdout}");
}

#[test]
fn a_part_the_tour_does_not_have_is_an_error() {
    let out = common::corehop(&["tour", "--only", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("names no part of the tour; its parts: machine, switch"), "{stderr}");
}

#[test]
fn the_tour_in_json_carries_each_part_s_outcome_and_narrative() {
    let tour = common::json_of(&["tour", "--json", "--only", "predict"]);
    let parts = tour["parts"].as_array().expect("parts");
    assert_eq!(parts.len(), 1, "{tour}");
    let part = &parts[0];
    assert_eq!(part["name"], "predict");
    assert_eq!(part["ok"], true, "{tour}");
    assert!(part["error"].is_null(), "{tour}");
    assert!(part["seconds"].as_f64().is_some_and(|s| s >= 0.0), "{tour}");
    assert!(part["output"].as_str().is_some_and(|o| o.contains("timed (corehop run's)")), "{tour}");
    assert_eq!((tour["ok"].as_u64(), tour["failed"].as_u64()), (Some(1), Some(0)), "{tour}");
    let err = common::error_of(&["tour", "--json", "--only", "nosuchpart"]);
    assert!(err.contains("names no part of the tour"), "{err}");
}
