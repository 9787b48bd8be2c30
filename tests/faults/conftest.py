"""Fault-injection suite: attacks on the safety promises, each trial counted in the tally
(tests/conftest.py prints it, summed over xdist workers)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from tests.faults.tally import TALLY, Tally


@pytest.fixture
def tally() -> Tally:
    return TALLY


@pytest.fixture(params=["dash", "bash"])
def bin_sh(request) -> tuple[str, Callable[[list[str]], list[str]]]:
    """(name, wrap): wrap(cmd) runs cmd with that shell as /bin/sh (tests/faults/binsh.py)."""
    from tests.faults.binsh import bash_as_sh, can_bind_bash

    if request.param == "bash":
        if not can_bind_bash():
            pytest.skip("bash as /bin/sh needs root (unshare --mount, mount --bind)")
        return "bash", bash_as_sh
    if os.path.realpath("/bin/sh") != "/usr/bin/dash":
        pytest.skip("/bin/sh is not dash here")
    return "dash", list
