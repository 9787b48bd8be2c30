"""What quitting does to live work: a bound step's job dies with the cockpit (its agent session
ends), a detached one keeps running on the box and is reattached on the next launch. The cockpit
asks before quitting while a bound step runs, naming both lists, and says afterwards what it did."""

from __future__ import annotations

from dataclasses import dataclass, field

from runbook.events import RUNNING


@dataclass(frozen=True)
class LiveWork:
    bound: list[str] = field(default_factory=list)  # killed when the cockpit quits
    detached: list[str] = field(default_factory=list)  # keep running; reattached on relaunch


def live_work(engine) -> LiveWork:  # noqa: ANN001  (runbook.engine.Engine; avoids an import cycle)
    state = engine.state
    if state is None:
        return LiveWork()
    bound, detached = [], []
    for sid, rec in state.steps.items():
        if rec.status != RUNNING:
            continue
        try:
            is_detached = engine.rb.step(sid).detach
        except KeyError:  # a step the runbook no longer has: its job, if any, is on the box
            is_detached = True
        (detached if is_detached else bound).append(sid)
    return LiveWork(bound, detached)


def ask_text(work: LiveWork) -> tuple[str, str]:
    """Title and body of the question asked before quitting kills bound steps."""
    body = (
        f"Bound to this cockpit, killed when it quits: {', '.join(work.bound)}.\n"
        "Their jobs get TERM and the steps end as lost; run them again to redo them."
    )
    if work.detached:
        body += (
            f"\n\nDetached, keep running on the box: {', '.join(work.detached)}."
            "\nRelaunch on the same run to reattach them."
        )
    return f"Quit and kill {', '.join(work.bound)}?", body


def farewell(work: LiveWork, relaunch: str) -> list[str]:
    """Lines printed after the cockpit exits: exactly what was killed and what survives."""
    out = []
    if work.bound:
        out.append(f"killed with the cockpit (bound steps): {', '.join(work.bound)}")
    if work.detached:
        out.append(
            f"still running on the box (detached): {', '.join(work.detached)}; "
            f"reattach with: {relaunch}"
        )
    return out
