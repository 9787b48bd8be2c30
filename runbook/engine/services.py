"""Services: start, wait until ready, keep running; stop steps."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from runbook.agent_client import AgentError
from runbook.engine.core import EngineCore
from runbook.engine.launchguards import GuardsChanged
from runbook.events import (
    FAILED,
    SUCCEEDED,
    GuardsEvaluated,
    Notice,
    ProgressUpdate,
)
from runbook.job_fate import FateUnknown
from runbook.schema import Step
from runbook.state import StepRecord
from runbook.transports import TransportError


class ServiceMixin(EngineCore):
    """Long-running jobs that succeed once ready, and the steps that stop them."""

    async def _serve(self, step: Step, rec: StepRecord, reattach: bool) -> str:
        """A service: mirror its log while polling `ready`; succeed (job still running) once it
        holds; fail if the job exits first or is not ready in time (then stop it)."""
        assert step.service is not None
        svc, host = step.service, rec.host or self.host_of(step)
        try:
            await self._ensure_started(step, rec, host, reattach)
        except GuardsChanged as exc:
            return self.block_changed(step, rec, exc)
        except (AgentError, TransportError, FateUnknown) as exc:
            return self._unreachable(step, rec, host, exc)
        follower = asyncio.ensure_future(self._follow(step, rec, host))
        started = time.monotonic()
        try:
            while True:
                if follower.done():
                    end = follower.result()
                    return await self._finish_ok_or_post(
                        step, rec, rec.started_at or time.time(), end, service_exited=True
                    )
                res = await self.call(host, "probe", check=svc.ready.probe())
                if res.get("ok"):
                    break
                waited = time.monotonic() - started
                if waited > svc.timeout:
                    await self.call(host, "job.cancel", job_id=rec.job_id, grace_s=30)
                    end = await follower
                    rec.ended_at = time.time()
                    self._set(
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
                await asyncio.wait([follower], timeout=svc.interval)
        except (AgentError, TransportError) as exc:
            return self._unreachable(step, rec, host, exc)
        finally:
            if not follower.done():
                follower.cancel()  # stop mirroring; the service keeps running on the box
                try:
                    await follower
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
            post = await self.evaluate(step, step.postconditions, "post")
            fields["postconditions"] = post
            if not all(r["ok"] for r in post):
                self._set(
                    step.id,
                    FAILED,
                    "postcondition_failed",
                    "; ".join(f"{r['check']}: {r.get('message')}" for r in post if not r["ok"])
                    + f" (the service job {rec.job_id} is still running: stop or cancel it)",
                    fields,
                )
                return FAILED
        self._set(
            step.id, SUCCEEDED, "service_ready", f"ready; job {rec.job_id} keeps running", fields
        )
        return SUCCEEDED

    async def revive_services(self, step: Step, rec: StepRecord) -> str | None:
        """Before an attempt of `step`: every service it `uses:` is running, or is restarted
        (at most `service.restarts` times per run, each audited as service.restarted) and
        ready again. Only a job that provably exited is restarted (a `lost` one only when its
        step is idempotent). None when all run; else the status the step ends with (FAILED:
        lost, no restarts left, or the restart did not get ready)."""
        assert self.state and self.audit
        for sid in step.uses:
            svc_step, srec = self.rb.step(sid), self.state.steps[sid]
            assert svc_step.service is not None  # the loader allows services only
            if srec.status != SUCCEEDED or not srec.job_id:
                continue  # not started (requires holds the step back) or stopped by a step
            host = srec.host or self.host_of(svc_step)
            try:
                info = await self.call(host, "job.status", job_id=srec.job_id)
            except AgentError as exc:
                if exc.type != "not_found":
                    return self._unreachable(step, rec, host, exc)
                info = {"state": "vanished"}
            except TransportError as exc:
                return self._unreachable(step, rec, host, exc)
            state = info.get("state")
            if state == "running":
                continue
            limit, died = svc_step.service.restarts, srec.job_id
            exit_ = info.get("exit")
            if state != "exited" and not svc_step.idempotent:
                # fate unknown (it may still run, holding GPUs and the port): never launched
                # twice without the operator, as for any `lost` job (docs/SAFETY.md)
                rec.ended_at = time.time()
                self._set(
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
                self._set(
                    step.id,
                    FAILED,
                    "service_died",
                    f"{sid} (job {died}) is {state} ({exit_}); {srec.restarts} of {limit} "
                    "restarts used: start it again by hand or raise service.restarts",
                    {"service": sid, "service_job": died, "service_exit": exit_},
                )
                return FAILED
            srec.restarts += 1
            self.audit.append(
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
            status = await self._attempt(svc_step, srec)
            if status != SUCCEEDED:
                rec.ended_at = time.time()
                self._set(
                    step.id,
                    FAILED,
                    "service_restart_failed",
                    f"{sid} did not come back ({srec.reason}: {srec.message})",
                    {"service": sid, "service_job": srec.job_id},
                )
                return FAILED
        return None

    async def _stop_service(self, step: Step, rec: StepRecord) -> str:
        assert self.state and step.stop is not None
        target = self.rb.step(step.stop)
        trec = self.state.steps[step.stop]
        host = trec.host or self.host_of(target)
        start = time.time()
        if not trec.job_id:
            rec.ended_at = time.time()
            self._set(step.id, SUCCEEDED, "not_running", f"{step.stop} never started a job")
            return SUCCEEDED
        try:
            info = await self.call(host, "job.status", job_id=trec.job_id)
            if info.get("state") == "running":
                assert self.audit
                self.audit.append(
                    "step.cancel_requested", step=step.stop, job_id=trec.job_id, by_step=step.id
                )
                info = await self.call(host, "job.cancel", job_id=trec.job_id, grace_s=30)
                deadline = time.monotonic() + 120
                while info.get("state") == "running" and time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
                    info = await self.call(host, "job.status", job_id=trec.job_id)
        except (AgentError, TransportError) as exc:
            return self._unreachable(step, rec, host, exc)
        rec.ended_at = time.time()
        if info.get("state") == "running":
            self._set(step.id, FAILED, "stop_failed", f"{trec.job_id} still running after cancel")
            return FAILED
        self._set(
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
