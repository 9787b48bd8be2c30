"""Polling for a condition that another process (or thread) makes true."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    pred: Callable[[], T], timeout: float = 30.0, what: str = "condition", interval: float = 0.02
) -> T:
    """Poll `pred` until it returns something truthy and return that; fail the test naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
