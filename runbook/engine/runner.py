"""Running steps: order, retries, one attempt (guards, confirmation, launch), jobs."""

from __future__ import annotations

import asyncio
import time

from runbook import box_claim, plan
from runbook.agent_client import AgentError
from runbook.engine.constants import (
    EXIT_BLOCKED,
    EXIT_FAILED,
    EXIT_OK,
)
from runbook.engine.core import EngineCore
from runbook.engine.launchguards import GuardsChanged
from runbook.events import (
    BLOCKED,
    DONE,
    FAILED,
    LOST,
    PENDING,
    RUNNING,
    SUCCEEDED,
    Notice,
    RunFinished,
)
from runbook.job_fate import ADVICE, FateUnknown, check_found, check_missing
from runbook.schema import Step
from runbook.state import RunAllIntent, StepRecord
from runbook.transports import TransportError


class RunnerMixin(EngineCore):
    """Drives steps to an end state; launches each job once."""

    async def run_all(
        self, start: str | None = None, only: str | None = None, by: str = "auto"
    ) -> int:
        """Run the selected steps in order; stop at the first that does not end done.

        The request is saved as the run's intent first (state + audit) and cleared when it
        ends; a driver killed in between leaves it for the next one. Without start/only a
        saved intent says where to go on. Clearing it (`clear_intent`) stops after the
        running step, which is never killed for it."""
        assert self.state
        saved = self.state.intent
        if start is None and only is None and saved is not None:
            start, only = saved.start, saved.only
        self.set_intent(start, only, by)
        for sid in plan.select(self.rb, start, only):
            if self.state.intent is None:  # the operator stopped run-all: the run stays open
                return EXIT_BLOCKED
            status = await self.run_step(sid)
            await box_claim.push_head(self)
            if status not in DONE:
                self.clear_intent(f"{sid} ended {status}")
                return self.finish(EXIT_BLOCKED if status in (BLOCKED, PENDING) else EXIT_FAILED)
        self.clear_intent("every step done")
        return self.finish(EXIT_OK)

    def set_intent(self, start: str | None, only: str | None, by: str) -> None:
        assert self.state and self.audit
        old = self.state.intent
        if old is not None and (old.start, old.only) == (start, only):
            if not self._intent_taken_up:  # once per driver process
                self._intent_taken_up = True
                self.audit.append("run.intent_resumed", start=start, only=only, by=by)
        else:
            self._intent_taken_up = True
            self.state.intent = RunAllIntent(start=start, only=only, since=time.time(), by=by)
            self.audit.append("run.intent_set", start=start, only=only, by=by)
        self._save()

    def clear_intent(self, why: str) -> bool:
        """Forget the run-all intent (audited); False when there was none."""
        assert self.state and self.audit
        if self.state.intent is None:
            return False
        old, self.state.intent = self.state.intent, None
        self.audit.append("run.intent_cleared", start=old.start, only=old.only, why=why)
        self._save()
        return True

    def finish(self, code: int) -> int:
        assert self.state and self.audit
        summary: dict[str, int] = {}
        for rec in self.state.steps.values():
            summary[rec.status] = summary.get(rec.status, 0) + 1
        self.state.exit_code = code
        self.state.finished = code == EXIT_OK and self.state.all_done()
        self.audit.append(
            "run.finished", exit_code=code, summary=summary, finished=self.state.finished
        )
        self._save()
        self.emit(RunFinished(code, summary, self.audit.head.hash, self.audit.head.seq))
        return code

    async def run_step(self, step_id: str) -> str:
        """Run one step to an end state (or reattach to it); returns its final status."""
        assert self.state
        step = self.rb.step(step_id)
        rec = self.state.steps[step_id]
        if rec.status in DONE:
            return rec.status
        if step.launches_job:  # one driver per work on every box a step uses
            await box_claim.hold_on(self, self.host_of(step))
        if rec.status == RUNNING and rec.job_id:
            return await self._run_job(step, rec, reattach=True)
        unmet = [r for r in step.requires if self.state.steps[r].status not in DONE]
        if unmet:
            self._set(step_id, BLOCKED, "requires_unmet", f"needs {', '.join(unmet)} first")
            return BLOCKED
        if step.hosts is not None:  # one job per host (runbook/engine/fanout.py)
            return await self.run_fanout(step)  # type: ignore[attr-defined]
        if step.skip_if:
            res = await self.evaluate(step, step.skip_if, "skip_if")
            if all(r["ok"] for r in res):
                rec.guards, rec.ended_at = res, time.time()
                self._set(
                    step_id,
                    SUCCEEDED,
                    "already_satisfied",
                    "skip_if holds; nothing to do",
                    {"guards": res},
                )
                return SUCCEEDED
        while True:
            revived = await self.revive_services(step, rec)  # services.py: a dead one restarts
            if revived is not None:
                return revived
            status = await self._attempt(step, rec)
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

    async def _attempt(self, step: Step, rec: StepRecord) -> str:
        if step.launches_job:  # connect first: every record of the step names the host key
            await (await self.session(self.host_of(step))).connection()
        pre = await self.evaluate(step, self.pre_checks(step), "pre")
        rec.guards = pre
        if not all(r["ok"] for r in pre):
            failed = [r for r in pre if not r["ok"]]
            self._set(
                step.id,
                BLOCKED,
                "precondition_failed",
                "; ".join(f"{r['check']}: {r.get('message')}" for r in failed),
                {"guards": pre},
            )
            return BLOCKED
        if step.destructive and not await self._confirm(step, pre):
            return BLOCKED
        if step.stop is not None:
            return await self._stop_service(step, rec)
        if not step.launches_job:  # a gate: guards only
            return await self._finish_ok_or_post(step, rec, start=time.time(), job_end=None)
        rec.attempt += 1
        assert self.state and self.store
        rec.job_id = f"{self.state.run_id}.{step.id}.{rec.attempt}"
        rec.host = self.host_of(step)
        rec.exit_code = rec.signal = None
        rec.started_at, rec.ended_at = time.time(), None
        rec.log_remote_offset = rec.log_mirror_size = 0
        rec.log_file = str(self.store.log_path(step.id, rec.attempt))
        rec.command = step.shown_command
        rec.progress = None
        rec.spool_id = (await self.session(rec.host)).hello.get("spool_id")
        # Recorded before launching: after a crash we look for this job id instead of relaunching.
        self._set(
            step.id,
            RUNNING,
            None,
            None,
            {
                "command": step.shown_command,
                "env": step.env,
                "cwd": step.cwd,
                "detach": step.detach,
                "spool_id": rec.spool_id,
                "guards": pre,
            },
        )
        return await self._run_job(step, rec, reattach=False)

    async def _run_job(self, step: Step, rec: StepRecord, reattach: bool) -> str:
        if step.service is not None:
            return await self._serve(step, rec, reattach)
        return await self._follow_and_finish(step, rec, reattach)

    async def _start_job(self, step: Step, rec: StepRecord) -> None:
        assert self.state
        guards = self.launch_guards(step, rec)  # destructive: re-checked by the agent at launch
        extra: dict = {} if guards is None else {"guards": guards}
        if step.delete:  # the agent's own delete job: it runs no command of ours
            extra["delete"] = self.delete_request(step)  # type: ignore[attr-defined]
        try:
            answer = await self.call(
                rec.host or self.host_of(step),
                "job.start",
                job_id=rec.job_id,
                run_id=self.state.run_id,
                step_id=step.id,
                argv=step.run if isinstance(step.run, list) else None,
                shell=(step.run_exec or step.run) if isinstance(step.run, str) else None,
                cwd=step.cwd,
                env={**step.env, **step.run_env},
                secret_env={var: self.secrets[name] for var, name in step.secret_env.items()},
                timeout_s=step.timeout,
                detach=step.detach or bool(step.delete),  # a delete outlives the connection
                **extra,
            )
        except AgentError as exc:
            # "exists": this launch already happened (a repeat after a reconnect): follow it.
            # "start_failed": the agent recorded the failure (exit 127/126 + message in the log).
            changed = self.refused_at_launch(exc)
            if changed is not None:
                raise changed from None
            if exc.type not in ("exists", "start_failed"):
                raise
            return
        if guards is not None:
            self.record_launch_guards(step, rec, answer.get("guards") or [])

    async def _ensure_started(self, step: Step, rec: StepRecord, host: str, reattach: bool) -> None:
        """Start the recorded job unless the agent already has it (never launch twice)."""
        try:
            info = await self.call(host, "job.status", job_id=rec.job_id)
        except AgentError as exc:
            if exc.type != "not_found":
                raise
            info = None
        if info is None:  # recorded as running but never launched (crash in between)?
            check_missing(rec, (await self.session(host)).hello)  # else: lost, not relaunched
            if reattach:
                self.emit(
                    Notice("info", f"{step.id}: job {rec.job_id} was never started; starting it")
                )
            await self._start_job(step, rec)
        else:
            check_found(rec, info)
        if info is not None and reattach:
            self.emit(
                Notice("info", f"{step.id}: reattached to job {rec.job_id} ({info.get('state')})")
            )

    def _unreachable(self, step: Step, rec: StepRecord, host: str, exc: Exception) -> str:
        rec.ended_at = time.time()
        if isinstance(exc, AgentError) and exc.type == "not_found":  # gone while followed
            exc = FateUnknown("job_vanished", f"{exc.message}; {ADVICE}")
        if isinstance(exc, FateUnknown):
            self._set(step.id, LOST, exc.reason, exc.message)
            return LOST
        if isinstance(exc, AgentError):
            self._set(step.id, FAILED, "launch_error", exc.message)
            return FAILED
        self.emit(Notice("error", f"{host}: {exc}"))
        self._set(step.id, LOST, "unreachable", str(exc))
        return LOST

    async def _follow_and_finish(self, step: Step, rec: StepRecord, reattach: bool) -> str:
        host = rec.host or self.host_of(step)
        try:
            await self._ensure_started(step, rec, host, reattach)
            end = await self._follow(step, rec, host)
        except GuardsChanged as exc:
            return self.block_changed(step, rec, exc)
        except (AgentError, TransportError, FateUnknown) as exc:
            return self._unreachable(step, rec, host, exc)
        return await self._finish_ok_or_post(step, rec, rec.started_at or time.time(), end)
