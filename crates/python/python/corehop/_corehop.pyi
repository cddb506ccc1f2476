"""Type hints of the native part of corehop (built from crates/python/src/lib.rs)."""

from collections.abc import Iterable, Iterator, Mapping
from os import PathLike
from typing import Any, Union

#: (dotted key, value) pairs, or a dict of them.
Values = Union[Mapping[str, Any], Iterable[tuple[str, Any]]]

class ScenarioError(ValueError):
    """A scenario that cannot be used; the message is the one `corehop sim` prints."""

    file: str
    """The scenario file (or `<dict>`, `<text>`)."""
    key: str
    """The dotted key at fault, e.g. `workload.calls[1].length`, or `line N` for syntax."""
    problem: str
    """What is wrong with it."""

class Scenario:
    """A scenario document (a TOML table and where it came from), before validation.
    Immutable; pickles."""

    @staticmethod
    def load(path: str | PathLike[str]) -> Scenario:
        """Loads a scenario file (TOML)."""
    @staticmethod
    def from_toml(text: str, name: str = "<text>") -> Scenario:
        """Parses scenario TOML text; `name` stands for the file in errors."""
    @staticmethod
    def from_dict(data: Mapping[str, Any], name: str = "<dict>") -> Scenario:
        """A scenario from a dict shaped like the TOML file."""
    def with_values(self, values: Values) -> Scenario:
        """A copy with dotted keys set; a key the file sweeps is pinned to the one value."""
    @property
    def file(self) -> str:
        """The file name (or stand-in) errors mention."""
    def to_dict(self) -> dict[str, Any]:
        """The document as a dict."""
    def to_toml(self) -> str:
        """The document as TOML text."""
    def sweeps(self) -> list[tuple[str, list[Any]]]:
        """The document's `[[sweep]]`s: (key, values)."""
    def validate(self) -> None:
        """Checks machine, costs and limits (the workload is checked by its model when run)."""
    def run(self, values: Values | None = None) -> dict[str, Any]:
        """Runs the scenario (with `values` set) and returns its report; releases the GIL."""
    def run_points(self, points: Iterable[Values], jobs: int = 0) -> PointResults:
        """Runs one simulation per point on `jobs` threads (0: every allowed CPU); yields
        (index, report dict or exception) as points finish."""

class PointResults(Iterator[tuple[int, Union[dict[str, Any], BaseException]]]):
    """Results of `Scenario.run_points` in completion order; dropping it skips the rest."""

    def __next__(self) -> tuple[int, Union[dict[str, Any], BaseException]]: ...
    def __len__(self) -> int:
        """Points not yet reported."""

def models() -> list[tuple[str, str]]:
    """The workload models: (kind, what it models)."""

def presets() -> list[tuple[str, str]]:
    """The machine presets: (name, what it is)."""

def preset(name: str) -> dict[str, Any]:
    """A machine preset as data (the dict a machine TOML file holds)."""

def cost_model(name: str) -> dict[str, Any]:
    """The simulator's cost model for a preset, as the `[costs]` table."""

def available_threads() -> int:
    """CPUs this process may run on."""

#: The most points one sweep runs: every point is built before the first one runs.
MAX_POINTS: int
