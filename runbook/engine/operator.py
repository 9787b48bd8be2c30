"""Operator actions: skip, reset (retry), cancel."""

from __future__ import annotations

import time

from runbook.engine.core import EngineCore
from runbook.events import (
    BLOCKED,
    PENDING,
    RUNNING,
    SKIPPED,
    TERMINAL_BAD,
    Notice,
)


class OperatorMixin(EngineCore):
    """What the operator may do to a step besides running it."""

    async def skip(self, step_id: str, reason: str) -> None:
        assert self.state
        rec = self.state.steps[step_id]
        if rec.status == RUNNING:
            raise ValueError(f"{step_id} is running; cancel it first")
        if not reason.strip():
            raise ValueError("a skip needs a reason")
        rec.ended_at = time.time()
        leaves = self.rb.step(step_id).skipping_leaves
        self._set(
            step_id,
            SKIPPED,
            "operator_skip",
            reason.strip(),
            audit={"leaves": leaves} if leaves else None,
        )
        if leaves:
            self.emit(Notice("warning", f"{step_id} skipped: this leaves {leaves}"))

    def reset(self, step_id: str) -> None:
        """Make a blocked/failed/lost/cancelled step runnable again (operator's retry)."""
        assert self.state
        rec = self.state.steps[step_id]
        if rec.status == RUNNING:
            raise ValueError(f"{step_id} is running")
        self._confirmed.discard(step_id)  # a retried destructive step is confirmed afresh
        if rec.status in TERMINAL_BAD or rec.status in (BLOCKED, SKIPPED):
            self._set(step_id, PENDING, "operator_retry", None)

    def unskip(self, step_id: str, reason: str | None = None) -> None:
        """Undo an operator's skip: the step is pending again (audited, with the operator's
        reason when one is given)."""
        assert self.state
        if self.state.steps[step_id].status != SKIPPED:
            raise ValueError(f"{step_id} is not skipped")
        self.state.steps[step_id].ended_at = None
        self._set(step_id, PENDING, "operator_unskip", (reason or "").strip() or None)

    async def cancel(self, step_id: str, grace_s: float = 10.0) -> None:
        assert self.state
        rec = self.state.steps[step_id]
        if rec.status != RUNNING or not rec.job_id:
            raise ValueError(f"{step_id} is not running")
        assert self.audit
        self.audit.append("step.cancel_requested", step=step_id, job_id=rec.job_id)
        await self.call(
            rec.host or self.host_of(self.rb.step(step_id)),
            "job.cancel",
            job_id=rec.job_id,
            grace_s=grace_s,
        )
