"""Fault-injection suite: attacks on the safety promises, each trial counted in the tally."""

from __future__ import annotations

import pytest

from tests.faults.tally import TALLY, Tally, write_if_asked


@pytest.fixture
def tally() -> Tally:
    return TALLY


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001
    table = TALLY.table()
    if table:
        terminalreporter.section("attack tally (class, trials, promise held)")
        terminalreporter.write_line(table)
    write_if_asked()
