"""Guard evaluation: probes on the box, step_succeeded from the run's own records."""

from __future__ import annotations

import time
from typing import Any

from runbook import audit_seal
from runbook.agent_client import AgentError
from runbook.audit import redact
from runbook.engine.core import EngineCore
from runbook.engine.targets import verified_paths
from runbook.events import (
    SUCCEEDED,
    GuardsEvaluated,
)
from runbook.schema import Step, StepSucceeded
from runbook.state import list_runs


class GuardsMixin(EngineCore):
    """Evaluates preconditions, postconditions and skip_if checks."""

    async def evaluate(
        self, step: Step, checks: list, phase: str, notes: list[dict[str, Any]] | None = None
    ) -> list[dict[str, Any]]:
        """Each result says its phase (a skip_if that does not hold is not a failure); `notes`
        are extra fields per check (the dry run's `dry_run` and `pending_on`)."""
        results: list[dict[str, Any]] = []
        for i, check in enumerate(checks):
            if isinstance(check, StepSucceeded):
                res = self._step_succeeded(check)
            elif check.check == "dir_size" and any(
                r["check"] == "delete_target" and not r["ok"] for r in results
            ):  # never walk a refused target (it may be / or $HOME)
                res = {"ok": False, "observed": None, "message": "not measured: target refused"}
            else:
                try:
                    res = await self.call(self.host_of(step), "probe", check=check.probe())
                except AgentError as exc:
                    res = {"ok": False, "observed": None, "message": f"probe failed: {exc.message}"}
            self._verified.update(verified_paths(check, res))
            res = {"check": check.check, "title": check.title, "phase": phase, **res}
            res.update(notes[i] if notes else {})
            results.append(redact(res, self.secrets.values()))
        self.emit(GuardsEvaluated(step.id, phase, tuple(results)))
        return results

    def _step_succeeded(self, check: StepSucceeded) -> dict[str, Any]:
        assert self.state
        rec = self.state.steps.get(check.step)
        if rec is not None and rec.status == SUCCEEDED:
            return {
                "ok": True,
                "observed": {"run_id": self.state.run_id, "ended_at": rec.ended_at},
                "message": f"{check.step} succeeded in this run",
            }
        if check.within is not None:
            horizon = time.time() - check.within
            for run in reversed(list_runs(self.state_dir, self.rb.name)):
                other = run.steps.get(check.step)
                if (
                    run.run_id != self.state.run_id
                    and other
                    and other.status == SUCCEEDED
                    and (other.ended_at or 0) >= horizon
                    and audit_seal.audit_status(self.state_dir, run.run_id, check.step) == SUCCEEDED
                ):
                    return {
                        "ok": True,
                        "observed": {"run_id": run.run_id, "ended_at": other.ended_at},
                        "message": f"{check.step} succeeded in run {run.run_id}",
                    }
        status = rec.status if rec else "unknown"
        return {
            "ok": False,
            "observed": {"status": status},
            "message": f"{check.step} has not succeeded in this run (status {status})"
            + (f" nor within {check.within:.0f}s in an earlier one" if check.within else ""),
        }
