//! `corehop bench o2`: the JSON shape of a quick run and the errors for bad flags (never speed).

mod common;

use common::corehop;

#[test]
fn quick_json_has_every_scheduler_per_size() {
    let v =
        common::json_of(&["bench", "o2", "--quick", "--json", "--sizes", "64K,1M", "--popularity", "both"]);
    let machine = &v["machine"];
    assert!(machine["cpus"].as_u64().unwrap() >= 1);
    for key in ["private_cache_bytes", "private_cache_total_bytes", "on_chip_bytes"] {
        assert!(machine[key].as_u64().is_some(), "machine.{key}");
    }
    assert_eq!(v["settings"]["reps"], 1);
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2 * 2 * 4, "2 popularities × 2 sizes × 4 schedulers");
    for r in results {
        for key in [
            "min_lookups_per_s",
            "median_lookups_per_s",
            "max_lookups_per_s",
            "ratio_to_threads",
            "paired_ratio_to_threads",
        ] {
            assert!(r[key].as_f64().unwrap() > 0.0, "{key} in {r}");
        }
        let (min, med, max) = (
            r["min_lookups_per_s"].as_f64(),
            r["median_lookups_per_s"].as_f64(),
            r["max_lookups_per_s"].as_f64(),
        );
        assert!(min <= med && med <= max);
        let scheduler = r["scheduler"].as_str().unwrap();
        assert!(["threads", "sharded", "o2", "o2_batched"].contains(&scheduler));
        assert!(["uniform", "oscillating"].contains(&r["popularity"].as_str().unwrap()));
        assert!(r["paired_interval_to_threads"].is_null(), "one repetition gives no interval: {r}");
        if scheduler == "threads" {
            assert_eq!(r["ratio_to_threads"], 1.0);
            assert_eq!(r["paired_ratio_to_threads"], 1.0);
        }
        assert_eq!(v["settings"]["lookup"], "scan");
        let dirs = r["directories"].as_u64().unwrap();
        assert_eq!(dirs, r["size_bytes"].as_u64().unwrap() / 32_000);
        match scheduler {
            "o2" | "o2_batched" => {
                let p = &r["placement"];
                let following = p["following_routes"].as_f64().unwrap();
                assert!((0.0..=1.0).contains(&following), "{p}");
                let total: u64 =
                    ["local", "core", "domain", "replicated"].iter().map(|k| p[k].as_u64().unwrap()).sum();
                assert_eq!(total, dirs, "every directory has one placement");
            }
            _ => assert!(r["placement"].is_null()),
        }
    }
}

/// `--lookup hashed` is reported in the settings and sizes directories with their index.
#[test]
fn hashed_lookups_are_reported_with_their_index_bytes() {
    let v = common::json_of(&[
        "bench",
        "o2",
        "--quick",
        "--json",
        "--sizes",
        "1M",
        "--popularity",
        "uniform",
        "--lookup",
        "hashed",
    ]);
    assert_eq!(v["settings"]["lookup"], "hashed");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 4);
    // 32 000 bytes of entries and 2 048 two-byte index slots each.
    assert!(results.iter().all(|r| r["directories"] == (1u64 << 20) / 36_096), "{results:?}");
}

#[test]
fn plot_writes_an_svg() {
    let (stdout, _) =
        common::plotted(&["bench", "o2", "--quick", "--sizes", "64K", "--popularity", "uniform"]);
    assert!(stdout.contains("batched") && stdout.contains("placed"), "{stdout}");
}

#[test]
fn bad_flags_are_named() {
    let err = |args: &[&str]| {
        let out = corehop(args);
        assert!(!out.status.success(), "{args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(err(&["bench", "o2", "--sizes", "12Q"]).contains("--sizes"));
    assert!(err(&["bench", "o2", "--sizes", "1K"]).contains("less than one directory"));
    assert!(err(&["bench", "o2", "--cpus", "9999"]).contains("--cpus"));
    assert!(err(&["bench", "o2", "--reps", "0"]).contains("--reps"));
}
