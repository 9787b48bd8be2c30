"""Services: start, wait until ready, keep running; stop steps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from runbook.agent_client import AgentError
from runbook.engine.guards import Guards
from runbook.engine.hosts import Hosts
from runbook.engine.jobs import Jobs
from runbook.engine.logmirror import LogFollower
from runbook.engine.outcome import Outcome
from runbook.engine.record import RunRecord
from runbook.events import FAILED, SUCCEEDED, Event, GuardsEvaluated, Notice, ProgressUpdate
from runbook.schema import Step
from runbook.state import StepRecord
from runbook.transports import TransportError

Attempt = Callable[[Step, StepRecord], Awaitable[str]]


class Services:
    """Long-running jobs that succeed once ready, and the steps that stop them."""

    def __init__(
        self,
        record: RunRecord,
        hosts: Hosts,
        guards: Guards,
        jobs: Jobs,
        follower: LogFollower,
        outcome: Outcome,
        emit: Callable[[Event], None],
    ) -> None:
        self.record, self.hosts, self.guards, self.emit = record, hosts, guards, emit
        self.jobs, self.follower, self.outcome = jobs, follower, outcome

    async def serve(self, step: Step, rec: StepRecord, reattach: bool) -> str:
        """A service: mirror its log while polling `ready`; succeed (job still running) once it
        holds; fail if the job exits first or is not ready in time (then stop it)."""
        assert step.service is not None
        svc, host = step.service, rec.host or self.hosts.host_of(step)
        status = await self.jobs.started(step, rec, host, reattach)
        if status is not None:
            return status
        following = asyncio.ensure_future(self.follower.follow(step, rec, host))
        started = time.monotonic()
        try:
            while True:
                if following.done():
                    end = following.result()
                    return await self.outcome.finish(
                        step, rec, rec.started_at or time.time(), end, service_exited=True
                    )
                res = await self.hosts.call(host, "probe", check=svc.ready.probe())
                if res.get("ok"):
                    break
                waited = time.monotonic() - started
                if waited > svc.timeout:
                    await self.hosts.call(host, "job.cancel", job_id=rec.job_id, grace_s=30)
                    end = await following
                    rec.ended_at = time.time()
                    self.record.set(
                        step.id,
                        FAILED,
                        "not_ready",
                        f"not ready after {svc.timeout:.0f}s ({res.get('message')}); stopped it",
                        {"ready": res, "exit_code": (end.get("exit") or {}).get("exit_code")},
                    )
                    return FAILED
                self.emit(
                    ProgressUpdate(
                        step.id,
                        {
                            "kind": "progress",
                            "stage": "waiting until ready",
                            "done": int(waited),
                            "total": int(svc.timeout),
                            "unit": "s",
                        },
                    )
                )
                await asyncio.wait([following], timeout=svc.interval)
        except (AgentError, TransportError) as exc:
            return self.jobs.unreachable(step, rec, host, exc)
        finally:
            if not following.done():
                following.cancel()  # stop mirroring; the service keeps running on the box
                try:
                    await following
                except (asyncio.CancelledError, Exception):
                    pass
        rec.ended_at = time.time()
        ready = {"check": svc.ready.check, "title": svc.ready.title, **res}
        self.emit(GuardsEvaluated(step.id, "ready", (ready,)))
        fields: dict[str, Any] = {
            "ready": ready,
            "guards": rec.guards,
            "duration_s": round(rec.ended_at - (rec.started_at or rec.ended_at), 3),
        }
        if step.postconditions:
            post = await self.guards.evaluate(step, step.postconditions, "post")
            fields["postconditions"] = post
            if not all(r["ok"] for r in post):
                self.record.set(
                    step.id,
                    FAILED,
                    "postcondition_failed",
                    "; ".join(f"{r['check']}: {r.get('message')}" for r in post if not r["ok"])
                    + f" (the service job {rec.job_id} is still running: stop or cancel it)",
                    fields,
                )
                return FAILED
        self.record.set(
            step.id, SUCCEEDED, "service_ready", f"ready; job {rec.job_id} keeps running", fields
        )
        return SUCCEEDED

    async def revive(self, step: Step, rec: StepRecord, attempt: Attempt) -> str | None:
        """Before an attempt of `step`: every service it `uses:` is running, or is restarted
        (at most `service.restarts` times per run, each audited as service.restarted) and
        ready again. Only a job that provably exited is restarted (a `lost` one only when its
        step is idempotent). None when all run; else the status the step ends with (FAILED:
        lost, no restarts left, or the restart did not get ready). `attempt` runs the
        service's step once more (runbook/engine/steps.py)."""
        run, audit = self.record.state, self.record.audit
        assert run and audit
        for sid in step.uses:
            svc_step, srec = self.record.rb.step(sid), run.steps[sid]
            assert svc_step.service is not None  # the loader allows services only
            if srec.status != SUCCEEDED or not srec.job_id:
                continue  # not started (requires holds the step back) or stopped by a step
            host = srec.host or self.hosts.host_of(svc_step)
            try:
                info = await self.hosts.call(host, "job.status", job_id=srec.job_id)
            except AgentError as exc:
                if exc.type != "not_found":
                    return self.jobs.unreachable(step, rec, host, exc)
                info = {"state": "vanished"}
            except TransportError as exc:
                return self.jobs.unreachable(step, rec, host, exc)
            state = info.get("state")
            if state == "running":
                continue
            limit, died = svc_step.service.restarts, srec.job_id
            exit_ = info.get("exit")
            if state != "exited" and not svc_step.idempotent:
                # fate unknown (it may still run, holding GPUs and the port): never launched
                # twice without the operator, as for any `lost` job (docs/SAFETY.md)
                rec.ended_at = time.time()
                self.record.set(
                    step.id,
                    FAILED,
                    "service_lost",
                    f"{sid} (job {died}) is {state}: whether it still runs is unknown, so it is "
                    f"not restarted; check the box, then rerun (or mark {sid} idempotent: true)",
                    {"service": sid, "service_job": died},
                )
                return FAILED
            if srec.restarts >= limit:
                rec.ended_at = time.time()
                self.record.set(
                    step.id,
                    FAILED,
                    "service_died",
                    f"{sid} (job {died}) is {state} ({exit_}); {srec.restarts} of {limit} "
                    "restarts used: start it again by hand or raise service.restarts",
                    {"service": sid, "service_job": died, "service_exit": exit_},
                )
                return FAILED
            srec.restarts += 1
            audit.append(
                "service.restarted",
                step=sid,
                died_job_id=died,
                died_state=state,
                died_exit=exit_,
                restart=srec.restarts,
                limit=limit,
                for_step=step.id,
            )
            self.emit(
                Notice(
                    "warning",
                    f"{sid}: job {died} is {state}; restarting it ({srec.restarts}/{limit}) "
                    f"so {step.id} can go on",
                )
            )
            status = await attempt(svc_step, srec)
            if status != SUCCEEDED:
                rec.ended_at = time.time()
                self.record.set(
                    step.id,
                    FAILED,
                    "service_restart_failed",
                    f"{sid} did not come back ({srec.reason}: {srec.message})",
                    {"service": sid, "service_job": srec.job_id},
                )
                return FAILED
        return None

    async def stop(self, step: Step, rec: StepRecord) -> str:
        """A `stop:` step: cancel the service's job and wait until it is gone."""
        state = self.record.state
        assert state and step.stop is not None
        target = self.record.rb.step(step.stop)
        trec = state.steps[step.stop]
        host = trec.host or self.hosts.host_of(target)
        start = time.time()
        if not trec.job_id:
            rec.ended_at = time.time()
            self.record.set(step.id, SUCCEEDED, "not_running", f"{step.stop} never started a job")
            return SUCCEEDED
        try:
            info = await self.hosts.call(host, "job.status", job_id=trec.job_id)
            if info.get("state") == "running":
                assert self.record.audit
                self.record.audit.append(
                    "step.cancel_requested", step=step.stop, job_id=trec.job_id, by_step=step.id
                )
                info = await self.hosts.call(host, "job.cancel", job_id=trec.job_id, grace_s=30)
                deadline = time.monotonic() + 120
                while info.get("state") == "running" and time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
                    info = await self.hosts.call(host, "job.status", job_id=trec.job_id)
        except (AgentError, TransportError) as exc:
            return self.jobs.unreachable(step, rec, host, exc)
        rec.ended_at = time.time()
        if info.get("state") == "running":
            self.record.set(
                step.id, FAILED, "stop_failed", f"{trec.job_id} still running after cancel"
            )
            return FAILED
        self.record.set(
            step.id,
            SUCCEEDED,
            "service_stopped",
            f"{step.stop} ({trec.job_id}) is {info.get('state')}",
            {
                "duration_s": round(rec.ended_at - start, 3),
                "stopped_job": trec.job_id,
                "stopped_exit": info.get("exit"),
            },
        )
        return SUCCEEDED
