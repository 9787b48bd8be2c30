"""Operator actions on a step besides running it: skip, unskip, reset (retry), cancel.

On a fan-out step they act on its hosts' children (runbook/engine/fanout.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

from runbook.engine.confirmgate import ConfirmGate
from runbook.engine.fanout import FanOut
from runbook.engine.hosts import Hosts
from runbook.engine.record import RunRecord
from runbook.events import BLOCKED, PENDING, RUNNING, SKIPPED, TERMINAL_BAD, Event, Notice


class Operator:
    """What the operator may do to a step besides running it."""

    def __init__(
        self,
        record: RunRecord,
        hosts: Hosts,
        gate: ConfirmGate,
        fanout: FanOut,
        emit: Callable[[Event], None],
    ) -> None:
        self.record, self.hosts, self.gate, self.fanout, self.emit = (
            record,
            hosts,
            gate,
            fanout,
            emit,
        )

    async def skip(self, step_id: str, reason: str) -> None:
        state = self.record.state
        assert state
        rec = state.steps[step_id]
        if rec.status == RUNNING:
            raise ValueError(f"{step_id} is running; cancel it first")
        if not reason.strip():
            raise ValueError("a skip needs a reason")
        rec.ended_at = time.time()
        leaves = self.record.rb.step(step_id).skipping_leaves
        self.record.set(
            step_id,
            SKIPPED,
            "operator_skip",
            reason.strip(),
            audit={"leaves": leaves} if leaves else None,
        )
        if leaves:
            self.emit(Notice("warning", f"{step_id} skipped: this leaves {leaves}"))

    def reset(self, step_id: str) -> None:
        """Make a blocked/failed/lost/cancelled step runnable again (operator's retry); a
        fan-out step's children that did not end done go with it."""
        self._reset_one(step_id)
        step = self.record.rb.step(step_id)
        for cid in self.fanout.resettable_children(step) if step.hosts is not None else ():
            self._reset_one(cid)

    def _reset_one(self, step_id: str) -> None:
        state = self.record.state
        assert state
        rec = state.steps[step_id]
        if rec.status == RUNNING:
            raise ValueError(f"{step_id} is running")
        self.gate.forget(step_id)  # a retried destructive step is confirmed afresh
        if rec.status in TERMINAL_BAD or rec.status in (BLOCKED, SKIPPED):
            self.record.set(step_id, PENDING, "operator_retry", None)

    def unskip(self, step_id: str, reason: str | None = None) -> None:
        """Undo an operator's skip: the step is pending again (audited, with the operator's
        reason when one is given)."""
        state = self.record.state
        assert state
        if state.steps[step_id].status != SKIPPED:
            raise ValueError(f"{step_id} is not skipped")
        state.steps[step_id].ended_at = None
        self.record.set(step_id, PENDING, "operator_unskip", (reason or "").strip() or None)

    async def cancel(self, step_id: str, grace_s: float = 10.0) -> None:
        """Cancel the step's job (a fan-out step: every host's running job)."""
        step = self.record.rb.step(step_id)
        if step.hosts is None:
            return await self._cancel_one(step_id, grace_s)
        running = self.fanout.running_children(step)
        if not running:
            raise ValueError(f"{step_id} has no job running on any host")
        for cid in running:
            await self._cancel_one(cid, grace_s)

    async def _cancel_one(self, step_id: str, grace_s: float) -> None:
        state, audit = self.record.state, self.record.audit
        assert state
        rec = state.steps[step_id]
        if rec.status != RUNNING or not rec.job_id:
            raise ValueError(f"{step_id} is not running")
        assert audit
        audit.append("step.cancel_requested", step=step_id, job_id=rec.job_id)
        await self.hosts.call(
            rec.host or self.hosts.host_of(self.record.rb.step(step_id)),
            "job.cancel",
            job_id=rec.job_id,
            grace_s=grace_s,
        )
