from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def scenarios() -> Path:
    """The repository's scenarios/ folder."""
    return ROOT / "scenarios"


@pytest.fixture
def cli() -> str:
    """The corehop command built from this checkout (the newest of the release and debug
    builds; scripts/test.sh has built the debug one by the time it runs these tests)."""
    built = [p for p in (ROOT / "target" / d / "corehop" for d in ("release", "debug")) if p.exists()]
    if not built:
        pytest.skip("no corehop binary in target/ (cargo build -p corehop)")
    return str(max(built, key=lambda p: p.stat().st_mtime))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A skipped test is listed, with its reason, where scripts/test.sh counts skips."""
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        tmp = ROOT / "target" / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        with open(tmp / "skipped-tests.txt", "a") as f:
            f.write(f"corehop (python) {report.nodeid}: {reason}\n")
