//! Public-API tests of the simulator: determinism, invariants under random scenarios, the
//! checked-in scenarios, and bad input.

use corehop_sim::models::{self, switch::Switch};
use corehop_sim::{FromScenario, Problem, Report, ScenarioDoc};
use proptest::prelude::*;

fn scenarios_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios")
}

/// Every point of a scenario file, run, as JSON (what `corehop sim --json` prints per run).
fn run_file_json(name: &str, sets: &[&str]) -> String {
    let mut doc = ScenarioDoc::load(&scenarios_dir().join(name)).unwrap();
    for s in sets {
        doc.set(s).unwrap();
    }
    let reports: Vec<Report> = doc
        .expand(&[])
        .unwrap()
        .iter()
        .map(|p| models::run_scenario(&p.scenario, &mut |_| {}).unwrap())
        .collect();
    serde_json::to_string(&reports).unwrap()
}

#[test]
fn same_seed_gives_identical_output() {
    let a = run_file_json("switch-syscall-mix.toml", &["workload.iterations=300"]);
    let b = run_file_json("switch-syscall-mix.toml", &["workload.iterations=300"]);
    assert_eq!(a, b);
}

#[test]
fn different_seed_gives_different_output() {
    let a = run_file_json("switch-syscall-mix.toml", &["workload.iterations=300", "seed=1"]);
    let b = run_file_json("switch-syscall-mix.toml", &["workload.iterations=300", "seed=2"]);
    assert_ne!(a, b);
}

#[test]
fn every_checked_in_scenario_runs() {
    for entry in std::fs::read_dir(scenarios_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with('#'),
            "{} must open with a comment saying what it reproduces",
            path.display()
        );
        let mut doc = ScenarioDoc::load(&path).unwrap();
        // Keep it quick: only the first point, with an event budget, counting from the start.
        doc.set("run.max_events=200000").unwrap();
        if text.contains("\nwarmup_us") {
            doc.set("workload.warmup_us=0").unwrap();
        }
        let point = doc.expand(&[]).unwrap().remove(0);
        let report = models::run_scenario(&point.scenario, &mut |_| {}).unwrap();
        assert!(report.ops > 0, "{}: no operation completed", path.display());
    }
}

#[test]
fn the_micro_benchmark_keeps_the_papers_ordering() {
    // Table 2(b): on every two-core configuration V1 > V2 > V3 > V4, and none is cheapest.
    let mut doc = ScenarioDoc::load(&scenarios_dir().join("switch-micro.toml")).unwrap();
    doc.set("workload.iterations=200").unwrap();
    let points = doc.expand(&[]).unwrap();
    for preset in ["switch-cc", "switch-ss", "switch-cs", "switch-cs-quarter"] {
        let ns = |mechanism: &str| {
            let p = points
                .iter()
                .find(|p| {
                    p.settings[0].1.as_str() == Some(preset) && p.settings[1].1.as_str() == Some(mechanism)
                })
                .unwrap();
            models::run_scenario(&p.scenario, &mut |_| {}).unwrap().headline().unwrap().value
        };
        let v: Vec<f64> = ["none", "affinity", "handoff", "fastpath", "spin"].iter().map(|m| ns(m)).collect();
        assert!(v[0] < v[4] && v[4] < v[3] && v[3] < v[2] && v[2] < v[1], "{preset}: {v:?}");
    }
}

#[test]
fn unknown_kind_is_named() {
    let text = "[machine]\npreset = \"switch-cc\"\n[workload]\nkind = \"teleport\"";
    let s = ScenarioDoc::parse("k.toml", text).unwrap().validate().unwrap();
    let e = models::run_scenario(&s, &mut |_| {}).unwrap_err();
    assert_eq!(e.key, "workload.kind");
    assert!(matches!(e.problem, Problem::UnknownKind { .. }));
    assert!(e.to_string().contains("switch"), "{e}");
}

#[test]
fn missing_file_is_an_io_error() {
    let e = ScenarioDoc::load(std::path::Path::new("/nonexistent/x.toml")).unwrap_err();
    assert!(matches!(e.problem, Problem::Io(_)));
    assert!(e.to_string().starts_with("/nonexistent/x.toml"), "{e}");
}

const PRESETS: [&str; 5] = ["switch-cc", "switch-cs-quarter", "switch-ccss", "hybrid-laptop", "smt-2way"];
const MECHANISMS: [&str; 7] = ["none", "affinity", "handoff", "fastpath", "spin", "wakeup", "spinpark"];

