//! `corehop predict` end to end: known answers on a hand-built trace, the recorded real
//! traces, and errors that name the file and line.

mod common;

use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces").join(name)
}

use common::corehop;

/// The CSV traces of a fixture folder, by name.
fn csv_traces(folder: &str) -> Vec<String> {
    let mut traces: Vec<String> = std::fs::read_dir(fixture(folder))
        .unwrap()
        .map(|e| e.unwrap().path().to_str().unwrap().to_string())
        .filter(|p| p.ends_with(".csv"))
        .collect();
    traces.sort();
    traces
}

/// `corehop predict --json` of `traces` at N = 1, 2, 5 and 20 µs, with `more` options.
fn replay_at_issue_thresholds(traces: &[String], more: &[&str]) -> serde_json::Value {
    let mut args = vec!["predict", "--thresholds", "1000,2000,5000,20000", "--json"];
    args.extend(more);
    for trace in traces {
        args.extend(["--trace", trace]);
    }
    json(&args)
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = corehop(args);
    assert!(out.status.success(), "corehop {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("valid JSON")
}

#[test]
fn hand_built_trace_gives_the_known_scores() {
    let path = fixture("known.csv");
    let v = json(&["predict", "--trace", path.to_str().unwrap(), "--thresholds", "5000", "--json"]);
    let fa = &v[0]["forms"][0];
    assert_eq!(v[0]["calls"], 5);
    assert_eq!(fa["form"], "fa200");
    // Predictions: cold 0, 2000 (exact), global 2000 for the first fsync, 2000 for 2100
    // (within 5 %), 90000 (exact).
    assert_eq!(fa["exact"], 0.4);
    assert_eq!(fa["within_5pct"], 0.6);
    assert_eq!(fa["decisions"][0]["right"], 0.8);
    assert_eq!(fa["decisions"][0]["best_constant"], 0.6);
    assert_eq!(v[0]["forms"][1]["form"], "dm1500");
}

#[test]
fn each_process_starts_from_what_the_one_before_it_learned_unless_fresh() {
    // Two processes, as `corehop run --record-trace` writes them (each block at its exit):
    // every fstat runs 8 µs, each process calls it from a call site of its own.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two.csv");
    let block =
        |pid: u32, site: u32| format!("# pid {pid}\n") + &format!("fstat,3,0,{site},8000\n").repeat(20);
    std::fs::write(&path, format!("call,fd,size,site,run_ns\n{}{}", block(10, 1), block(11, 2))).unwrap();
    let timed_right = |start: &str| {
        let v = json(&[
            "predict",
            "--trace",
            path.to_str().unwrap(),
            "--thresholds",
            "5000",
            "--start",
            start,
            "--json",
        ]);
        assert_eq!(v[0]["processes"], 2);
        let timed =
            v[0]["forms"].as_array().unwrap().iter().find(|f| f["form"] == "time1500").unwrap().clone();
        (timed["decisions"][0]["right"].as_f64().unwrap() * 40.0).round() as u32
    };
    // Fresh, each process gets its first calls wrong until it has learned (N is above what
    // a cold start takes a call to run); inherited, only the first process does.
    let (fresh, inherited) = (timed_right("fresh"), timed_right("inherited"));
    assert!(fresh <= 40 - 2 * 2, "fresh: {fresh} of 40 right");
    assert_eq!(inherited, fresh + (40 - fresh) / 2, "inherited: {inherited} of 40 right, fresh {fresh}");
}

/// The summary over several traces names the points where a form fell below the best constant
/// rule, with the calls it lost there: each trace's calls all run 8 µs, so at N = 5 µs (above
/// what a cold start takes a call to run) the timed form gets its first calls wrong and
/// "always" gets none.
#[test]
fn the_summary_names_the_points_below_the_constant() {
    let dir = tempfile::tempdir().unwrap();
    let trace = |name: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("call,fd,size,site,run_ns\n{}", "fstat,3,0,1,8000\n".repeat(20)))
            .unwrap();
        path.to_str().unwrap().to_string()
    };
    let (a, b) = (trace("a.csv"), trace("b.csv"));
    let out = corehop(&["predict", "--thresholds", "5000", "--trace", &a, &b]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("time1500 below the constant at:")).expect(&text);
    for name in ["a.csv", "b.csv"] {
        assert!(line.contains(&format!("{name} N=5.00 µs: ")) && line.contains(" of 20 calls"), "{line}");
    }
}

