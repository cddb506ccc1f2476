"""Sweeps: points, parallel == serial, output files, resuming, failing points."""

import pandas as pd
import pytest

import corehop

SMALL = {"workload.iterations": 300}


@pytest.fixture
def threshold(scenarios):
    return corehop.load(scenarios / "offload-threshold.toml", SMALL)


def test_points_cover_file_sweeps_grid_and_seeds(threshold):
    pts = corehop.points(threshold, {"workload.threshold_cycles": [0, 1000]}, seeds=[5, 6])
    # The file's latency sweep (3 values) stays; its threshold sweep is replaced; seeds last.
    assert len(pts) == 3 * 2 * 2
    assert [k for k, _ in pts[0]] == ["workload.latency_cycles", "workload.threshold_cycles", "seed"]
    assert [v for _, v in pts[0]] == [100, 0, 5]
    assert [v for _, v in pts[1]] == [100, 0, 6]
    assert [v for _, v in pts[-1]] == [5000, 1000, 6]
    assert corehop.points(threshold, seeds=3)[2][-1] == ("seed", 3)


def test_random_samples_are_distinct_and_reproducible(threshold):
    grid = {"workload.threshold_cycles": corehop.Range(10, 100_000, log=True), "workload.pollution": [0.1, 0.3]}
    a = corehop.points(threshold, grid, sample=20, sample_seed=4, seeds=2)
    assert len(a) == 40 and a == corehop.points(threshold, grid, sample=20, sample_seed=4, seeds=2)
    assert a != corehop.points(threshold, grid, sample=20, sample_seed=5, seeds=2)
    drawn = [dict(p)["workload.threshold_cycles"] for p in a]
    assert all(isinstance(t, int) and 10 <= t <= 100_000 for t in drawn)
    # From a finite grid: distinct combinations, never more than there are.
    finite = corehop.points(threshold, sample=24)
    assert len({str(p) for p in finite}) == 24
    with pytest.raises(ValueError, match="only 24 combinations"):
        corehop.points(threshold, sample=25)
    with pytest.raises(ValueError, match="sample=N"):
        corehop.points(threshold, {"workload.pollution": corehop.Range(0, 1)})


def test_sweeps_are_bounded_before_any_point_is_built(threshold):
    big = {"workload.pollution": list(range(1000)), "workload.latency_cycles": list(range(1000))}
    with pytest.raises(ValueError, match=f"000000 points: at most {corehop.MAX_POINTS} run"):
        corehop.points(threshold, big)
    with pytest.raises(ValueError, match=f"at most {corehop.MAX_POINTS} points"):
        corehop.points(threshold, seeds=10**12)
    with pytest.raises(ValueError, match=f"at most {corehop.MAX_POINTS} points"):
        corehop.points(threshold, {"workload.pollution": corehop.Range(0, 1)}, sample=10**9)


def test_parallel_results_equal_serial_ones(threshold):
    serial = corehop.sweep(threshold, seeds=2, jobs=1, progress=False)
    parallel = corehop.sweep(threshold, seeds=2, jobs=4, progress=False)
    assert len(serial) == 48 and serial["error"].isna().all()
    pd.testing.assert_frame_equal(serial, parallel)
    # Each row is the point's own run, and the points differ.
    one = threshold.run(dict([("workload.latency_cycles", 5000), ("workload.threshold_cycles", 0), ("seed", 2)]))
    row = serial[(serial["workload.latency_cycles"] == 5000) & (serial["workload.threshold_cycles"] == 0) & (serial["seed"] == 2)]
    assert row["ops"].item() == one["ops"] and row["headline"].item() == one["model"]["metrics"][0]["value"]
    assert serial["headline"].nunique() > 10


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_output_files_resume_and_keep_other_rows(threshold, tmp_path, suffix):
    out = tmp_path / f"sweep{suffix}"
    grid = {"workload.latency_cycles": [100], "workload.threshold_cycles": [0, 300, 3000]}
    first = corehop.sweep(threshold, grid, output=out, progress=False)
    read = pd.read_csv(out) if suffix == ".csv" else pd.read_parquet(out)
    assert len(read) == 3 and list(read["point"]) == list(first["point"])
    # Mark a saved row: a resumed sweep must keep it rather than run the point again.
    read.loc[1, "ops"] = -1
    (read.to_csv(out, index=False) if suffix == ".csv" else read.to_parquet(out, index=False))
    grid["workload.threshold_cycles"] = [0, 300, 3000, 30000]
    resumed = corehop.sweep(threshold, grid, output=out, progress=False)
    assert list(resumed["ops"])[1] == -1, "a point already in the output ran again"
    assert len(resumed) == 4 and resumed["error"].isna().all()
    assert resumed.iloc[3]["workload.threshold_cycles"] == 30000
    # A smaller sweep into the same file keeps the rows it does not cover.
    corehop.sweep(threshold, {"workload.latency_cycles": [100], "workload.threshold_cycles": [0]}, output=out, progress=False)
    assert len(pd.read_csv(out) if suffix == ".csv" else pd.read_parquet(out)) == 4


