"""Exit classification: a job's end (or a gate) turned into a step status, plus evidence."""

from __future__ import annotations

import time
from typing import Any

from runbook.agent_client import AgentError, ConnectionLost
from runbook.engine.guards import Guards
from runbook.engine.hosts import Hosts
from runbook.engine.record import RunRecord
from runbook.events import (
    CANCELLED,
    FAILED,
    LOST,
    SUCCEEDED,
)
from runbook.job_fate import lost_evidence
from runbook.schema import Step
from runbook.state import StepRecord


class Outcome:
    """Classifies how a step ended; postconditions, log hash and artifacts."""

    def __init__(self, record: RunRecord, hosts: Hosts, guards: Guards) -> None:
        self.record, self.hosts, self.guards = record, hosts, guards

    async def finish(
        self,
        step: Step,
        rec: StepRecord,
        start: float,
        job_end: dict[str, Any] | None,
        service_exited: bool = False,
    ) -> str:
        rec.ended_at = time.time()
        fields: dict[str, Any] = {"duration_s": round(rec.ended_at - start, 3)}
        status, reason, message = SUCCEEDED, None, None
        if job_end is not None:
            host = rec.host or self.hosts.host_of(step)
            exit_info = job_end.get("exit")
            fields["log"] = await self._log_ref(host, rec, int(job_end.get("log_size") or 0))
            if not exit_info:
                status, reason, message = (LOST, *lost_evidence(job_end.get("fate")))
            else:
                rec.exit_code, rec.signal = exit_info.get("exit_code"), exit_info.get("signal")
                why = exit_info.get("reason")
                if why == "cancelled":
                    status, reason = CANCELLED, "cancelled"
                elif why == "agent_lost" and rec.exit_code is None:
                    # Killed because its agent died. One that ran to an exit keeps that exit.
                    status, reason, message = (
                        LOST,
                        "agent_lost",
                        "the agent died while this bound job ran; it was stopped",
                    )
                elif why == "timeout":
                    status, reason, message = FAILED, "timeout", f"killed after {step.timeout:.0f}s"
                elif rec.signal:
                    status, reason, message = FAILED, "signal", f"killed by signal {rec.signal}"
                elif rec.exit_code != 0:
                    status, reason, message = (
                        FAILED,
                        "exit_code",
                        f"exited with code {rec.exit_code}",
                    )
                elif service_exited:
                    status, reason = FAILED, "service_exited"
                    message = "the service exited (code 0) before it was ready"
            fields.update(exit_code=rec.exit_code, signal=rec.signal)
        if status == SUCCEEDED and step.postconditions:
            post = await self.guards.evaluate(step, step.postconditions, "post")
            fields["postconditions"] = post
            if not all(r["ok"] for r in post):
                status, reason = FAILED, "postcondition_failed"
                message = "; ".join(
                    f"{r['check']}: {r.get('message')}" for r in post if not r["ok"]
                )
        if status == SUCCEEDED and step.artifacts:
            fields["artifacts"] = await self._artifacts(step)
        if step.delete and rec.progress and rec.progress.get("kind") == "result":
            fields["deleted"] = rec.progress  # the agent's own account: measured, freed, result
        fields["guards"] = rec.guards
        if rec.progress and rec.progress.get("kind") == "result":  # the step's figures
            fields["result"] = rec.progress
        if status == SUCCEEDED and reason is None and job_end is None:
            reason = "guards_passed"
        self.record.set(step.id, status, reason, message, fields)
        return status

    async def _log_ref(self, host: str, rec: StepRecord, size: int) -> dict[str, Any]:
        ref: dict[str, Any] = {
            "job_id": rec.job_id,
            "start": 0,
            "end": size,
            "mirror": rec.log_file,
        }
        try:
            h = await self.hosts.call(host, "job.log_hash", job_id=rec.job_id, start=0, end=size)
            ref["sha256"] = h.get("sha256")
        except (AgentError, ConnectionLost) as exc:
            ref["sha256"] = None
            ref["error"] = str(exc)
        return ref

    async def _artifacts(self, step: Step) -> list[dict[str, Any]]:
        out = []
        for path in step.artifacts:
            res = await self.hosts.call(
                self.hosts.host_of(step),
                "probe",
                check={"check": "sha256", "path": path, "any_of": ["0" * 64]},
            )
            obs = res.get("observed") or {}
            out.append({"path": path, "sha256": obs.get("sha256"), "size": obs.get("size")})
        return out
