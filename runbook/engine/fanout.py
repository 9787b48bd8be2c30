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
from typing import Any

from runbook import box_claim
from runbook.engine.core import EngineCore
from runbook.events import BLOCKED, CANCELLED, DONE, FAILED, LOST, RUNNING, SUCCEEDED
from runbook.schema import Step

# which child outcome the fan-out step takes when not all succeeded (first match wins)
_WORST = (LOST, FAILED, CANCELLED, BLOCKED)


class FanoutMixin(EngineCore):
    def fanout_children(self, step: Step) -> list[Step]:
        return [s for s in self.rb.steps if s.fanout_of == step.id]

    async def run_fanout(self, step: Step) -> str:
        """Run (or reattach to) every child at once; the fan-out step's final status."""
        assert self.state
        rec = self.state.steps[step.id]
        children = self.fanout_children(step)
        hosts = [self._child_where(c) for c in children]
        if rec.status != RUNNING:
            rec.started_at, rec.ended_at = time.time(), None
            self._set(
                step.id,
                RUNNING,
                "fanout",
                f"on {len(children)} hosts: {', '.join(c.host or '?' for c in children)}",
                {"fanout": hosts},
            )
        statuses = await asyncio.gather(*(self._run_child(c) for c in children))
        rec.ended_at = time.time()
        pairs = list(zip(children, statuses, strict=True))
        outcome = [{**self._child_where(c), "status": s, **self._child_end(c)} for c, s in pairs]
        if all(s in DONE for s in statuses):
            self._set(step.id, SUCCEEDED, "all_hosts", "every host succeeded", {"hosts": outcome})
            return SUCCEEDED
        worst = next(w for w in (*_WORST, statuses[0]) if w in statuses)
        bad = [c for c, s in pairs if s not in DONE]
        self._set(
            step.id,
            worst,
            "host_" + worst,
            f"{', '.join(c.host or '?' for c in bad)} did not succeed: see "
            + ", ".join(c.id for c in bad),
            {"hosts": outcome},
        )
        return worst

    # ---- operator actions on a fan-out step act on its hosts' jobs (runbook/engine/operator.py)
    async def cancel(self, step_id: str, grace_s: float = 10.0) -> None:
        step = self.rb.step(step_id)
        if step.hosts is None:
            return await super().cancel(step_id, grace_s)  # type: ignore[misc]
        assert self.state
        running = [
            c.id
            for c in self.fanout_children(step)
            if self.state.steps[c.id].status == RUNNING and self.state.steps[c.id].job_id
        ]
        if not running:
            raise ValueError(f"{step_id} has no job running on any host")
        for cid in running:
            await super().cancel(cid, grace_s)  # type: ignore[misc]

    def reset(self, step_id: str) -> None:
        super().reset(step_id)  # type: ignore[misc]
        step = self.rb.step(step_id)
        assert self.state
        for c in self.fanout_children(step) if step.hosts is not None else ():
            if self.state.steps[c.id].status not in (*DONE, RUNNING):
                super().reset(c.id)  # type: ignore[misc]

    async def _run_child(self, child: Step) -> str:
        assert self.state
        if child.run is not None and self.state.steps[child.id].status not in DONE:
            try:
                await self._claim(child)
            except box_claim.DriverLocked as exc:
                self._set(child.id, BLOCKED, "box_locked", str(exc))
                return BLOCKED
        try:
            return await self.run_step(child.id)  # type: ignore[attr-defined]  # RunnerMixin
        except Exception as exc:  # noqa: BLE001 - one host's crash must not hide the others'
            rec = self.state.steps[child.id] if self.state else None
            if rec is not None and rec.status == RUNNING:
                rec.ended_at = time.time()
                self._set(child.id, LOST, "unreachable", f"{type(exc).__name__}: {exc}")
            return LOST

    async def _claim(self, child: Step) -> None:
        """The driver claim on the child's box too (the default host's is taken at open)."""
        host = self.host_of(child)
        claimed: set[str] = self.__dict__.setdefault("_fanout_claimed", set())
        if host == self.default_host or host in claimed:
            return  # held: box_claim re-takes it on every reconnect of that session
        try:
            await box_claim.hold(_OnHost(self, host))
            claimed.add(host)
        except box_claim.DriverLocked:
            raise
        except Exception:  # noqa: BLE001 - unreachable now: the child reports it as lost
            return

    def _child_where(self, child: Step) -> dict[str, Any]:
        where = self._where(self.host_of(child))
        return {
            "step": child.id,
            "host": where["host"],
            "rank": child.host_rank,
            "host_key": where["host_key"],
            "agent_host": where["agent_host"],
        }

    def _child_end(self, child: Step) -> dict[str, Any]:
        assert self.state
        r = self.state.steps[child.id]
        return {"job_id": r.job_id, "exit_code": r.exit_code, "attempt": r.attempt}


class _OnHost:
    """The engine seen by box_claim.hold with another host as its default (duck-typed)."""

    def __init__(self, engine: EngineCore, host: str) -> None:
        self._engine, self.default_host, self.rb = engine, host, engine.rb

    async def session(self, host: str) -> Any:
        return await self._engine.session(host)
