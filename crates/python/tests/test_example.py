"""The paper-figure example, end to end on a small grid."""

import runpy
import sys
from pathlib import Path

import pandas as pd

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "offload_threshold.py"


def test_offload_figure_is_drawn_from_a_resumable_sweep(tmp_path, monkeypatch):
    out = tmp_path / "fig4.png"
    args = ["--out", str(out), "--thresholds", "0,1000", "--latencies", "100,5000", "--seeds", "2", "--iterations", "500"]
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), *args])
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    data = pd.read_csv(out.with_suffix(".csv"))
    assert len(data) == 2 * 3 * 2 and data["error"].isna().all()
    # The paper's shape: with cheap off-load, N = 1000 beats never off-loading; at 5000 cycles
    # off-loading everything (N = 0) loses.
    mean = data.groupby(["workload.latency_cycles", "workload.threshold_cycles"])["headline"].mean()
    assert mean[100, 1000] > mean[100, 1_000_000_000]
    assert mean[5000, 0] < mean[5000, 1_000_000_000]