prop_compose! {
    fn random_scenario()(
        preset in 0..PRESETS.len(),
        mechanism in 0..MECHANISMS.len(),
        tasks in 1usize..6,
        iterations in 1u64..25,
        app_mask in 1u32..16,
        threshold in prop_oneof![Just(0u32), 0u32..3000],
        prefer in any::<bool>(),
        wc in any::<bool>(),
        af in any::<bool>(),
        seed in any::<u32>(),
    ) -> (String, usize, u64) {
        let cpus = corehop_topology::presets::by_name(PRESETS[preset]).unwrap().cpus().len();
        let mut app: Vec<usize> = (0..cpus).filter(|c| app_mask & (1 << (c % 4)) != 0).collect();
        if app.len() == cpus {
            app.pop();
        }
        if app.is_empty() {
            app.push(0);
        }
        let text = format!(
            "seed = {seed}\n[machine]\npreset = \"{}\"\n[workload]\nkind = \"switch\"\nmechanism = \"{}\"\n\
             iterations = {iterations}\ntasks = {tasks}\napp_cpus = {app:?}\nhop_threshold_ns = {threshold}\n\
             compute = {{ exponential = 300 }}\n\
             pick = {{ work_conserving = {wc}, affinity = {af}, prefer_affinity = {prefer} }}\n\
             [[workload.calls]]\nname = \"short\"\nlength = {{ uniform = [10, 400] }}\n\
             [[workload.calls]]\nname = \"long\"\nweight = 0.5\nlength = {{ lognormal = {{ median = 2000, sigma = 1.0 }} }}\nmemory_bound = 0.5\n",
            PRESETS[preset], MECHANISMS[mechanism]
        );
        (text, tasks, iterations)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// No task lost or duplicated, no work on a CPU that does not exist, no CPU running two
    /// things at once, busy + idle = elapsed on every CPU.
    #[test]
    fn invariants_hold((text, tasks, iterations) in random_scenario()) {
        let scenario = ScenarioDoc::parse("p.toml", &text).unwrap().validate().unwrap();
        let cpus = scenario.machine.cpu_count();
        let mut model = Switch::from_scenario(&scenario).unwrap();
        let (report, sim) = models::simulate(&scenario, &mut model, true, &mut |_| {});

        // Every task finished exactly its iterations, once; every call counted once.
        let outcomes = model.task_outcomes();
        prop_assert_eq!(outcomes.len(), tasks);
        for (cpu, done, finished) in &outcomes {
            prop_assert_eq!(*done, iterations);
            prop_assert!(finished.is_some());
            prop_assert!(*cpu < cpus);
        }
        prop_assert_eq!(report.ops, tasks as u64 * iterations);
        // Every hop out has its hop back.
        prop_assert_eq!(report.hops % 2, 0);
        let hopped = report.model.metrics.iter().find(|m| m.name == "calls hopped").unwrap().value;
        prop_assert!((hopped * report.ops as f64 - (report.hops / 2) as f64).abs() < 1e-6);
        if MECHANISMS.iter().position(|m| text.contains(&format!("mechanism = \"{m}\""))) == Some(0) {
            prop_assert_eq!(report.hops, 0);
        }

        // Work only on CPUs that exist, never two things at once on one CPU.
        let mut by_cpu = vec![Vec::new(); cpus];
        for seg in sim.stats.cores.trace() {
            prop_assert!(seg.cpu < cpus);
            prop_assert!(seg.start <= seg.end && seg.end <= sim.now());
            by_cpu[seg.cpu].push((seg.start, seg.end));
        }
        for (cpu, segs) in by_cpu.iter_mut().enumerate() {
            segs.sort();
            for w in segs.windows(2) {
                prop_assert!(w[0].1 <= w[1].0, "overlap on cpu{}: {:?}", cpu, w);
            }
            // busy + idle = elapsed, busy is exactly the traced intervals, polling is idle time.
            let busy: u64 = segs.iter().map(|(s, e)| e - s).sum();
            prop_assert_eq!(sim.stats.cores.busy(cpu), busy);
            prop_assert_eq!(sim.stats.cores.busy(cpu) + sim.stats.cores.idle(cpu), sim.now());
            prop_assert!(sim.stats.cores.polled(cpu) <= sim.stats.cores.idle(cpu));
        }
        // Hops only between CPUs that exist.
        for &(from, to) in sim.stats.hops.by_route.keys() {
            prop_assert!(from < cpus && to < cpus && from != to);
        }
    }
}

#[test]
fn limits_stop_a_run_and_the_ledger_still_adds_up() {
    let text = "[run]\nhorizon_us = 50\n[machine]\npreset = \"switch-cs\"\n[workload]\nkind = \"switch\"\n\
                mechanism = \"handoff\"\niterations = 1000000\n";
    let scenario = ScenarioDoc::parse("h.toml", text).unwrap().validate().unwrap();
    let report = models::run_scenario(&scenario, &mut |_| {}).unwrap();
    assert_eq!(report.stop, corehop_sim::Stop::Horizon);
    assert_eq!(report.elapsed_ns, 50_000.0);
    for cpu in &report.cpus {
        assert_eq!(cpu.busy_ns + cpu.idle_ns, 50_000.0, "cpu{}", cpu.cpu);
    }
    // Calls take ~6.8 µs on switch-cs with V2; only those back by 50 µs count.
    assert_eq!(report.ops, 7);

    let text = text.replace("horizon_us = 50", "max_events = 100");
    let scenario = ScenarioDoc::parse("e.toml", &text).unwrap().validate().unwrap();
    let report = models::run_scenario(&scenario, &mut |_| {}).unwrap();
    assert_eq!((report.stop, report.events), (corehop_sim::Stop::EventBudget, 100));

    let e = ScenarioDoc::parse("n.toml", &text.replace("max_events = 100", "horizon_us = -1"))
        .unwrap()
        .validate()
        .unwrap_err();
    assert_eq!((e.key.as_str(), e.problem), ("run.horizon_us", Problem::Negative("-1".into())));
}
