"""Fan-out: a step with `hosts:` runs its per-host children together and ends when all have.

The children (built by runbook/fanout_expand.py) are ordinary steps: each has its record,
attempts, retries, job id, mirrored log and audit records naming its host and host key, so
every per-host guarantee (reattach from the saved cursor, exactly-once logs, never launching a
job twice) is the single-host one. The fan-out step itself records the set: `running` with its
hosts before the first launch, then `succeeded` when every child is done, else the worst child
outcome (lost before failed before blocked), with each host's outcome in the audit record.
Each host also gets the runbook's driver claim (runbook/box_claim.py) before its job starts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from runbook import box_claim
from runbook.engine.hosts import Hosts
from runbook.engine.record import RunRecord
from runbook.events import BLOCKED, CANCELLED, DONE, FAILED, LOST, RUNNING, SUCCEEDED
from runbook.schema import Step

# which child outcome the fan-out step takes when not all succeeded (first match wins)
_WORST = (LOST, FAILED, CANCELLED, BLOCKED)

RunStep = Callable[[str], Awaitable[str]]


class FanOut:
    """Runs a fan-out step's children at once; names them for the operator's actions."""

    def __init__(self, record: RunRecord, hosts: Hosts) -> None:
        self.record, self.hosts = record, hosts

    def children(self, step: Step) -> list[Step]:
        return [s for s in self.record.rb.steps if s.fanout_of == step.id]

    def running_children(self, step: Step) -> list[str]:
        """The children whose job runs now (a cancel of the fan-out step cancels these)."""
        state = self.record.state
        assert state
        return [
            c.id
            for c in self.children(step)
            if state.steps[c.id].status == RUNNING and state.steps[c.id].job_id
        ]

    def resettable_children(self, step: Step) -> list[str]:
        """The children a retry of the fan-out step makes runnable again (none done or running)."""
        state = self.record.state
        assert state
        return [
            c.id for c in self.children(step) if state.steps[c.id].status not in (*DONE, RUNNING)
        ]

    async def run(self, step: Step, run_step: RunStep) -> str:
        """Run (or reattach to) every child at once with `run_step`; the fan-out step's status."""
        state = self.record.state
        assert state
        rec = state.steps[step.id]
        children = self.children(step)
        hosts = [self._child_where(c) for c in children]
        if rec.status != RUNNING:
            rec.started_at, rec.ended_at = time.time(), None
            self.record.set(
                step.id,
                RUNNING,
                "fanout",
                f"on {len(children)} hosts: {', '.join(c.host or '?' for c in children)}",
                {"fanout": hosts},
            )
        statuses = await asyncio.gather(*(self._run_child(c, run_step) for c in children))
        rec.ended_at = time.time()
        pairs = list(zip(children, statuses, strict=True))
        outcome = [{**self._child_where(c), "status": s, **self._child_end(c)} for c, s in pairs]
        if all(s in DONE for s in statuses):
            self.record.set(
                step.id, SUCCEEDED, "all_hosts", "every host succeeded", {"hosts": outcome}
            )
            return SUCCEEDED
        worst = next(w for w in (*_WORST, statuses[0]) if w in statuses)
        bad = [c for c, s in pairs if s not in DONE]
        self.record.set(
            step.id,
            worst,
            "host_" + worst,
            f"{', '.join(c.host or '?' for c in bad)} did not succeed: see "
            + ", ".join(c.id for c in bad),
            {"hosts": outcome},
        )
        return worst

    async def _run_child(self, child: Step, run_step: RunStep) -> str:
        state = self.record.state
        assert state
        if child.run is not None and state.steps[child.id].status not in DONE:
            try:
                await self._claim(child)
            except box_claim.DriverLocked as exc:
                self.record.set(child.id, BLOCKED, "box_locked", str(exc))
                return BLOCKED
        try:
            return await run_step(child.id)
        except Exception as exc:  # noqa: BLE001 - one host's crash must not hide the others'
            rec = state.steps[child.id]
            if rec.status == RUNNING:
                rec.ended_at = time.time()
                self.record.set(child.id, LOST, "unreachable", f"{type(exc).__name__}: {exc}")
            return LOST

    async def _claim(self, child: Step) -> None:
        """The driver claim on the child's box too (the default host's is taken at open)."""
        try:
            await self.hosts.claim_on(self.hosts.host_of(child))
        except box_claim.DriverLocked:
            raise
        except Exception:  # noqa: BLE001 - unreachable now: the child reports it as lost
            return

    def _child_where(self, child: Step) -> dict[str, Any]:
        where = self.hosts.where_of(child)
        return {
            "step": child.id,
            "host": where["host"],
            "rank": child.host_rank,
            "host_key": where["host_key"],
            "agent_host": where["agent_host"],
        }

    def _child_end(self, child: Step) -> dict[str, Any]:
        state = self.record.state
        assert state
        r = state.steps[child.id]
        return {"job_id": r.job_id, "exit_code": r.exit_code, "attempt": r.attempt}
