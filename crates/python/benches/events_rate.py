"""The engine's events per second from Python and from the `corehop sim` command on the same
scenario, alternating, so that any per-event cost of the binding would show.

    python benches/events_rate.py [--cli target/release/corehop] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import resource
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
    names = ("corehop sim (CLI process)", "Python corehop.run")
    # Per wall second, and per CPU second of the process that ran the engine (the second does
    # not move when other processes share the CPUs).
    wall_rates: dict[str, list[float]] = {n: [] for n in names}
    cpu_rates: dict[str, list[float]] = {n: [] for n in names}
    events = {}
    for _ in range(args.reps):
        cpu, t = _children_cpu(), time.perf_counter()
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        wall, cpu = time.perf_counter() - t, _children_cpu() - cpu
        events[names[0]] = json.loads(out)["runs"][0]["report"]["events"]
        wall_rates[names[0]].append(events[names[0]] / wall)
        cpu_rates[names[0]].append(events[names[0]] / cpu)
        cpu, t = time.process_time(), time.perf_counter()
        report = scenario.run(VALUES)
        wall, cpu = time.perf_counter() - t, time.process_time() - cpu
        events[names[1]] = report["events"]
        wall_rates[names[1]].append(events[names[1]] / wall)
        cpu_rates[names[1]].append(events[names[1]] / cpu)
    assert len(set(events.values())) == 1, events
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (other processes share these CPUs)")
    print(f"{SCENARIO.name}, one point ({events[names[1]]:,} events), {args.reps} runs each, alternating")
    print(f"{'events/s':44} {'min':>12} {'median':>12} {'max':>12}")
    for unit, rates in (("per wall second", wall_rates), ("per CPU second", cpu_rates)):
        for name, r in rates.items():
            print(f"{name + ', ' + unit:44} {min(r):12,.0f} {statistics.median(r):12,.0f} {max(r):12,.0f}")
        cli, py = (statistics.median(r) for r in rates.values())
        print(f"{'  Python / CLI (medians)':44} {py / cli:12.3f}")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime

if __name__ == "__main__":
    main()
