"""Figure 4 of "Improving Server Performance on Multi-Cores via Selective Off-loading of OS
Functionality" (Nellans et al.), end to end: user throughput against the off-load threshold N,
one curve per one-way off-load latency, the never-off-load baseline dashed.

    python examples/offload_threshold.py                      # the paper's grid, 5 seeds
    python examples/offload_threshold.py --out fig4.png --seeds 10 --ray   # on Ray

The sweep is resumable: run it again with more seeds and only the new points run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402

import corehop  # noqa: E402

SCENARIO = Path(__file__).resolve().parents[3] / "scenarios" / "offload-threshold.toml"
NEVER = 1_000_000_000  # above every invocation: nothing is off-loaded


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("offload-threshold.png"), help="the PNG to write")
    p.add_argument("--latencies", default="100,1000,5000", help="one-way off-load latencies, cycles")
    p.add_argument("--thresholds", default="0,100,300,1000,3000,10000,30000", help="values of N, cycles")
    p.add_argument("--seeds", type=int, default=5, help="seeds per point (the curve is their mean)")
    p.add_argument("--iterations", type=int, default=20000, help="OS invocations per run")
    p.add_argument("--ray", action="store_true", help="run on Ray (ray.init() or RAY_ADDRESS)")
    args = p.parse_args(argv)

    latencies = [int(x) for x in args.latencies.split(",")]
    thresholds = [int(x) for x in args.thresholds.split(",")]
    scenario = corehop.load(SCENARIO, {"workload.iterations": args.iterations})
    frame = corehop.sweep(
        scenario,
        {"workload.latency_cycles": latencies, "workload.threshold_cycles": thresholds + [NEVER]},
        seeds=args.seeds,
        output=args.out.with_suffix(".csv"),
        backend="ray" if args.ray else "auto",
    )
    throughput = "user throughput (user cycles per cycle)"
    by_point = frame.groupby(["workload.latency_cycles", "workload.threshold_cycles"])[throughput]
    mean, low, high = by_point.mean(), by_point.min(), by_point.max()

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for latency in latencies:
        xs = [n for n in thresholds if n > 0]  # a log axis: N = 0 is drawn at the left edge
        left = min(xs) / 3 if 0 in thresholds else None
        points = ([left] if left else []) + xs
        keys = ([0] if left else []) + xs
        line = ax.plot(points, [mean[latency, n] for n in keys], marker="o", label=f"{latency} cycles")[0]
        ax.fill_between(points, [low[latency, n] for n in keys], [high[latency, n] for n in keys], alpha=0.15, color=line.get_color())
    # Never off-loading does not depend on the latency: one baseline (the mean over latencies).
    never = sum(mean[lat, NEVER] for lat in latencies) / len(latencies)
    ax.axhline(never, linestyle="--", color="grey", label="never off-load")
    ax.set_xscale("log")
    ax.set_xlabel("off-load threshold N (cycles; leftmost point: N = 0)")
    ax.set_ylabel("user throughput (user cycles per cycle)")
    ax.set_title(f"Selective OS off-load (Nellans et al., Fig. 4)\nmean and range over {args.seeds} seed(s)")
    ax.legend(title="one-way off-load latency")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    best = {lat: max(thresholds, key=lambda n: mean[lat, n]) for lat in latencies}
    print(f"wrote {args.out} and {args.out.with_suffix('.csv')}; best N per latency: {best}")
    return args.out


if __name__ == "__main__":
    main()
