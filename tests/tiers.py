"""The suite's tiers, in one place (tests/conftest.py marks the items from here):

- `attack`: every test of tests/faults and every test that counts trials in the tally (the
  multibox attacks). `pytest -m attack` runs the attack suite alone.
- `slow`: the tests whose measured duration (the xdist full run's `--durations`, recorded in
  docs/ARCHITECTURE.md "Test tiers") is long enough that the edit loop skips them:
  `make test-fast` runs `-m "not slow"`; `make test` and CI run everything.

A prefix names a file (or a folder, or a test with its parameters left open); a new slow test
is added here, not marked in its file, so the tiers stay readable in one list.
"""

from __future__ import annotations

from typing import Any

# nodeid prefixes, each from a measured duration (seconds on the loaded 2-core machine)
SLOW: tuple[str, ...] = ()


def attack_item(item: Any) -> bool:
    return item.nodeid.startswith("tests/faults/") or "tally" in getattr(item, "fixturenames", ())


def slow_item(nodeid: str) -> bool:
    return nodeid.startswith(SLOW)