#[test]
fn recorded_traces_replay_with_sane_scores() {
    for name in ["sqlite.strace", "tar.strace", "python.strace"] {
        let path = fixture(name);
        let v = json(&["predict", "--trace", path.to_str().unwrap(), "--json"]);
        let report = &v[0];
        assert!(report["calls"].as_u64().unwrap() > 300, "{name}: {}", report["calls"]);
        assert_eq!(report["format"], "strace");
        for form in report["forms"].as_array().unwrap() {
            let exact = form["exact"].as_f64().unwrap();
            let close = form["within_5pct"].as_f64().unwrap();
            assert!(exact > 0.0 && exact <= close && close <= 1.0, "{name}: exact {exact} ±5% {close}");
            let shares = ["local", "global", "cold"].map(|k| form[k].as_f64().unwrap());
            assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            assert_eq!(form["decisions"].as_array().unwrap().len(), 4);
        }
    }
}

#[test]
fn in_process_traces_from_the_bench_replay() {
    // Recorded with `corehop bench offload --policies never --record-trace …` (ns timings).
    for (name, calls) in [("sqlite-inprocess.csv", 1500), ("fileserver-inprocess.csv", 2000)] {
        let path = fixture(name);
        let v = json(&["predict", "--trace", path.to_str().unwrap(), "--thresholds", "2000,20000", "--json"]);
        assert_eq!(v[0]["calls"], calls, "{name}");
        assert_eq!(v[0]["format"], "csv");
        for form in v[0]["forms"].as_array().unwrap() {
            for d in form["decisions"].as_array().unwrap() {
                let right = d["right"].as_f64().unwrap();
                assert!((0.0..=1.0).contains(&right) && d["best_constant"].as_f64().unwrap() >= 0.5);
            }
        }
    }
}

#[test]
fn named_only_keeps_just_the_papers_calls() {
    let path = fixture("sqlite.strace");
    let all = json(&["predict", "--trace", path.to_str().unwrap(), "--json"]);
    let named = json(&["predict", "--trace", path.to_str().unwrap(), "--named-only", "--json"]);
    assert_eq!(all[0]["processes"], 1, "one strace pid");
    let (all, named) = (all[0]["calls"].as_u64().unwrap(), named[0]["calls"].as_u64().unwrap());
    assert!(named < all && named > 1000, "sqlite is mostly pwrite/pread/fdatasync/stat: {named} of {all}");
}

