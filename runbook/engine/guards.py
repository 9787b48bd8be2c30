"""Guard evaluation: probes on the box, step_succeeded from the run's own records."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from runbook import audit_seal
from runbook.agent_client import AgentError
from runbook.audit import redact
from runbook.engine import targets
from runbook.engine.hosts import Hosts
from runbook.engine.record import RunRecord
from runbook.events import SUCCEEDED, Event, GuardsEvaluated
from runbook.schema import Step, StepSucceeded
from runbook.state import list_runs


class Guards:
    """Evaluates preconditions, postconditions and skip_if checks; remembers the artifacts
    the passing ones vouched for, which the delete targets protect (runbook/engine/targets.py)."""

    def __init__(self, record: RunRecord, hosts: Hosts, emit: Callable[[Event], None]) -> None:
        self.record, self.hosts, self.emit = record, hosts, emit
        self.verified: set[str] = set()  # artifacts guards vouched for in this run

    def pre_checks(self, step: Step) -> list[Any]:
        return targets.pre_checks(step, self.verified)

    def delete_request(self, step: Step) -> dict[str, Any]:
        return targets.delete_request(step, self.verified)

    async def evaluate(
        self, step: Step, checks: list, phase: str, notes: list[dict[str, Any]] | None = None
    ) -> list[dict[str, Any]]:
        """Each result says its phase (a skip_if that does not hold is not a failure); `notes`
        are extra fields per check (the dry run's `dry_run` and `pending_on`)."""
        results: list[dict[str, Any]] = []
        for i, check in enumerate(checks):
            if isinstance(check, StepSucceeded):
                res = self.step_succeeded(check)
            elif check.check == "dir_size" and any(
                r["check"] == "delete_target" and not r["ok"] for r in results
            ):  # never walk a refused target (it may be / or $HOME)
                res = {"ok": False, "observed": None, "message": "not measured: target refused"}
            else:
                try:
                    res = await self.hosts.call(
                        self.hosts.host_of(step), "probe", check=check.probe()
                    )
                except AgentError as exc:
                    res = {"ok": False, "observed": None, "message": f"probe failed: {exc.message}"}
            self.verified.update(targets.verified_paths(check, res))
            res = {"check": check.check, "title": check.title, "phase": phase, **res}
            res.update(notes[i] if notes else {})
            results.append(redact(res, self.record.secrets.values()))
        self.emit(GuardsEvaluated(step.id, phase, tuple(results)))
        return results

    def step_succeeded(self, check: StepSucceeded) -> dict[str, Any]:
        state = self.record.state
        assert state
        rec = state.steps.get(check.step)
        if rec is not None and rec.status == SUCCEEDED:
            return {
                "ok": True,
                "observed": {"run_id": state.run_id, "ended_at": rec.ended_at},
                "message": f"{check.step} succeeded in this run",
            }
        if check.within is not None:
            horizon = time.time() - check.within
            state_dir = self.record.state_dir
            for run in reversed(list_runs(state_dir, self.record.rb.name)):
                other = run.steps.get(check.step)
                if (
                    run.run_id != state.run_id
                    and other
                    and other.status == SUCCEEDED
                    and (other.ended_at or 0) >= horizon
                    and audit_seal.audit_status(state_dir, run.run_id, check.step) == SUCCEEDED
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
