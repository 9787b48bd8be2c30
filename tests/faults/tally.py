"""The attack tally: every fault trial records its attack class and whether the promise held.

Tests take the ``tally`` fixture and call ``tally.trial("class name", held)`` once per trial
(a test with 20 randomised trials records 20). A trial that did not hold is recorded before
the test's own assertion fails, so the table shows the break as well as the failure.
``pytest tests/faults`` prints the table at the end; ``TALLY_JSON=path`` also writes it.
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

    def dump(self, path: str) -> None:
        data = [{"attack": a, "trials": n, "held": h} for a, n, h in self.rows()]
        with open(path, "w") as f:
            json.dump(data, f, indent=2)


TALLY = Tally()


def write_if_asked() -> None:
    path = os.environ.get("TALLY_JSON")
    if path:
        TALLY.dump(path)