/// Files after one `--trace` (as a shell glob gives them) are all replayed, and the table ends
/// with their averages.
#[test]
fn several_traces_after_one_flag_end_in_a_summary() {
    let (a, b) = (fixture("recorded/cp-r.csv"), fixture("recorded/git.csv"));
    let out =
        corehop(&["predict", "--thresholds", "2000", "--trace", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("cp-r.csv") && text.contains("git.csv"), "{text}");
    // Each process is counted once (cp-r.csv holds four `# pid` blocks).
    assert!(text.contains("4053 calls of 4 process(es)"), "{text}");
    let summary = text.split("all 2 traces").nth(1).expect("a summary of both traces");
    let timed = summary.lines().find(|l| l.starts_with("time1500")).expect("the timed form's row");
    assert!(timed.ends_with("of 2"), "{timed}");
}

#[test]
fn table_and_plot() {
    let path = fixture("tar.strace");
    let (text, _) = common::plotted(&["predict", "--trace", path.to_str().unwrap()]);
    assert!(text.contains("fa200") && text.contains("dm1500") && text.contains("best constant"), "{text}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let bad = fixture("bad-fd.csv");
    let out = corehop(&["predict", "--trace", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad-fd.csv:3: fd \"three\" is not an integer"), "{err}");

    let out = corehop(&["predict", "--trace", "/nonexistent/trace.txt"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("reading trace /nonexistent/trace.txt"));

    let known = fixture("known.csv");
    let out = corehop(&["predict", "--trace", known.to_str().unwrap(), "--thresholds", "1k"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--thresholds"));

    // A binary file, and a text file of one 8 MB line: each a short error, not the file echoed.
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("binary");
    std::fs::write(&binary, [0x7f, b'E', b'L', b'F', 0xff, 0xfe, 0, 1]).unwrap();
    let out = corehop(&["predict", "--trace", binary.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not text (a trace is `strace -f -T` output or CSV)"), "{err}");
    let long = dir.path().join("long.txt");
    std::fs::write(&long, "a".repeat(8 << 20)).unwrap();
    let out = corehop(&["predict", "--trace", long.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("long.txt:1: not a system call: \"aaa"), "{err}");
    assert!(err.len() < 400, "{} bytes of error message", err.len());
}

#[test]
fn the_timed_form_beats_the_papers_on_traces_timed_in_ns() {
    // Traces recorded in-process with a monotonic ns clock: the paper's ±5 % confidence rarely
    // holds for times; the timed form's medians by key and by kind do as well at small N and
    // far better at 20 us.
    for name in ["sqlite-inprocess.csv", "fileserver-inprocess.csv"] {
        let path = fixture(name);
        let v = json(&[
            "predict",
            "--trace",
            path.to_str().unwrap(),
            "--thresholds",
            "1000,2000,5000,20000",
            "--json",
        ]);
        let forms = v[0]["forms"].as_array().unwrap();
        let right = |form: &str| -> Vec<f64> {
            let f = forms.iter().find(|f| f["form"] == form).unwrap_or_else(|| panic!("{form} missing"));
            f["decisions"].as_array().unwrap().iter().map(|d| d["right"].as_f64().unwrap()).collect()
        };
        let (time, fa) = (right("time1500"), right("fa200"));
        for (t, p) in time.iter().zip(&fa) {
            // Within a call or two of the paper's where both are nearly always right.
            assert!(*t >= p - 0.005, "{name}: time {time:?} vs fa {fa:?}");
        }
        // Better than the paper's form where it matters (fa: 53 % and 47 % at 20 us and 5 us).
        let best_gain = time.iter().zip(&fa).map(|(t, p)| t - p).fold(f64::MIN, f64::max);
        assert!(best_gain > 0.2, "{name}: time {time:?} vs fa {fa:?}");
    }
}

/// Traces of fifteen real programs recorded in-process by the preload library (call sites, ns
/// clock): the timed form's decisions must be right ≥ 90 % of the time over all programs and
/// N, well above the best constant rule on average, and nowhere more than half a point below
/// it. (An online rule cannot promise never to fall below the constant chosen afterwards: on
/// a key long half the time at random, that constant wins by the luck of the draw. Here no
/// point falls below it.) The paper's form is reported beside it.
#[test]
fn timed_form_beats_constant_rules_on_recorded_programs() {
    let names = csv_traces("recorded");
    assert!(names.len() >= 6, "{names:?}");
    let reports = replay_at_issue_thresholds(&names, &[]);
    let (mut right_sum, mut constant_sum, mut points) = (0.0, 0.0, 0);
    for report in reports.as_array().unwrap() {
        let forms = report["forms"].as_array().unwrap();
        assert!(forms.iter().any(|f| f["form"] == "fa200"), "the paper's form is reported too");
        let timed = forms.iter().find(|f| f["form"] == "time1500").expect("timed form");
        for d in timed["decisions"].as_array().unwrap() {
            let (right, constant) = (d["right"].as_f64().unwrap(), d["best_constant"].as_f64().unwrap());
            assert!(
                right >= constant - 0.005,
                "{}: N={} right {right}, more than half a point below the constant {constant}",
                report["trace"],
                d["n_ns"]
            );
            right_sum += right;
            constant_sum += constant;
            points += 1;
        }
    }
    assert_eq!(points, names.len() * 4);
    let (mean, constant_mean) = (right_sum / points as f64, constant_sum / points as f64);
    assert!(mean >= 0.90, "mean {mean}");
    assert!(mean >= constant_mean + 0.05, "mean {mean}, the constant rule's {constant_mean}");
}

/// Fifteen more programs, recorded after the predictor was tuned, on a slower day (several
/// short, several of many processes): as on the recorded ones, right ≥ 90 % of the time over
/// all programs and N and nowhere more than half a point below the best constant rule; and
/// starting each process from what the last one to end learned must do at least as well as
/// starting each alone, on average and in the points below the best constant rule, and
/// better over the traces of many processes (each within a call or two of it).
#[test]
fn held_out_programs_start_better_from_what_the_run_learned() {
    let traces = csv_traces("held-out");
    assert!(traces.len() >= 10, "{traces:?}");
    // Per start: the mean right share over traces and N, the points below the constant, and
    // the right share of each trace of more than five processes.
    let score = |start: &str| {
        let (mut sum, mut points, mut below, mut many, mut worst) = (0.0, 0, 0, Vec::new(), 0.0f64);
        for report in replay_at_issue_thresholds(&traces, &["--start", start]).as_array().unwrap() {
            let timed = report["forms"].as_array().unwrap().iter().find(|f| f["form"] == "time1500").unwrap();
            let mut trace_sum = 0.0;
            for d in timed["decisions"].as_array().unwrap() {
                let (right, constant) = (d["right"].as_f64().unwrap(), d["best_constant"].as_f64().unwrap());
                (sum, points, trace_sum) = (sum + right, points + 1, trace_sum + right);
                below += usize::from(right < constant - 1e-9);
                worst = worst.max(constant - right);
            }
            if report["processes"].as_u64().unwrap() > 5 {
                many.push((report["trace"].as_str().unwrap().to_string(), trace_sum));
            }
        }
        (sum / f64::from(points), below, many, worst)
    };
    let (fresh, inherited) = (score("fresh"), score("inherited"));
    assert!(inherited.0 >= 0.90, "mean right {}", inherited.0);
    assert!(inherited.3 <= 0.005, "a point {} below the constant", inherited.3);
    assert!(inherited.0 >= fresh.0, "mean right: inherited {} < fresh {}", inherited.0, fresh.0);
    assert!(inherited.1 <= fresh.1, "points below: inherited {} > fresh {}", inherited.1, fresh.1);
    assert!(!inherited.2.is_empty());
    for ((name, alone), (_, handed_on)) in fresh.2.iter().zip(&inherited.2) {
        assert!(*handed_on >= alone - 0.01, "{name}: inherited {handed_on} < fresh {alone} (sums over N)");
    }
    let total = |many: &[(String, f64)]| many.iter().map(|(_, sum)| sum).sum::<f64>();
    assert!(
        total(&inherited.2) > total(&fresh.2),
        "many processes: inherited {:?}, fresh {:?}",
        inherited.2,
        fresh.2
    );
}

/// Ten programs recorded after the predictor was tuned (the sixtieth session; one change since,
/// made for one of them, `file`), on this host's fast band: many of their calls run within a few hundred ns of 1 µs, where a
/// key's runs fall on either side about as often (`open` and `stat` with medians of 1.00-1.06
/// µs), so no rule is right 90 % of the time there (docs/performance.md, "Sixtieth session").
/// The timed form must still beat the better constant rule by five points on average and by
/// more at the lowest N, and stay within a few calls of it everywhere.
#[test]
fn timed_form_holds_on_programs_recorded_after_it_was_tuned() {
    let names = csv_traces("out-of-sample");
    assert!(names.len() >= 10, "{names:?}");
    let (mut right_at, mut constant_at) = ([0.0; 4], [0.0; 4]);
    for report in replay_at_issue_thresholds(&names, &[]).as_array().unwrap() {
        let timed = report["forms"].as_array().unwrap().iter().find(|f| f["form"] == "time1500").unwrap();
        let calls = report["calls"].as_f64().unwrap();
        for (i, d) in timed["decisions"].as_array().unwrap().iter().enumerate() {
            let (right, constant) = (d["right"].as_f64().unwrap(), d["best_constant"].as_f64().unwrap());
            assert!(
                (constant - right) * calls <= 4.5,
                "{}: N={} right {right}, more than four calls below the constant {constant}",
                report["trace"],
                d["n_ns"]
            );
            (right_at[i], constant_at[i]) = (right_at[i] + right, constant_at[i] + constant);
        }
    }
    let mean = |sums: [f64; 4]| sums.iter().sum::<f64>() / (4 * names.len()) as f64;
    assert!(
        mean(right_at) >= mean(constant_at) + 0.05,
        "mean {}, constant {}",
        mean(right_at),
        mean(constant_at)
    );
    assert!(
        right_at[0] >= constant_at[0] + 0.05 * names.len() as f64,
        "at 1 µs: {right_at:?} against {constant_at:?}"
    );
}

/// `file` reading a pipe (`out-of-sample/file.csv`), in a run whose first process made only
/// short stats: its reads wait milliseconds each, and from the third on they move at N = 5
/// and 20 µs, though the plain majority of all calls, which decides until the keys have
/// earned their place, still says "below" (it said so to every read: the constant rule's
/// 73.5 %).
#[test]
fn long_waits_move_after_a_process_of_short_calls() {
    let traces = [fixture("out-of-sample/file.csv").to_str().unwrap().to_string()];
    let reports = replay_at_issue_thresholds(&traces, &[]);
    let timed = reports[0]["forms"].as_array().unwrap().iter().find(|f| f["form"] == "time1500").unwrap();
    for d in &timed["decisions"].as_array().unwrap()[2..] {
        let (right, constant) = (d["right"].as_f64().unwrap(), d["best_constant"].as_f64().unwrap());
        assert!(right >= constant + 0.1, "N={}: right {right}, the constant rule {constant}", d["n_ns"]);
    }
}
