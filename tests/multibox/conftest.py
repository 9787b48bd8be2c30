"""Multi-host tests: the extraction test helpers (write_dataset) from tests/eagle3/extraction."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eagle3" / "extraction"))

import pytest  # noqa: E402

from tests.faults.tally import TALLY, Tally  # noqa: E402


@pytest.fixture
def tally() -> Tally:
    """The fault suite's attack tally (tests/faults/tally.py): these trials count there too."""
    return TALLY
