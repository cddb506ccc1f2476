"""corehop's deterministic simulator of asymmetric multicores, from Python.

Load a scenario (a TOML file, TOML text or a dict), set keys, run it, get the report as a dict
or a DataFrame; sweep grids or random samples of keys x seeds on every local core or on Ray.

>>> import corehop
>>> s = corehop.load("scenarios/switch-micro.toml", {"workload.iterations": 100})
>>> report = corehop.run(s, {"machine.preset": "switch-cs", "workload.mechanism": "spin"})
>>> report["ops"]
100

Errors in a scenario raise :class:`ScenarioError` (a ``ValueError``) whose ``key`` is the
dotted key at fault and whose message is the one ``corehop sim`` prints.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Union

from ._corehop import (
    MAX_POINTS,
    PointResults,
    Scenario,
    ScenarioError,
    available_threads,
    cost_model,
    models,
    preset,
    presets,
)
from .sweeps import Range, SweepError, flatten, points, sweep, to_frame

__all__ = [
    "MAX_POINTS",
    "PointResults",
    "Range",
    "Scenario",
    "ScenarioError",
    "SweepError",
    "available_threads",
    "cost_model",
    "flatten",
    "load",
    "models",
    "points",
    "preset",
    "presets",
    "run",
    "sweep",
    "to_frame",
]

#: What :func:`load` and :func:`run` accept as a scenario.
ScenarioLike = Union[Scenario, str, "os.PathLike[str]", Mapping[str, Any]]


def load(source: ScenarioLike, values: Mapping[str, Any] | None = None) -> Scenario:
    """Loads a scenario and sets ``values`` (dotted keys) in it.

    ``source`` is a :class:`Scenario`, the path of a TOML scenario file, or a dict shaped like
    one (``{"machine": {"preset": "switch-cs"}, "workload": {"kind": "switch", ...}}``).
    Raises :class:`ScenarioError` naming the file, key and problem.
    """
    if isinstance(source, Scenario):
        scenario = source
    elif isinstance(source, Mapping):
        scenario = Scenario.from_dict(dict(source))
    elif isinstance(source, (str, os.PathLike)):
        scenario = Scenario.load(os.fspath(source))
    else:
        raise TypeError(f"a scenario is a path, a dict or a corehop.Scenario, not {type(source).__name__}")
    return scenario.with_values(values) if values else scenario


def run(scenario: ScenarioLike, values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Runs one scenario and returns its report as a dict.

    The dict has the shape of a run's ``report`` in ``corehop sim --json``: ``ops``,
    ``throughput_per_s``, ``events``, ``elapsed_ns``, ``op_latency``, ``hops``, ``cpus``,
    ``model`` (``{"op_name", "metrics": [{"name", "value", "unit"}]}``, headline first), ...
    A scenario that sweeps (``[[sweep]]`` with several values) is run with :func:`sweep`.
    The GIL is released while the simulation runs.
    """
    return load(scenario).run(dict(values) if values else None)

