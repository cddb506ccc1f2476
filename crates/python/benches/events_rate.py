"""The engine's events per second from Python and from the `corehop sim` command on the same
scenario, alternating, so that any per-event cost of the binding would show.

    python benches/events_rate.py [--cli target/release/corehop] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import corehop

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "scenarios" / "offload-threshold.toml"
VALUES = {"workload.latency_cycles": 1000, "workload.threshold_cycles": 1000, "workload.iterations": 6_000_000}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cli", type=Path, default=ROOT / "target" / "release" / "corehop")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    scenario = corehop.load(SCENARIO)
    command = [str(args.cli), "sim", str(SCENARIO), "--json", *(f"--set={k}={v}" for k, v in VALUES.items())]
    rates: dict[str, list[float]] = {"corehop sim (CLI process)": [], "Python corehop.run": []}
    events = {}
    for _ in range(args.reps):
        t = time.perf_counter()
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        wall = time.perf_counter() - t
        events["cli"] = json.loads(out)["runs"][0]["report"]["events"]
        rates["corehop sim (CLI process)"].append(events["cli"] / wall)
        t = time.perf_counter()
        report = scenario.run(VALUES)
        wall = time.perf_counter() - t
        events["py"] = report["events"]
        rates["Python corehop.run"].append(events["py"] / wall)
    assert events["cli"] == events["py"], events
    print(f"{SCENARIO.name}, one point ({events['py']:,} events), {args.reps} runs each, alternating")
    print(f"{'':28} {'min':>12} {'median':>12} {'max':>12}  events/s")
    for name, r in rates.items():
        print(f"{name:28} {min(r):12,.0f} {statistics.median(r):12,.0f} {max(r):12,.0f}")
    cli, py = (statistics.median(r) for r in rates.values())
    print(f"Python / CLI (medians): {py / cli:.3f}")


if __name__ == "__main__":
    main()
