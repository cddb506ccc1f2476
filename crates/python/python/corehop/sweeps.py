"""Sweeps: a grid or a random sample over scenario keys x seeds, run on every local core (the
native runner, with the GIL released) or on Ray, into a pandas DataFrame and a Parquet or CSV
file that a later call resumes from.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union

import pandas as pd
from tqdm.auto import tqdm

from ._corehop import MAX_POINTS, Scenario, ScenarioError

if TYPE_CHECKING:
    from . import ScenarioLike

#: One point of a sweep: (dotted key, value) for every swept key, in sweep order.
Settings = list[tuple[str, Any]]

#: What a grid gives for a key: a list of values (each point takes one), a :class:`Range` (with
#: ``sample=``), or a single value (every point takes it).
Values = Union[Sequence[Any], "Range", Any]


@dataclass(frozen=True)
class Range:
    """A range to draw a key's value from in a random sample (``sweep(..., sample=N)``).

    Uniform in ``[low, high]``; integers when both ends are ints; log-uniform with ``log=True``
    (for values spanning orders of magnitude, like a threshold in cycles).
    """

    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        if not self.low <= self.high:
            raise ValueError(f"Range({self.low}, {self.high}): low must not exceed high")
        if self.log and self.low <= 0:
            raise ValueError(f"Range({self.low}, {self.high}, log=True): both ends must be positive")

    def draw(self, rng: random.Random) -> int | float:
        """One value, from ``rng``."""
        ints = isinstance(self.low, int) and isinstance(self.high, int)
        if self.log:
            x = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
            return min(max(round(x), int(self.low)), int(self.high)) if ints else x
        return rng.randint(int(self.low), int(self.high)) if ints else rng.uniform(self.low, self.high)


class SweepError(ValueError):
    """Some points of a sweep failed. The others ran and were saved: ``frame`` holds every
    point (failed ones with their message in the ``error`` column) and ``failed`` the failed
    points' settings. The first failure is the ``__cause__``."""

    def __init__(self, message: str, frame: pd.DataFrame, failed: list[Settings]):
        super().__init__(message)
        self.frame = frame
        self.failed = failed


def _plain(value: Any) -> Any:
    """NumPy scalars as Python ones (for JSON keys and the native layer)."""
    if hasattr(value, "item") and not isinstance(value, (list, tuple, dict, str)):
        return value.item()
    return value


def _value_list(key: str, values: Values, sampling: bool) -> list[Any] | Range:
    if isinstance(values, Range):
        if not sampling:
            raise ValueError(f"{key}: a Range is drawn from in a random sample: pass sample=N")
        return values
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, Iterable):
        return [values]
    out = [_plain(v) for v in values]
    if not out:
        raise ValueError(f"{key}: no values to sweep")
    return out


def points(
    scenario: Scenario,
    grid: Mapping[str, Values] | None = None,
    *,
    seeds: int | Iterable[int] | None = None,
    sample: int | None = None,
    sample_seed: int = 0,
) -> list[Settings]:
    """The points a sweep runs, in order.

    The keys are the scenario's own ``[[sweep]]`` keys, then ``grid``'s (a grid key the file
    sweeps replaces its values, as ``corehop sim --sweep`` does), then ``seed`` when ``seeds``
    is given (an int ``n`` means seeds 1..n). Without ``sample``: every combination, the last
    key varying fastest. With ``sample=N``: N distinct combinations drawn with
    ``random.Random(sample_seed)`` (a list gives one of its values, a :class:`Range` a value
    in it), each run with every seed.
    """
    sampling = sample is not None
    keys: dict[str, list[Any] | Range] = {k: list(v) for k, v in scenario.sweeps()}
    for key, values in (grid or {}).items():
        keys[key] = _value_list(key, values, sampling)
    seed_values: list[int] | None = None
    if seeds is not None:
        if isinstance(seeds, int) and seeds > MAX_POINTS:
            raise ValueError(f"seeds={seeds}: at most {MAX_POINTS} points run in one sweep")
        seed_values = list(range(1, seeds + 1)) if isinstance(seeds, int) else [int(_plain(s)) for s in seeds]
        if not seed_values:
            raise ValueError("seeds: no seeds to run")
        keys.pop("seed", None)
    names = list(keys)
    # Every point is built before the first runs: bound them as `corehop sim` does.
    per_combo = len(seed_values or [1])
    if not sampling:
        total = math.prod(len(keys[k]) for k in names) * per_combo
        if total > MAX_POINTS:
            raise ValueError(
                f"the grid has {total} points: at most {MAX_POINTS} run in one sweep (sample=N draws fewer)"
            )
        combos = [list(c) for c in itertools.product(*(keys[k] for k in names))]
    else:
        if sample < 1:
            raise ValueError(f"sample={sample}: draw at least one point")
        if sample * per_combo > MAX_POINTS:
            raise ValueError(f"sample={sample} x {per_combo} seeds: at most {MAX_POINTS} points run in one sweep")
        combos = _draw(names, keys, sample, random.Random(sample_seed))
    if seed_values is None:
        return [list(zip(names, c)) for c in combos]
    return [list(zip(names, c)) + [("seed", s)] for c in combos for s in seed_values]


