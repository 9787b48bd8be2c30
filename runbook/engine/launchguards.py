"""Fresh guards at launch: a destructive step's guards go into the `job.start` request.

The agent evaluates them right before it spawns the job and refuses (`guards_changed`) when
one fails or its observed value differs from what the operator confirmed; then the step is
blocked (nothing ran) with both values shown, and a new confirmation is needed.
"""

from __future__ import annotations

import json
from typing import Any

from runbook.agent_client import AgentError
from runbook.engine.confirmgate import ConfirmGate
from runbook.engine.guards import Guards
from runbook.engine.record import RunRecord
from runbook.events import BLOCKED
from runbook.schema import Step, StepSucceeded
from runbook.state import StepRecord


class GuardsChanged(Exception):
    def __init__(self, results: list[dict[str, Any]]) -> None:
        super().__init__("guards changed")
        self.results = results


def refused_at_launch(exc: AgentError) -> GuardsChanged | None:
    """The agent's `guards_changed` refusal as GuardsChanged; None for any other error."""
    if exc.type != "guards_changed":
        return None
    try:
        results = json.loads(exc.message)
    except ValueError:
        results = [{"ok": False, "observed": None, "message": exc.message}]
    return GuardsChanged(results)


class LaunchGuards:
    """The confirmed guards sent with `job.start`, and what their answer means."""

    def __init__(self, guards: Guards, record: RunRecord, gate: ConfirmGate) -> None:
        self.guards, self.record, self.gate = guards, record, gate

    def for_start(self, step: Step, rec: StepRecord) -> list[dict[str, Any]] | None:
        """For job.start: each box-side guard with the observed value shown (None: no guards).

        step_succeeded guards are the engine's own records: re-checked here, at the same moment.
        """
        if not step.destructive:
            return None
        shown = rec.guards or []
        out, local = [], []
        for i, check in enumerate(self.guards.pre_checks(step)):
            old = shown[i] if i < len(shown) else {}
            if isinstance(check, StepSucceeded):
                res = self.guards.step_succeeded(check)
                if not res["ok"]:
                    local.append({"check": check.check, "title": check.title, **res})
                continue
            guard: dict[str, Any] = {"check": check.probe()}
            if "observed" in old:
                guard["expect"] = old["observed"]
            out.append(guard)
        if local:
            raise GuardsChanged(local)
        return out

    def record_evidence(self, step: Step, rec: StepRecord, results: list[dict]) -> None:
        """The evidence evaluated at launch replaces the shown one in the step's records."""
        box = iter(results)
        merged = []
        for check, old in zip(self.guards.pre_checks(step), rec.guards or [], strict=False):
            new = old if isinstance(check, StepSucceeded) else next(box, {})
            merged.append({"check": old.get("check"), "title": old.get("title"), **new})
        rec.guards = merged
        assert self.record.audit
        self.record.audit.append(
            "step.launch_guards", step=step.id, job_id=rec.job_id, guards=merged
        )

    def block(self, step: Step, rec: StepRecord, exc: GuardsChanged) -> str:
        """Blocked, nothing ran: each moved or failing guard shown with both observed values."""
        shown = rec.guards or []
        pairs = zip(self.guards.pre_checks(step), shown, strict=False)
        named = [g for c, g in pairs if not isinstance(c, StepSucceeded)]
        lines, now = [], []
        for i, res in enumerate(exc.results):
            old = named[i] if "check" not in res and i < len(named) else {}
            res = {"check": old.get("check"), "title": old.get("title"), **res}
            now.append(res)
            if res.get("ok") and not res.get("changed"):
                continue
            lines.append(
                f"{res['title'] or res['check']}: shown {json.dumps(old.get('observed'))}, "
                f"now {json.dumps(res.get('observed'))} ({res.get('message')})"
            )
        self.gate.forget(step.id)
        self.record.set(
            step.id,
            BLOCKED,
            "guards_changed",
            "evidence changed since it was confirmed; nothing ran: " + "; ".join(lines),
            {"guards_shown": shown, "guards_at_launch": now},
        )
        return BLOCKED
