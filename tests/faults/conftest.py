"""Fault-injection suite: attacks on the safety promises, each trial counted in the tally
(tests/conftest.py prints it, summed over xdist workers)."""

from __future__ import annotations

import pytest

from tests.faults.tally import TALLY, Tally


@pytest.fixture
def tally() -> Tally:
    return TALLY