def _draw(names: list[str], keys: dict[str, list[Any] | Range], n: int, rng: random.Random) -> list[list[Any]]:
    if all(isinstance(keys[k], list) for k in names):
        # A finite grid: n distinct combinations, by index (no retries, no duplicates).
        sizes = [len(keys[k]) for k in names]
        total = math.prod(sizes)
        if n > total:
            raise ValueError(f"sample={n}: the grid has only {total} combinations")
        combos = []
        for index in rng.sample(range(total), n):
            combo = []
            for key, size in zip(reversed(names), reversed(sizes)):
                index, digit = divmod(index, size)
                combo.append(keys[key][digit])
            combos.append(combo[::-1])
        return combos
    seen: set[str] = set()
    combos = []
    for _ in range(100 * n):
        combo = [v.draw(rng) if isinstance(v, Range) else rng.choice(v) for v in (keys[k] for k in names)]
        tag = _point_id(list(zip(names, combo)))
        if tag not in seen:
            seen.add(tag)
            combos.append(combo)
            if len(combos) == n:
                return combos
    raise ValueError(f"sample={n}: could not draw that many distinct points from these ranges")


def _point_id(settings: Settings) -> str:
    """A point's identity in an output file (what a resumed sweep matches on)."""
    return json.dumps([[k, v] for k, v in settings], separators=(",", ":"), sort_keys=True)


def flatten(report: Mapping[str, Any]) -> dict[str, Any]:
    """One report as a flat row: the columns of ``corehop sim --csv`` plus ``stop`` and
    ``headline`` (the model's first metric)."""
    row: dict[str, Any] = {k: report[k] for k in ("scenario", "kind", "machine", "seed", "stop")}
    for k in ("elapsed_ns", "events", "ops", "throughput_per_s"):
        row[k] = report[k]
    for name in ("op_latency", "queue_delay"):
        summary = report.get(name) or {}
        row[f"{name}_mean_ns"] = summary.get("mean_ns", math.nan)
        row[f"{name}_p99_ns"] = summary.get("p99_ns", math.nan)
    row["hops"] = report["hops"]
    row["hop_cost_ns"] = math.nan if report.get("hop_cost_ns") is None else report["hop_cost_ns"]
    for cpu in report["cpus"]:
        row[f"cpu{cpu['cpu']}_busy_fraction"] = cpu["busy_fraction"]
    for cpu in report["cpus"]:
        row[f"cpu{cpu['cpu']}_poll_ns"] = cpu["poll_ns"]
    metrics = report["model"]["metrics"]
    for m in metrics:
        row[f"{m['name']} ({m['unit']})"] = math.nan if m["value"] is None else m["value"]
    row["headline"] = (math.nan if metrics[0]["value"] is None else metrics[0]["value"]) if metrics else math.nan
    return row


