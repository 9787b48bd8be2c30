"""The executor: drives a loaded runbook through the agents, one step at a time.

State machine (DESIGN.md): pending -> blocked (a guard failed or a confirmation was not given:
nothing ran) | running -> succeeded | failed | lost | cancelled; skipped by the operator.
Status and termination reason are separate fields.

Resumption is the normal path, not a special case: every decision reads the run's state file,
which is written *before* anything happens on the box (a step is recorded `running` with its job
id before `job.start`), so an engine killed at any point and started again either finds the job
(and follows its log from the saved cursor) or finds it was never started (and starts it, under
the same job id, which the agent refuses to start twice).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runbook import audit_seal, box_claim, plan
from runbook.agent_client import AgentError, ConnectionLost, HostSession
from runbook.audit import AuditLog, redact
from runbook.events import (
    BLOCKED,
    CANCELLED,
    DONE,
    FAILED,
    LOST,
    PENDING,
    RUNNING,
    SKIPPED,
    SUCCEEDED,
    TERMINAL_BAD,
    ConnectionChanged,
    DryRunStep,
    Event,
    GuardsEvaluated,
    HostStats,
    LogChunk,
    MetricsUpdate,
    Notice,
    ProgressUpdate,
    RunFinished,
    RunStarted,
    StepChanged,
)
from runbook.loader import LoadedRunbook
from runbook.logsplit import LineSplitter, parse_record
from runbook.schema import Step, StepSucceeded
from runbook.state import RunState, RunStore, StepRecord, list_runs, rechoose_run_id
from runbook.transports import Transport, TransportError

TOOL_VERSION = "eagle-tui 0.1.0"
EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_BLOCKED = 0, 1, 2, 3
LOCAL = "local"


@dataclass(frozen=True)
class ConfirmRequest:
    step_id: str
    title: str
    prompt: str
    command: Any
    evidence: tuple[dict[str, Any], ...]  # the guards' observed values, shown to the operator


@dataclass(frozen=True)
class Confirmation:
    mode: str  # "typed" (TUI) | "auto_confirm" (runbook policy + --yes) | "yes_flag" (--yes STEP)
    typed: str | None = None


Confirmer = Callable[[ConfirmRequest], Awaitable[Confirmation | None]]
# factory(host) or, for a host named in the runbook's `hosts:`, factory(host, HostConfig)
TransportFactory = Callable[..., Transport]


def headless_confirmer(yes: Iterable[str], auto_confirm: Iterable[str]) -> Confirmer:
    """--auto policy: a destructive step runs only with --yes and the runbook's auto_confirm list,
    or when --yes names the step itself."""
    yes = set(yes)
    policy = set(auto_confirm)

    async def confirm(req: ConfirmRequest) -> Confirmation | None:
        if req.step_id in yes:
            return Confirmation("yes_flag")
        if "*" in yes and req.step_id in policy:
            return Confirmation("auto_confirm")
        return None

    return confirm


@dataclass
class _Follow:
    """Per-step log mirroring state while a job is followed."""

    step_id: str
    rec: StepRecord
    path: Path
    splitter: LineSplitter = field(default_factory=LineSplitter)


class Engine:
    def __init__(
        self,
        loaded: LoadedRunbook,
        state_dir: Path,
        transports: TransportFactory,
        confirmer: Confirmer,
        secrets: dict[str, str] | None = None,
        default_host: str | None = None,
        listeners: Iterable[Callable[[Event], None]] = (),
        stats: bool = False,
        reload: Callable[[str], LoadedRunbook] | None = None,
        accept_audit_break: bool = False,
        new_run: bool = False,
    ) -> None:
        self.new_run = new_run
        self.reload = reload  # set: the run id is (re)chosen under the driver claim
        self.accept_audit_break = accept_audit_break
        self.loaded = loaded
        self.rb = loaded.runbook
        self.state_dir = Path(state_dir)
        self.transports = transports
        self.confirmer = confirmer
        self.secrets = dict(secrets or {})
        self.default_host = default_host or self.rb.host or LOCAL
        self.listeners = list(listeners)
        self.want_stats = stats
        self.sessions: dict[str, HostSession] = {}
        self.store: RunStore | None = None
        self.state: RunState | None = None
        self.audit: AuditLog | None = None
        self._confirmed: set[str] = set()
        self._last_save = 0.0
        self._stats_tasks: list[asyncio.Task] = []
        self.closed = False

    # ------------------------------------------------------------------ events & state
    def emit(self, event: Event) -> None:
        for listener in list(self.listeners):
            listener(event)

    def _save(self, force: bool = True) -> None:
        if self.store is None:  # dry run: nothing is written
            return
        now = time.monotonic()
        if force or now - self._last_save > 0.5:
            assert self.store and self.state
            if self.audit:
                self.state.audit_seq, self.state.audit_head = (
                    self.audit.head.seq,
                    self.audit.head.hash,
                )
            self.store.save(self.state)
            self._last_save = now

    def host_of(self, step: Step) -> str:
        return step.host or self.default_host

    def _where(self, host: str) -> dict[str, Any]:
        session = self.sessions.get(host)
        ep = session.endpoint if session else None
        hello = session.hello if session else {}
        return {
            "transport": ep.transport if ep else ("local" if host == LOCAL else "ssh"),
            "host": host,
            "host_key": ep.host_key if ep else None,
            "agent_host": hello.get("hostname"),
            "agent_user": hello.get("user"),
            "boot_id": hello.get("boot_id"),
        }

    def _set(
        self,
        step_id: str,
        status: str,
        reason: str | None = None,
        message: str | None = None,
        audit: dict[str, Any] | None = None,
    ) -> None:
        assert self.state and self.audit
        rec = self.state.steps[step_id]
        rec.status, rec.reason, rec.message = status, reason, message
        step = self.rb.step(step_id)
        fields: dict[str, Any] = {
            "step": step_id,
            "title": step.title,
            "status": status,
            "reason": reason,
            "message": message,
            "attempt": rec.attempt,
            "job_id": rec.job_id,
            "where": self._where(self.host_of(step)),
        }
        fields.update(audit or {})
        self.audit.append("step.state", **fields)
        self._save()
        self.emit(StepChanged(step_id, status, reason, message, rec.attempt, rec.exit_code))

    # ------------------------------------------------------------------ lifecycle
    async def open_readonly(self) -> str:
        """For --dry-run: the latest run's state (or a fresh one) in memory; nothing is written."""
        prior = next(reversed(list_runs(self.state_dir, self.rb.name)), None)
        now = time.time()
        self.state = (
            prior.model_copy(deep=True)
            if prior
            else RunState(
                run_id="(dry-run)",
                runbook_name=self.rb.name,
                runbook_path=str(self.loaded.path.resolve()),
                runbook_sha256=self.loaded.sha256,
                vars=self.loaded.vars,
                created_at=now,
                updated_at=now,
                steps={},
            )
        )
        for s in self.rb.steps:
            self.state.steps.setdefault(s.id, StepRecord())
        return self.state.run_id

    async def open(self, run_id: str) -> str:
        """Create the run, or resume it if its state exists; the run directory stays locked."""
        await box_claim.hold(self)  # one driver per work on the box, before the run id
        if self.reload is not None:
            run_id = rechoose_run_id(self.state_dir, self.rb.name, self.new_run, run_id)
            self.loaded = self.reload(run_id)
            self.rb = self.loaded.runbook
        self.store = RunStore(self.state_dir, run_id)
        self.store.lock()
        box_head = await box_claim.box_head(self, run_id)
        opened = audit_seal.check_run(self.store, box_head, self.accept_audit_break)
        state = opened.state
        resumed = state is not None
        if state is None:
            now = time.time()
            state = RunState(
                run_id=run_id,
                runbook_name=self.rb.name,
                runbook_path=str(self.loaded.path.resolve()),
                runbook_sha256=self.loaded.sha256,
                vars=self.loaded.vars,
                created_at=now,
                updated_at=now,
                steps={},
            )
        for s in self.rb.steps:
            state.steps.setdefault(s.id, StepRecord())
        self.state = state
        self.audit = AuditLog(self.store.audit_path, run_id, self.secrets.values())
        for event, fields in opened.notes:
            self.audit.append(event, **fields)
        info = {
            "runbook": {
                "name": self.rb.name,
                "path": str(self.loaded.path),
                "sha256": self.loaded.sha256,
            },
            "vars": self.loaded.vars,
            "default_host": self.default_host,
            "tool_version": TOOL_VERSION,
        }
        if resumed:
            changed = [
                k
                for k in ("runbook_sha256", "vars")
                if getattr(state, k)
                != (self.loaded.sha256 if k == "runbook_sha256" else self.loaded.vars)
            ]
            if changed:
                self.emit(
                    Notice(
                        "warning",
                        f"resuming run {run_id} with a changed {' and '.join(changed)}; "
                        "succeeded steps are not re-run",
                    )
                )
            state.runbook_sha256, state.vars, state.finished = (
                self.loaded.sha256,
                self.loaded.vars,
                False,
            )
            self.audit.append("run.resumed", changed=changed, **info)
        else:
            self.audit.append("run.started", **info)
        self._save()
        await box_claim.push_head(self)
        self.emit(RunStarted(run_id, self.rb.name, resumed, str(self.state_dir)))
        for sid, rec in state.steps.items():
            if sid in self.rb.step_ids:
                self.emit(
                    StepChanged(
                        sid, rec.status, rec.reason, rec.message, rec.attempt, rec.exit_code
                    )
                )
        return run_id

    async def session(self, host: str) -> HostSession:
        if host not in self.sessions:

            def on_status(state: str, attempt: int, message: str | None, host: str = host) -> None:
                ep = self.sessions[host].endpoint if host in self.sessions else None
                self.emit(
                    ConnectionChanged(host, state, attempt, message, ep.host_key if ep else None)
                )

            config = self.rb.hosts.get(host)
            transport = self.transports(host) if config is None else self.transports(host, config)
            self.sessions[host] = HostSession(host, transport, on_status)
            if self.want_stats:
                self._stats_tasks.append(asyncio.ensure_future(self._stats_loop(host)))
        return self.sessions[host]

    async def call(self, host: str, op: str, **args: Any) -> dict[str, Any]:
        return await (await self.session(host)).call(op, **args)

    async def close(self) -> None:
        """Leave every job running; just let go of the connections and the run lock."""
        self.closed = True
        for t in self._stats_tasks:
            t.cancel()
        await box_claim.push_head(self, clean=True)
        for session in self.sessions.values():
            await session.close()
        if self.store:
            try:
                if self.state is not None:  # None: open() refused before any state existed
                    self._save()
            finally:
                self.store.unlock()

    # ------------------------------------------------------------------ guards
    async def evaluate(self, step: Step, checks: list, phase: str) -> list[dict[str, Any]]:
        results = []
        for check in checks:
            if isinstance(check, StepSucceeded):
                res = self._step_succeeded(check)
            else:
                try:
                    res = await self.call(self.host_of(step), "probe", check=check.probe())
                except AgentError as exc:
                    res = {"ok": False, "observed": None, "message": f"probe failed: {exc.message}"}
            res = {"check": check.check, "title": check.title, **res}
            results.append(redact(res, self.secrets.values()))
        self.emit(GuardsEvaluated(step.id, phase, tuple(results)))
        return results

    def _step_succeeded(self, check: StepSucceeded) -> dict[str, Any]:
        assert self.state
        rec = self.state.steps.get(check.step)
        if rec is not None and rec.status == SUCCEEDED:
            return {
                "ok": True,
                "observed": {"run_id": self.state.run_id, "ended_at": rec.ended_at},
                "message": f"{check.step} succeeded in this run",
            }
        if check.within is not None:
            horizon = time.time() - check.within
            for run in reversed(list_runs(self.state_dir, self.rb.name)):
                other = run.steps.get(check.step)
                if (
                    run.run_id != self.state.run_id
                    and other
                    and other.status == SUCCEEDED
                    and (other.ended_at or 0) >= horizon
                    and audit_seal.audit_status(self.state_dir, run.run_id, check.step) == SUCCEEDED
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

    # ------------------------------------------------------------------ running
    async def run_all(self, start: str | None = None, only: str | None = None) -> int:
        """Run the selected steps in order; stop at the first that does not end done."""
        assert self.state
        for sid in plan.select(self.rb, start, only):
            status = await self.run_step(sid)
            await box_claim.push_head(self)
            if status not in DONE:
                return self.finish(EXIT_BLOCKED if status in (BLOCKED, PENDING) else EXIT_FAILED)
        return self.finish(EXIT_OK)

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
        if rec.status == RUNNING and rec.job_id:
            return await self._run_job(step, rec, reattach=True)
        unmet = [r for r in step.requires if self.state.steps[r].status not in DONE]
        if unmet:
            self._set(step_id, BLOCKED, "requires_unmet", f"needs {', '.join(unmet)} first")
            return BLOCKED
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
        if step.run is not None:  # connect first: every record of the step names the host key
            await (await self.session(self.host_of(step))).connection()
        pre = await self.evaluate(step, step.preconditions, "pre")
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
        if step.destructive and step.id not in self._confirmed:
            req = ConfirmRequest(step.id, step.title, step.confirm or "", step.run, tuple(pre))
            decision = await self.confirmer(req)
            if decision is None:
                self._set(
                    step.id,
                    BLOCKED,
                    "confirmation_required",
                    f"destructive step: confirm it (TUI: type its id; --auto: --yes {step.id})",
                    {"guards": pre},
                )
                return BLOCKED
            assert self.audit
            self.audit.append(
                "step.confirmed",
                step=step.id,
                mode=decision.mode,
                typed=decision.typed,
                prompt=step.confirm,
                command=step.run,
                evidence=pre,
                where=self._where(self.host_of(step)),
            )
            self._confirmed.add(step.id)
        if step.stop is not None:
            return await self._stop_service(step, rec)
        if step.run is None:  # a gate: guards only
            return await self._finish_ok_or_post(step, rec, start=time.time(), job_end=None)
        rec.attempt += 1
        assert self.state and self.store
        rec.job_id = f"{self.state.run_id}.{step.id}.{rec.attempt}"
        rec.host = self.host_of(step)
        rec.exit_code = rec.signal = None
        rec.started_at, rec.ended_at = time.time(), None
        rec.log_remote_offset = rec.log_mirror_size = 0
        rec.log_file = str(self.store.log_path(step.id, rec.attempt))
        rec.command = step.run
        rec.progress = None
        # Recorded before launching: after a crash we look for this job id instead of relaunching.
        self._set(
            step.id,
            RUNNING,
            None,
            None,
            {
                "command": step.run,
                "env": step.env,
                "cwd": step.cwd,
                "detach": step.detach,
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
        try:
            await self.call(
                rec.host or self.host_of(step),
                "job.start",
                job_id=rec.job_id,
                run_id=self.state.run_id,
                step_id=step.id,
                argv=step.run if isinstance(step.run, list) else None,
                shell=step.run if isinstance(step.run, str) else None,
                cwd=step.cwd,
                env=dict(step.env),
                secret_env={var: self.secrets[name] for var, name in step.secret_env.items()},
                timeout_s=step.timeout,
                detach=step.detach,
            )
        except AgentError as exc:
            # "exists": this launch already happened (a repeat after a reconnect): follow it.
            # "start_failed": the agent recorded the failure (exit 127/126 + message in the log).
            if exc.type not in ("exists", "start_failed"):
                raise

    async def _ensure_started(self, step: Step, rec: StepRecord, host: str, reattach: bool) -> None:
        """Start the recorded job unless the agent already has it (never launch twice)."""
        try:
            info = await self.call(host, "job.status", job_id=rec.job_id)
        except AgentError as exc:
            if exc.type != "not_found":
                raise
            info = None
        if info is None:  # recorded as running but never launched (crash in between)
            if reattach:
                self.emit(
                    Notice("info", f"{step.id}: job {rec.job_id} was never started; starting it")
                )
            await self._start_job(step, rec)
        elif reattach:
            self.emit(
                Notice("info", f"{step.id}: reattached to job {rec.job_id} ({info.get('state')})")
            )

    def _unreachable(self, step: Step, rec: StepRecord, host: str, exc: Exception) -> str:
        rec.ended_at = time.time()
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
        except (AgentError, TransportError) as exc:
            return self._unreachable(step, rec, host, exc)
        return await self._finish_ok_or_post(step, rec, rec.started_at or time.time(), end)

    async def _serve(self, step: Step, rec: StepRecord, reattach: bool) -> str:
        """A service: mirror its log while polling `ready`; succeed (job still running) once it
        holds; fail if the job exits first or is not ready in time (then stop it)."""
        assert step.service is not None
        svc, host = step.service, rec.host or self.host_of(step)
        try:
            await self._ensure_started(step, rec, host, reattach)
        except (AgentError, TransportError) as exc:
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

    async def _follow(self, step: Step, rec: StepRecord, host: str) -> dict[str, Any]:
        path = Path(rec.log_file or "")
        path.parent.mkdir(parents=True, exist_ok=True)
        # The mirror may hold bytes written after the last saved cursor: drop them, they come again.
        with open(path, "ab") as f:
            f.truncate(rec.log_mirror_size)
        follow = _Follow(step.id, rec, path)
        session = await self.session(host)
        secrets = [s.encode() for s in self.secrets.values() if s]

        def on_data(start: int, end: int, data: bytes) -> None:
            for s in secrets:
                data = data.replace(s, b"***")
            with open(path, "ab") as f:
                f.write(data)
            rec.log_remote_offset, rec.log_mirror_size = end, rec.log_mirror_size + len(data)
            self.emit(LogChunk(step.id, data.decode("utf-8", "replace")))
            for line in follow.splitter.feed(data):
                self._on_line(step.id, rec, line)
            self._save(force=False)

        end = await session.follow_job(rec.job_id or "", rec.log_remote_offset, on_data)
        for line in follow.splitter.flush():
            self._on_line(step.id, rec, line)
        return end

    def _on_line(self, step_id: str, rec: StepRecord, line: bytes) -> None:
        record = parse_record(line)
        if record is None:
            return
        if record["kind"] == "metrics":
            self.emit(MetricsUpdate(step_id, record))
        elif record["kind"] in ("progress", "result"):
            rec.progress = record
            self.emit(ProgressUpdate(step_id, record))

    async def _finish_ok_or_post(
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
            host = rec.host or self.host_of(step)
            exit_info = job_end.get("exit")
            fields["log"] = await self._log_ref(host, rec, int(job_end.get("log_size") or 0))
            if not exit_info:
                status, reason, message = (
                    LOST,
                    "lost",
                    "the job's process is gone and left no exit record",
                )
            else:
                rec.exit_code, rec.signal = exit_info.get("exit_code"), exit_info.get("signal")
                why = exit_info.get("reason")
                if why == "cancelled":
                    status, reason = CANCELLED, "cancelled"
                elif why == "agent_lost":
                    status, reason, message = (
                        LOST,
                        "agent_lost",
                        "the agent died while this bound job ran",
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
            post = await self.evaluate(step, step.postconditions, "post")
            fields["postconditions"] = post
            if not all(r["ok"] for r in post):
                status, reason = FAILED, "postcondition_failed"
                message = "; ".join(
                    f"{r['check']}: {r.get('message')}" for r in post if not r["ok"]
                )
        if status == SUCCEEDED and step.artifacts:
            fields["artifacts"] = await self._artifacts(step)
        fields["guards"] = rec.guards
        if status == SUCCEEDED and reason is None and job_end is None:
            reason = "guards_passed"
        self._set(step.id, status, reason, message, fields)
        return status

    async def _log_ref(self, host: str, rec: StepRecord, size: int) -> dict[str, Any]:
        ref: dict[str, Any] = {
            "job_id": rec.job_id,
            "start": 0,
            "end": size,
            "mirror": rec.log_file,
        }
        try:
            h = await self.call(host, "job.log_hash", job_id=rec.job_id, start=0, end=size)
            ref["sha256"] = h.get("sha256")
        except (AgentError, ConnectionLost) as exc:
            ref["sha256"] = None
            ref["error"] = str(exc)
        return ref

    async def _artifacts(self, step: Step) -> list[dict[str, Any]]:
        out = []
        for path in step.artifacts:
            res = await self.call(
                self.host_of(step),
                "probe",
                check={"check": "sha256", "path": path, "any_of": ["0" * 64]},
            )
            obs = res.get("observed") or {}
            out.append({"path": path, "sha256": obs.get("sha256"), "size": obs.get("size")})
        return out

    # ------------------------------------------------------------------ operator actions
    async def skip(self, step_id: str, reason: str) -> None:
        assert self.state
        rec = self.state.steps[step_id]
        if rec.status == RUNNING:
            raise ValueError(f"{step_id} is running; cancel it first")
        if not reason.strip():
            raise ValueError("a skip needs a reason")
        rec.ended_at = time.time()
        self._set(step_id, SKIPPED, "operator_skip", reason.strip())

    def reset(self, step_id: str) -> None:
        """Make a blocked/failed/lost/cancelled step runnable again (operator's retry)."""
        assert self.state
        rec = self.state.steps[step_id]
        if rec.status == RUNNING:
            raise ValueError(f"{step_id} is running")
        if rec.status in TERMINAL_BAD or rec.status in (BLOCKED, SKIPPED):
            self._set(step_id, PENDING, "operator_retry", None)

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

    async def dry_run(self) -> int:
        """Evaluate every guard now (read-only probes); change nothing. 0 all pass, 3 some blocked.

        Every guard's observed value is reported (GuardsEvaluated, then one DryRunStep per step).
        A guard that depends on an earlier step (a file it creates) shows as blocked here.
        """
        assert self.state
        blocked = False
        for sid in plan.ordered_steps(self.rb):
            step = self.rb.step(sid)
            host = self.host_of(step)
            what = (
                step.run
                if step.run is not None
                else (f"(stops the {step.stop} service)" if step.stop else None)
            )
            if self.state.steps[sid].status in DONE:
                self.emit(DryRunStep(sid, host, what, step.destructive, "done"))
                continue
            if step.skip_if:
                res = await self.evaluate(step, step.skip_if, "skip_if")
                if all(r["ok"] for r in res):
                    self.emit(DryRunStep(sid, host, what, step.destructive, "satisfied"))
                    continue
            res = await self.evaluate(step, step.preconditions, "pre")
            ok = all(r["ok"] for r in res)
            blocked = blocked or not ok
            self.emit(
                DryRunStep(sid, host, step.run, step.destructive, "would run" if ok else "blocked")
            )
        return EXIT_BLOCKED if blocked else EXIT_OK

    # ------------------------------------------------------------------ stats
    async def _stats_loop(self, host: str) -> None:
        session = self.sessions[host]
        last_seq = -1

        def on_event(msg: dict[str, Any]) -> None:
            nonlocal last_seq
            if msg.get("event") == "stats" and int(msg.get("seq", -1)) > last_seq:
                last_seq = int(msg["seq"])
                self.emit(HostStats(host, msg))

        session.subscribe(on_event)
        paths = list(self.rb.watch) or ["/"]
        # Stop when this session is replaced (e.g. the TUI reconnects after trusting a host key):
        # the new session has its own loop.
        while not self.closed and self.sessions.get(host) is session:
            try:
                conn = await session.connection()
                missed = await conn.call("stats.since", seq=last_seq)
                for sample in missed.get("samples", []):
                    on_event({"event": "stats", **sample})
                await conn.call("stats.watch", paths=paths, interval_s=2.0)
                await conn.closed.wait()
            except TransportError as exc:
                # a permanent refusal (host key, auth) is not retried in a loop; a new session
                # (e.g. after the operator trusts the key) starts its own stats loop
                if exc.permanent:
                    return
                await asyncio.sleep(1.0)
            except (AgentError, ConnectionLost):
                await asyncio.sleep(1.0)
            except asyncio.CancelledError:
                return