def test_a_failing_point_loses_nothing_and_is_retried(threshold, tmp_path):
    out = tmp_path / "mixed.csv"
    grid = {"workload.latency_cycles": [100], "workload.threshold_cycles": [0, 1000], "machine.preset": ["offload-2core", "cray-1"]}
    with pytest.raises(corehop.SweepError, match="2 of 4 points failed") as e:
        corehop.sweep(threshold, grid, output=out, progress=False)
    assert isinstance(e.value.__cause__, corehop.ScenarioError) and e.value.__cause__.key == "machine.preset"
    frame = e.value.frame
    assert frame["error"].notna().sum() == 2 and frame.loc[frame["error"].notna(), "machine.preset"].eq("cray-1").all()
    saved = pd.read_csv(out)
    assert saved["error"].isna().sum() == 2 and saved["ops"].notna().sum() == 2
    recorded = corehop.sweep(threshold, grid, output=out, progress=False, errors="record")
    assert "unknown preset" in recorded["error"].dropna().iloc[0]
    # Fix the bad value: only the failed points run again, the others come from the file.
    saved.loc[saved["error"].isna(), "ops"] = -7
    saved.to_csv(out, index=False)
    grid["machine.preset"] = ["offload-2core"]
    fixed = corehop.sweep(threshold, grid, output=out, progress=False)
    assert fixed["error"].isna().all() and (fixed["ops"] == -7).all()


def test_when_every_point_fails_the_error_itself_is_raised(threshold):
    with pytest.raises(corehop.ScenarioError) as e:
        corehop.sweep(threshold, {"workload.thresold_cycles": [1, 2]}, progress=False)
    assert e.value.key == "workload.thresold_cycles" and "unknown key" in str(e.value)


def test_to_frame_matches_the_cli_csv_columns(threshold, cli, tmp_path):
    import subprocess

    values = {"workload.latency_cycles": 1000, "workload.threshold_cycles": 300}
    frame = corehop.to_frame(threshold.run(values))
    csv = tmp_path / "cli.csv"
    subprocess.run(
        [cli, "sim", threshold.file, "--set", "workload.iterations=300", "--json", "--csv", str(csv)]
        + [f"--set={k}={v}" for k, v in values.items()],
        check=True,
        capture_output=True,
    )
    cli_frame = pd.read_csv(csv)
    shared = [c for c in cli_frame.columns if c in frame.columns]
    assert len(shared) >= len(cli_frame.columns) - 2, "the swept keys are the only CLI-only columns"
    pd.testing.assert_frame_equal(frame[shared], cli_frame[shared], check_dtype=False)


def test_an_interrupted_sweep_keeps_what_finished(threshold, tmp_path, monkeypatch):
    from corehop import sweeps as sweep_module

    out = tmp_path / "cut.csv"
    real = sweep_module._run_local

    def cut_after_five(scenario, todo, jobs):
        for n, item in enumerate(real(scenario, todo, jobs)):
            if n == 5:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(sweep_module, "_run_local", cut_after_five)
    with pytest.raises(KeyboardInterrupt):
        corehop.sweep(threshold, seeds=2, output=out, progress=False)
    assert len(pd.read_csv(out)) == 5
    monkeypatch.setattr(sweep_module, "_run_local", real)
    assert len(corehop.sweep(threshold, seeds=2, output=out, progress=False)) == 48


def test_run_points_streams_and_stops_when_dropped(threshold):
    plan = corehop.points(threshold, seeds=2)
    results = threshold.run_points(plan, 2)
    assert len(results) == 48
    seen = {}
    for _ in range(3):
        i, report = next(results)
        seen[i] = report
    assert len(results) == 45 and all(r["ops"] > 0 for r in seen.values())
    assert seen[i] == threshold.run(plan[i])  # the index is the point's
    del results  # the points not yet started are skipped; nothing hangs
    bad = list(threshold.run_points([{"workload.latency_cycles": 1, "workload.threshold_cycles": 1, "machine.preset": "nope"}]))
    assert bad[0][0] == 0 and isinstance(bad[0][1], corehop.ScenarioError)