def to_frame(reports: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Reports (dicts from :func:`corehop.run`) as a DataFrame, one :func:`flatten` row each."""
    if isinstance(reports, Mapping):
        reports = [reports]
    return pd.DataFrame([flatten(r) for r in reports])


def _cell(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def _row(settings: Settings, result: Mapping[str, Any] | BaseException) -> dict[str, Any]:
    row: dict[str, Any] = {k: _cell(v) for k, v in settings}
    row["point"] = _point_id(settings)
    if isinstance(result, BaseException):
        row["error"] = str(result)
    else:
        row["error"] = None
        for k, v in flatten(result).items():
            row.setdefault(k, v)  # a swept `seed` is already there, with the same value
    return row


def _read(path: Path) -> pd.DataFrame:
    frame = pd.read_parquet(path) if _is_parquet(path) else pd.read_csv(path)
    if "point" not in frame.columns:
        raise ValueError(f"{path}: not the output of a corehop sweep (no `point` column); not touching it")
    return frame


def _is_parquet(path: Path) -> bool:
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return True
    if suffix == ".csv":
        return False
    raise ValueError(f"{path}: the output is a .parquet or .csv file")


def _write(frame: pd.DataFrame, path: Path) -> None:
    """Writes the whole file anew, atomically (a crash leaves the previous version)."""
    tmp = path.with_name(path.name + ".tmp")
    if _is_parquet(path):
        frame = frame.copy()
        for col in frame.columns:
            if frame[col].dtype == object:
                kinds = {type(v) for v in frame[col] if v is not None and not (isinstance(v, float) and math.isnan(v))}
                if len(kinds) > 1:  # Parquet columns have one type: mixed values as text
                    frame[col] = [None if v is None else str(v) for v in frame[col]]
        frame.to_parquet(tmp, index=False)
    else:
        frame.to_csv(tmp, index=False)
    os.replace(tmp, path)


def _use_ray(backend: str, address: str | None) -> bool:
    if backend not in ("auto", "local", "ray"):
        raise ValueError(f"backend={backend!r}: use 'auto', 'local' or 'ray'")
    if backend != "auto":
        return backend == "ray"
    if address is not None:
        return True
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _run_local(scenario: Scenario, todo: list[Settings], jobs: int) -> Iterator[tuple[int, Any]]:
    yield from scenario.run_points(todo, jobs)


_ray_batch = None


def _run_ray(
    scenario: Scenario, todo: list[Settings], address: str | None, batch_size: int | None
) -> Iterator[tuple[int, Any]]:
    import ray

    global _ray_batch
    if not ray.is_initialized():
        ray.init(address=address)
    if _ray_batch is None:

        @ray.remote(num_cpus=1)
        def run_batch(scenario: Scenario, batch: list[tuple[int, Settings]]) -> list[tuple[int, Any]]:
            indices = [i for i, _ in batch]
            results = scenario.run_points([s for _, s in batch], 1)
            return [(indices[j], result) for j, result in results]

        _ray_batch = run_batch
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    size = batch_size or max(1, math.ceil(len(todo) / (4 * cpus)))
    shared = ray.put(scenario)
    numbered = list(enumerate(todo))
    pending = [_ray_batch.remote(shared, numbered[start : start + size]) for start in range(0, len(todo), size)]
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            yield from ray.get(ready[0])
    finally:
        for ref in pending:
            ray.cancel(ref)


def sweep(
    scenario: ScenarioLike,
    grid: Mapping[str, Values] | None = None,
    *,
    seeds: int | Iterable[int] | None = None,
    sample: int | None = None,
    sample_seed: int = 0,
    output: str | os.PathLike[str] | None = None,
    jobs: int | None = None,
    backend: Literal["auto", "local", "ray"] = "auto",
    address: str | None = None,
    batch_size: int | None = None,
    progress: bool = True,
    errors: Literal["raise", "record"] = "raise",
    save_every_s: float = 5.0,
) -> pd.DataFrame:
    """Runs a scenario once per point of a grid or a random sample, and returns one row per
    point, in point order.

    Points are described in :func:`points` (``grid`` maps dotted keys to lists of values;
    ``seeds`` adds a seed key; ``sample=N`` draws N combinations instead of the full grid).
    Each row holds the point's settings (one column per key), ``point`` (its identity),
    ``error`` (None, or why it failed) and the :func:`flatten`\\ ed report. Results do not
    depend on where or in what order points run.

    Where: on ``jobs`` local threads (default: every CPU this process may use; 1 runs the points
    one after another), or on Ray when ``backend="ray"`` (a local Ray instance is started if
    none is running), when ``address`` is given (a cluster to connect to), or when
    ``ray.init()`` was already called (``backend="auto"``). On Ray,
    one task runs each batch of ``batch_size`` points (default: about four batches per CPU of
    the cluster); the workers need this package installed and any machine file the scenario
    names at the same path.

    ``output`` (``.parquet`` or ``.csv``) is rewritten every ``save_every_s`` seconds and at
    the end, also when interrupted. If it exists, the points it already holds without an error
    are not run again (a resumed sweep), failed ones are retried, and rows of other points are
    kept.

    A failing point does not stop the others. With ``errors="record"`` its message stays in the
    ``error`` column; with ``errors="raise"`` (the default), once everything else is saved, the
    error itself is raised when every point failed (a :class:`corehop.ScenarioError` naming the
    key, say), else a :class:`SweepError` carrying the frame.
    """
    from . import load

    if errors not in ("raise", "record"):
        raise ValueError(f"errors={errors!r}: use 'raise' or 'record'")
    scenario = load(scenario)
    plan = points(scenario, grid, seeds=seeds, sample=sample, sample_seed=sample_seed)
    ids = [_point_id(p) for p in plan]
    where = {point_id: i for i, point_id in enumerate(ids)}
    rows: list[dict[str, Any] | None] = [None] * len(plan)
    kept: list[dict[str, Any]] = []
    path = Path(output) if output is not None else None
    if path is not None:
        _is_parquet(path)
        if path.exists():
            for old in _read(path).to_dict("records"):
                i = where.get(old["point"])
                if i is None:
                    kept.append(old)
                elif pd.isna(old.get("error")):
                    rows[i] = old
    todo = [i for i, row in enumerate(rows) if row is None]
    use_ray = _use_ray(backend, address)

    def frame() -> pd.DataFrame:
        return pd.DataFrame([r for r in rows if r is not None])

    def save() -> None:
        if path is not None and (kept or any(r is not None for r in rows)):
            _write(pd.concat([frame(), pd.DataFrame(kept)], ignore_index=True) if kept else frame(), path)

    first_error: BaseException | None = None
    bar = tqdm(
        total=len(plan),
        initial=len(plan) - len(todo),
        desc=f"{Path(scenario.file).name} on {'ray' if use_ray else 'local cores'}",
        unit="pt",
        disable=not progress,
    )
    saved_at = time.monotonic()
    try:
        if todo:
            batch = [plan[i] for i in todo]
            results = (
                _run_ray(scenario, batch, address, batch_size)
                if use_ray
                else _run_local(scenario, batch, 0 if jobs is None else jobs)
            )
            for j, result in results:
                i = todo[j]
                rows[i] = _row(plan[i], result)
                if isinstance(result, BaseException) and first_error is None:
                    first_error = result
                bar.update(1)
                if path is not None and time.monotonic() - saved_at >= save_every_s:
                    save()
                    saved_at = time.monotonic()
    finally:
        bar.close()
        save()
    out = frame()
    failed = [plan[i] for i, row in enumerate(rows) if row is not None and not pd.isna(row.get("error"))]
    if failed and errors == "raise":
        if first_error is not None and len(failed) == len(plan):
            raise first_error
        saved = f"; the others are in {path}" if path is not None else ""
        message = f"{len(failed)} of {len(plan)} points failed{saved}; first: {out.loc[out['error'].notna(), 'error'].iloc[0]}"
        raise SweepError(message, out, failed) from first_error
    return out
