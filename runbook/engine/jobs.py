"""Jobs: launch a step's job once (its id recorded first), follow it, classify its end.

A job is recorded `running` with its id before `job.start` is sent; after any crash the engine
looks for that id on the box (`ensure_started`) and either follows it from the saved cursor or
starts it under the same id, which the agent refuses to start twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from runbook.agent_client import AgentError
from runbook.engine.guards import Guards
from runbook.engine.hosts import Hosts
from runbook.engine.launchguards import GuardsChanged, LaunchGuards, refused_at_launch
from runbook.engine.logmirror import LogFollower
from runbook.engine.outcome import Outcome
from runbook.engine.record import RunRecord
from runbook.events import FAILED, LOST, RUNNING, Event, Notice
from runbook.job_fate import ADVICE, FateUnknown, check_found, check_missing
from runbook.schema import Step
from runbook.state import StepRecord
from runbook.transports import TransportError


class Jobs:
    """Starts, finds again and follows the job of a step; turns its end into a status."""

    def __init__(
        self,
        record: RunRecord,
        hosts: Hosts,
        guards: Guards,
        launch_guards: LaunchGuards,
        follower: LogFollower,
        outcome: Outcome,
        emit: Callable[[Event], None],
    ) -> None:
        self.record, self.hosts, self.guards = record, hosts, guards
        self.launch_guards, self.follower, self.outcome = launch_guards, follower, outcome
        self.emit = emit

    async def record_launch(self, step: Step, rec: StepRecord, pre: list[dict[str, Any]]) -> None:
        """A new attempt: its job id, host and log mirror, recorded `running` before launching
        (after a crash the engine looks for this job id instead of launching again)."""
        state, store = self.record.state, self.record.store
        assert state and store
        rec.attempt += 1
        rec.job_id = f"{state.run_id}.{step.id}.{rec.attempt}"
        rec.host = self.hosts.host_of(step)
        rec.exit_code = rec.signal = None
        rec.started_at, rec.ended_at = time.time(), None
        rec.log_remote_offset = rec.log_mirror_size = 0
        rec.log_file = str(store.log_path(step.id, rec.attempt))
        rec.command = step.shown_command
        rec.progress = None
        rec.spool_id = await self.hosts.spool_id(rec.host)
        self.record.set(
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

    async def start(self, step: Step, rec: StepRecord) -> None:
        state = self.record.state
        assert state
        guards = self.launch_guards.for_start(step, rec)  # destructive: re-checked at launch
        extra: dict = {} if guards is None else {"guards": guards}
        if step.delete:  # the agent's own delete job: it runs no command of ours
            extra["delete"] = self.guards.delete_request(step)
        secrets = self.record.secrets
        try:
            answer = await self.hosts.call(
                rec.host or self.hosts.host_of(step),
                "job.start",
                job_id=rec.job_id,
                run_id=state.run_id,
                step_id=step.id,
                argv=step.run if isinstance(step.run, list) else None,
                shell=(step.run_exec or step.run) if isinstance(step.run, str) else None,
                cwd=step.cwd,
                env={**step.env, **step.run_env},
                secret_env={var: secrets[name] for var, name in step.secret_env.items()},
                timeout_s=step.timeout,
                detach=step.detach or bool(step.delete),  # a delete outlives the connection
                **extra,
            )
        except AgentError as exc:
            # "exists": this launch already happened (a repeat after a reconnect): follow it.
            # "start_failed": the agent recorded the failure (exit 127/126 + message in the log).
            changed = refused_at_launch(exc)
            if changed is not None:
                raise changed from None
            if exc.type not in ("exists", "start_failed"):
                raise
            return
        if guards is not None:
            self.launch_guards.record_evidence(step, rec, answer.get("guards") or [])

    async def ensure_started(self, step: Step, rec: StepRecord, host: str, reattach: bool) -> None:
        """Start the recorded job unless the agent already has it (never launch twice)."""
        try:
            info = await self.hosts.call(host, "job.status", job_id=rec.job_id)
        except AgentError as exc:
            if exc.type != "not_found":
                raise
            info = None
        if info is None:  # recorded as running but never launched (crash in between)?
            check_missing(rec, (await self.hosts.session(host)).hello)  # else: lost
            if reattach:
                self.emit(
                    Notice("info", f"{step.id}: job {rec.job_id} was never started; starting it")
                )
            await self.start(step, rec)
        else:
            check_found(rec, info)
        if info is not None and reattach:
            self.emit(
                Notice("info", f"{step.id}: reattached to job {rec.job_id} ({info.get('state')})")
            )

    def unreachable(self, step: Step, rec: StepRecord, host: str, exc: Exception) -> str:
        """The status a step ends with when its job cannot be started or followed."""
        rec.ended_at = time.time()
        if isinstance(exc, AgentError) and exc.type == "not_found":  # gone while followed
            exc = FateUnknown("job_vanished", f"{exc.message}; {ADVICE}")
        if isinstance(exc, FateUnknown):
            self.record.set(step.id, LOST, exc.reason, exc.message)
            return LOST
        if isinstance(exc, AgentError):
            self.record.set(step.id, FAILED, "launch_error", exc.message)
            return FAILED
        self.emit(Notice("error", f"{host}: {exc}"))
        self.record.set(step.id, LOST, "unreachable", str(exc))
        return LOST

    async def started(self, step: Step, rec: StepRecord, host: str, reattach: bool) -> str | None:
        """`ensure_started`; None when the job is there, else the status the step ended with
        (blocked: its evidence moved; failed or lost: the box refused or went away)."""
        try:
            await self.ensure_started(step, rec, host, reattach)
        except GuardsChanged as exc:
            return self.launch_guards.block(step, rec, exc)
        except (AgentError, TransportError, FateUnknown) as exc:
            return self.unreachable(step, rec, host, exc)
        return None

    async def follow_and_finish(self, step: Step, rec: StepRecord, reattach: bool) -> str:
        host = rec.host or self.hosts.host_of(step)
        status = await self.started(step, rec, host, reattach)
        if status is not None:
            return status
        try:
            end = await self.follower.follow(step, rec, host)
        except (AgentError, TransportError, FateUnknown) as exc:
            return self.unreachable(step, rec, host, exc)
        return await self.outcome.finish(step, rec, rec.started_at or time.time(), end)
