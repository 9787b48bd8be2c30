"""The attack tally: every fault trial records its attack class and whether the promise held.

Tests take the ``tally`` fixture and call ``tally.trial("class name", held)`` once per trial
(a test with 20 randomised trials records 20). A trial that did not hold is recorded before
the test's own assertion fails, so the table shows the break as well as the failure.
``pytest`` prints the table at the end (tests/conftest.py; under pytest-xdist each worker's
tally is summed on the controller); ``TALLY_JSON=path`` also writes it.

The trials knob: a seeded attack loop runs ``trials(n)`` trials, ``n`` scaled by
``EAGLE_TUI_TRIALS`` (a factor, default 1: every trial; ``make test-fast`` runs a fraction,
a soak run a multiple). At least one trial always runs, so no attack class goes unexercised.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class Tally:
    trials: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    held: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def trial(self, attack: str, held: bool) -> bool:
        self.trials[attack] += 1
        if held:
            self.held[attack] += 1
        return held

    def rows(self) -> list[tuple[str, int, int]]:
        return [(a, n, self.held[a]) for a, n in sorted(self.trials.items())]

    def table(self) -> str:
        rows = self.rows()
        if not rows:
            return ""
        width = max([len("attack class")] + [len(a) for a, _, _ in rows])
        lines = [f"{'attack class':<{width}}  trials  held"]
        lines += [f"{a:<{width}}  {n:>6}  {h:>4}" for a, n, h in rows]
        total_n = sum(n for _, n, _ in rows)
        total_h = sum(h for _, _, h in rows)
        lines.append(f"{'total':<{width}}  {total_n:>6}  {total_h:>4}")
        return "\n".join(lines)

    def merge(self, rows: list[tuple[str, int, int]]) -> None:
        """Add another process's rows (an xdist worker's) to this tally."""
        for attack, n, h in rows:
            self.trials[attack] += n
            self.held[attack] += h

    def dump(self, path: str) -> None:
        data = [{"attack": a, "trials": n, "held": h} for a, n, h in self.rows()]
        with open(path, "w") as f:
            json.dump(data, f, indent=2)


TALLY = Tally()

TRIALS_ENV = "EAGLE_TUI_TRIALS"


def trials_scale() -> float:
    raw = os.environ.get(TRIALS_ENV, "1")
    try:
        scale = float(raw)
    except ValueError:
        raise ValueError(f"{TRIALS_ENV}={raw!r}: expected a factor such as 0.25 or 2") from None
    if scale <= 0:
        raise ValueError(f"{TRIALS_ENV}={raw!r}: the factor must be above 0")
    return scale


def trials(n: int) -> int:
    """How many trials a seeded attack loop of `n` runs now: n scaled by EAGLE_TUI_TRIALS, >= 1.
    The seeds are the loop's own, so a scaled-down run is a prefix of the full one."""
    return max(1, round(n * trials_scale()))


def write_if_asked() -> None:
    path = os.environ.get("TALLY_JSON")
    if path:
        TALLY.dump(path)
