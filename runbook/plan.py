"""Execution order: file order, except that a step always comes after the steps it requires."""

from __future__ import annotations

import os
import shlex
from typing import Any

from runbook.schema import Runbook, Step, StepSucceeded


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


# ------------------------------------------------------------------ what steps produce
def _norm(path: str) -> str:
    return os.path.normpath(path).rstrip("/") or "/"


def produced_paths(step: Step) -> set[str]:
    """Paths a step leaves behind when it runs: its artifacts, the paths its postconditions
    check, and the paths its skip_if checks (Ansible's `creates:`); and what it deletes."""
    out = {_norm(p) for p in [*step.artifacts, *step.delete]}
    for check in [*step.postconditions, *step.skip_if]:
        path = getattr(check, "path", None)
        if isinstance(path, str):
            out.add(_norm(path))
    return out


def check_inputs(check: Any) -> list[str]:
    """The paths a guard reads: its `path`, or a command guard's path-like arguments. Free disk
    space reads none: an earlier step's files do not make room (its path only says where)."""
    if getattr(check, "check", None) == "disk_free":
        return []
    path = getattr(check, "path", None)
    if isinstance(path, str):
        return [_norm(path)]
    run = getattr(check, "run", None)
    if isinstance(run, str):
        try:
            words = shlex.split(run)
        except ValueError:  # unbalanced quotes: the command itself will say so
            words = run.split()
    else:
        words = [str(w) for w in run] if isinstance(run, list) else []
    return [_norm(w) for w in words if "/" in w]


def _related(a: str, b: str) -> bool:
    """One path is the other or lies under it (a guard on a dir whose file a step writes)."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def pending_on(check: Any, earlier: list[Step]) -> str | None:
    """The last earlier (not yet done) step this guard waits on, or None when it does not."""
    if isinstance(check, StepSucceeded):
        return check.step if any(s.id == check.step for s in earlier) else None
    inputs = check_inputs(check)
    for step in reversed(earlier):
        made = produced_paths(step)
        if any(_related(i, m) for i in inputs for m in made):
            return step.id
    return None
