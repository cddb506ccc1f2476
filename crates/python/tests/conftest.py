from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def scenarios() -> Path:
    """The repository's scenarios/ folder."""
    return ROOT / "scenarios"


@pytest.fixture
def cli() -> str:
    """The corehop command built from this checkout (scripts/test.sh builds it first)."""
    for profile in ("release", "debug"):
        path = ROOT / "target" / profile / "corehop"
        if path.exists():
            return str(path)
    pytest.skip("no corehop binary in target/ (cargo build --release -p corehop)")
