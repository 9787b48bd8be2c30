"""Running one step to an end state: requirements, skip_if, retries, and one attempt (guards,
confirmation, launch), or a reattach to the job it has running."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from runbook.engine.confirmgate import ConfirmGate
from runbook.engine.fanout import FanOut
from runbook.engine.guards import Guards
from runbook.engine.hosts import Hosts
from runbook.engine.jobs import Jobs
from runbook.engine.outcome import Outcome
from runbook.engine.record import RunRecord
from runbook.engine.services import Services
from runbook.events import BLOCKED, DONE, FAILED, LOST, RUNNING, SUCCEEDED, Event, Notice
from runbook.schema import Step
from runbook.state import StepRecord


class StepRunner:
    """Drives a step to an end state; launches each job once."""

    def __init__(
        self,
        record: RunRecord,
        hosts: Hosts,
        guards: Guards,
        gate: ConfirmGate,
        jobs: Jobs,
        outcome: Outcome,
        services: Services,
        fanout: FanOut,
        emit: Callable[[Event], None],
    ) -> None:
        self.record, self.hosts, self.guards, self.gate = record, hosts, guards, gate
        self.jobs, self.outcome, self.services = jobs, outcome, services
        self.fanout, self.emit = fanout, emit

    async def run(self, step_id: str) -> str:
        """Run one step to an end state (or reattach to it); returns its final status."""
        state = self.record.state
        assert state
        step = self.record.rb.step(step_id)
        rec = state.steps[step_id]
        if rec.status in DONE:
            return rec.status
        if step.launches_job:  # one driver per work on every box a step uses
            await self.hosts.claim_on(self.hosts.host_of(step))
        if rec.status == RUNNING and rec.job_id:
            return await self._run_job(step, rec, reattach=True)
        unmet = [r for r in step.requires if state.steps[r].status not in DONE]
        if unmet:
            self.record.set(step_id, BLOCKED, "requires_unmet", f"needs {', '.join(unmet)} first")
            return BLOCKED
        if step.hosts is not None:  # one job per host (runbook/engine/fanout.py)
            return await self.fanout.run(step, self.run)
        if step.skip_if:
            res = await self.guards.evaluate(step, step.skip_if, "skip_if")
            if all(r["ok"] for r in res):
                rec.guards, rec.ended_at = res, time.time()
                self.record.set(
                    step_id,
                    SUCCEEDED,
                    "already_satisfied",
                    "skip_if holds; nothing to do",
                    {"guards": res},
                )
                return SUCCEEDED
        while True:
            revived = await self.services.revive(step, rec, self.attempt)  # a dead one restarts
            if revived is not None:
                return revived
            status = await self.attempt(step, rec)
            if status in DONE or not self._should_retry(step, rec):
                return status
            delay = (
                min(600.0, step.retry.backoff * 2 ** max(rec.attempt - 1, 0)) if step.retry else 0
            )
            self.emit(
                Notice("info", f"{step_id}: retrying in {delay:.0f}s (attempt {rec.attempt + 1})")
            )
            await asyncio.sleep(delay)

    def _should_retry(self, step: Step, rec: StepRecord) -> bool:
        if step.retry is None or rec.attempt > step.retry.max:
            return False
        triggers = set(step.retry.on)
        if rec.status == LOST:
            return "lost" in triggers
        if rec.status == FAILED and rec.reason == "timeout":
            return "timeout" in triggers
        return rec.status == FAILED and rec.reason == "exit_code" and rec.exit_code in triggers

    async def attempt(self, step: Step, rec: StepRecord) -> str:
        """One try: guards, the confirmation of a destructive step, then its job (or gate)."""
        if step.launches_job:  # connect first: every record of the step names the host key
            await (await self.hosts.session(self.hosts.host_of(step))).connection()
        pre = await self.guards.evaluate(step, self.guards.pre_checks(step), "pre")
        rec.guards = pre
        if not all(r["ok"] for r in pre):
            failed = [r for r in pre if not r["ok"]]
            self.record.set(
                step.id,
                BLOCKED,
                "precondition_failed",
                "; ".join(f"{r['check']}: {r.get('message')}" for r in failed),
                {"guards": pre},
            )
            return BLOCKED
        if step.destructive and not await self.gate.ask(step, pre):
            return BLOCKED
        if step.stop is not None:
            return await self.services.stop(step, rec)
        if not step.launches_job:  # a gate: guards only
            return await self.outcome.finish(step, rec, start=time.time(), job_end=None)
        await self.jobs.record_launch(step, rec, pre)
        return await self._run_job(step, rec, reattach=False)

    async def _run_job(self, step: Step, rec: StepRecord, reattach: bool) -> str:
        if step.service is not None:
            return await self.services.serve(step, rec, reattach)
        return await self.jobs.follow_and_finish(step, rec, reattach)
