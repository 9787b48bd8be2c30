"""Execution order: file order, except that a step always comes after the steps it requires."""

from __future__ import annotations

from runbook.schema import Runbook


def ordered_steps(rb: Runbook) -> list[str]:
    """Stable topological order (requires are acyclic: the loader refuses cycles)."""
    done: set[str] = set()
    order: list[str] = []
    by_id = {s.id: s for s in rb.steps}

    def place(sid: str) -> None:
        if sid in done:
            return
        done.add(sid)
        for req in by_id[sid].requires:
            place(req)
        order.append(sid)

    for s in rb.steps:
        place(s.id)
    return order


def select(rb: Runbook, start: str | None = None, only: str | None = None) -> list[str]:
    # a fan-out's per-host children run with their fan-out step (runbook/engine/fanout.py)
    children = {s.id for s in rb.steps if s.fanout_of is not None}
    order = [sid for sid in ordered_steps(rb) if sid not in children or sid in (start, only)]
    if only is not None:
        return [only]
    if start is not None:
        return order[order.index(start) :]
    return order
