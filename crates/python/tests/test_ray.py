"""The same sweep on a local Ray instance (2 CPUs, started and stopped here)."""

import pandas as pd
import pytest

import corehop

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_gives_the_local_results_one_task_per_batch(local_ray, scenarios, tmp_path):
    threshold = corehop.load(scenarios / "offload-threshold.toml", {"workload.iterations": 300})
    grid = {"workload.threshold_cycles": [0, 300, 3000, 1_000_000_000], "machine.preset": ["offload-2core", "cray-1"]}
    local = corehop.sweep(threshold, grid, seeds=2, backend="local", progress=False, errors="record")
    # An existing ray.init() is used (backend="auto"); 5 points per task.
    on_ray = corehop.sweep(threshold, grid, seeds=2, batch_size=5, progress=False, errors="record", output=tmp_path / "r.parquet")
    assert len(local) == 48 and local["error"].notna().sum() == 24
    pd.testing.assert_frame_equal(local, on_ray)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "r.parquet"), on_ray, check_dtype=False)
    # A resumed sweep on Ray runs only the failed points again.
    with pytest.raises(corehop.SweepError, match="24 of 48 points failed"):
        corehop.sweep(threshold, grid, seeds=2, backend="ray", progress=False, output=tmp_path / "r.parquet")
