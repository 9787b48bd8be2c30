"""The engine's state: events, the run's state file and audit, host sessions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runbook import audit_seal, box_claim
from runbook.agent_client import HostSession
from runbook.audit import AuditLog
from runbook.engine.confirm import Confirmer
from runbook.engine.constants import (
    LOCAL,
    TOOL_VERSION,
    TransportFactory,
)
from runbook.events import (
    ConnectionChanged,
    Event,
    Notice,
    RunStarted,
    StepChanged,
)
from runbook.loader import LoadedRunbook
from runbook.schema import Step
from runbook.state import (
    RunState,
    RunStore,
    StateWriteError,
    StepRecord,
    list_runs,
    rechoose_run_id,
)
from runbook.transports import HostKeyRefusal

if TYPE_CHECKING:
    from runbook.agent_client import AgentError
    from runbook.engine.launchguards import GuardsChanged
    from runbook.schema import StepSucceeded


class EngineCore:
    """Events, persisted state, the audit, host sessions; the other parts build on it."""

    if TYPE_CHECKING:  # what the mixins (runbook/engine/*.py) provide one another, for pyright

        async def evaluate(
            self, step: Step, checks: list, phase: str, notes: list[dict[str, Any]] | None = None
        ) -> list[dict[str, Any]]: ...
        def pre_checks(self, step: Step) -> list[Any]: ...
        def _step_succeeded(self, check: StepSucceeded) -> dict[str, Any]: ...
        async def _confirm(self, step: Step, pre: list[dict[str, Any]]) -> bool: ...
        async def _serve(self, step: Step, rec: StepRecord, reattach: bool) -> str: ...
        async def _stop_service(self, step: Step, rec: StepRecord) -> str: ...
        async def _finish_ok_or_post(
            self, step: Step, rec: StepRecord, *a: Any, **k: Any
        ) -> str: ...
        def launch_guards(self, step: Step, rec: StepRecord) -> list[dict[str, Any]] | None: ...
        def refused_at_launch(self, exc: AgentError) -> GuardsChanged | None: ...
        def record_launch_guards(
            self, step: Step, rec: StepRecord, results: list[dict]
        ) -> None: ...
        def block_changed(self, step: Step, rec: StepRecord, exc: GuardsChanged) -> str: ...
        async def _follow(self, step: Step, rec: StepRecord, host: str) -> dict[str, Any]: ...
        async def _ensure_started(
            self, step: Step, rec: StepRecord, host: str, reattach: bool
        ) -> None: ...
        def _unreachable(self, step: Step, rec: StepRecord, host: str, exc: Exception) -> str: ...
        async def _stats_loop(self, host: str) -> None: ...
        async def _attempt(self, step: Step, rec: StepRecord) -> str: ...
        async def revive_services(self, step: Step, rec: StepRecord) -> str | None: ...

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
        self._intent_taken_up = False  # the saved run-all intent, resumed once per driver
        self._verified: set[str] = set()  # artifacts guards vouched for in this run
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
        spool_id = (await self.session(self.default_host)).hello.get("spool_id")
        opened = audit_seal.check_run(self.store, box_head, self.accept_audit_break, spool_id)
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
            # named only once a head for the run is on that spool: a box keeping none on this
            # same spool later had it deleted (audit_seal.missing_head_problem)
            "spool_id": spool_id if await box_claim.push_head(self) else None,
            "tool_version": TOOL_VERSION,
        }
        if resumed:
            changed = [
                k
                for k in ("runbook_sha256", "vars")
                if getattr(state, k)
                != (self.loaded.sha256 if k == "runbook_sha256" else self.loaded.vars)
            ]
            var_changes = {
                k: [state.vars.get(k), self.loaded.vars.get(k)]
                for k in sorted(set(state.vars) | set(self.loaded.vars))
                if state.vars.get(k) != self.loaded.vars.get(k)
            }
            if changed:
                what = [f"{k}: {_shown(a)} -> {_shown(b)}" for k, (a, b) in var_changes.items()]
                if "runbook_sha256" in changed:
                    what.insert(
                        0,
                        f"runbook file: sha256 {state.runbook_sha256[:12]}… -> "
                        f"{self.loaded.sha256[:12]}…",
                    )
                self.emit(
                    Notice(
                        "warning",
                        f"resuming run {run_id} with changes: {'; '.join(what)}; "
                        "succeeded steps are not re-run",
                    )
                )
            state.runbook_sha256, state.vars, state.finished = (
                self.loaded.sha256,
                self.loaded.vars,
                False,
            )
            self.audit.append("run.resumed", changed=changed, var_changes=var_changes, **info)
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

            def on_status(
                state: str,
                attempt: int,
                message: str | None,
                refused: HostKeyRefusal | None,
                host: str = host,
            ) -> None:
                ep = self.sessions[host].endpoint if host in self.sessions else None
                key = ep.host_key if ep else None
                self.emit(ConnectionChanged(host, state, attempt, message, key, refused))

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
        if self.audit is not None and self.state is not None:
            try:  # the record tells a driver that let go from one that was killed
                self.audit.append("run.closed")
            except StateWriteError:
                pass  # a full disk: the close goes on (the head and the lock are let go)
        await box_claim.push_head(self, clean=True)
        for session in self.sessions.values():
            await session.close()
        if self.store:
            try:
                if self.state is not None:  # None: open() refused before any state existed
                    self._save()
            finally:
                self.store.unlock()


def _shown(value: str | None) -> str:
    return "(unset)" if value is None else repr(value)
