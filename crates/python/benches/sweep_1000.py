"""A 1,000-point sweep run serially, on every local core and on a local Ray instance, side by
side: checks that every point's result is identical and prints wall times (min/median/max over
the repetitions, the three modes alternating) and the speed-up over serial.

    python benches/sweep_1000.py [--reps 3] [--iterations 20000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import pandas as pd

import corehop

SCENARIO = Path(__file__).resolve().parents[3] / "scenarios" / "offload-threshold.toml"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--iterations", type=int, default=20000, help="OS invocations per point")
    p.add_argument("--ray-cpus", type=int, default=corehop.available_threads())
    args = p.parse_args()

    import ray

    load = os.getloadavg()
    started = time.perf_counter()
    ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False)
    ray_start = time.perf_counter() - started
    scenario = corehop.load(SCENARIO, {"workload.iterations": args.iterations})
    # 5 latencies x the file's 8 thresholds x 25 seeds.
    grid = {"workload.latency_cycles": [100, 300, 1000, 3000, 5000]}
    modes = {
        "serial (jobs=1)": dict(backend="local", jobs=1),
        f"local parallel (jobs={corehop.available_threads()})": dict(backend="local"),
        f"ray ({args.ray_cpus} CPUs, local)": dict(backend="ray"),
    }
    times: dict[str, list[float]] = {m: [] for m in modes}
    frames: dict[str, pd.DataFrame] = {}
    for _ in range(args.reps):
        for mode, how in modes.items():
            t = time.perf_counter()
            frame = corehop.sweep(scenario, grid, seeds=25, progress=False, **how)
            times[mode].append(time.perf_counter() - t)
            assert len(frame) == 1000 and frame["error"].isna().all()
            if mode in frames:
                pd.testing.assert_frame_equal(frames[mode], frame)
            frames[mode] = frame
    ray.shutdown()
    base = next(iter(frames.values()))
    for frame in frames.values():
        pd.testing.assert_frame_equal(base, frame)  # every column of every point
    print(f"load average before/after: {load[0]:.1f} / {os.getloadavg()[0]:.1f} (other processes share these CPUs)")
    print(f"1000 points of {SCENARIO.name} ({args.iterations} invocations each), {args.reps} runs per mode, "
          f"{corehop.available_threads()} CPUs; Ray start-up {ray_start:.1f} s (not counted)")
    print("per-point results identical in every mode and run: yes")
    serial = statistics.median(times[next(iter(modes))])
    print(f"{'mode':34} {'min s':>7} {'median s':>9} {'max s':>7} {'speed-up':>9}")
    for mode, ts in times.items():
        med = statistics.median(ts)
        print(f"{mode:34} {min(ts):7.2f} {med:9.2f} {max(ts):7.2f} {serial / med:8.2f}x")


if __name__ == "__main__":
    main()
