"""Multi-host tests: the extraction test helpers (write_dataset) from tests/eagle3/extraction."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eagle3" / "extraction"))

import pytest  # noqa: E402

from tests.faults.tally import TALLY, Tally, write_if_asked  # noqa: E402


@pytest.fixture
def tally() -> Tally:
    """The fault suite's attack tally (tests/faults/tally.py): these trials count there too."""
    return TALLY


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001
    table = TALLY.table()
    faults = any(  # tests/faults/conftest.py prints the same table when it is loaded too
        getattr(p, "__name__", "").endswith("faults.conftest")
        for p in config.pluginmanager.get_plugins()
    )
    if table and not faults:
        terminalreporter.section("attack tally (class, trials, promise held)")
        terminalreporter.write_line(table)
        write_if_asked()
