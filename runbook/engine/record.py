"""The run record: the run's state file and audit log, and every change written to them.

A step's status change is one audit record, one state write and one `StepChanged` event, in
that order (`set`). The state is written before anything happens on the box, so a driver killed
at any point finds, on the next open, what it had started (runbook/engine/__init__.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from runbook.audit import AuditLog
from runbook.audit_seal import Opened
from runbook.engine.constants import EXIT_OK, TOOL_VERSION
from runbook.events import Event, Notice, RunFinished, RunStarted, StepChanged
from runbook.loader import LoadedRunbook
from runbook.schema import Runbook, Step
from runbook.state import (
    RunAllIntent,
    RunState,
    RunStore,
    StateWriteError,
    StepRecord,
    list_runs,
)

Emit = Callable[[Event], None]


class RunRecord:
    """The run's runbook, state, audit and store; `where` says where a step runs (hosts)."""

    def __init__(
        self,
        loaded: LoadedRunbook,
        state_dir: Path,
        secrets: Mapping[str, str],
        emit: Emit,
        where: Callable[[Step], dict[str, Any]],
    ) -> None:
        self.loaded = loaded
        self.state_dir = Path(state_dir)
        self.secrets = dict(secrets)
        self.emit = emit
        self.where = where
        self.store: RunStore | None = None
        self.state: RunState | None = None
        self.audit: AuditLog | None = None
        self._last_save = 0.0
        self._intent_taken_up = False  # the saved run-all intent, resumed once per driver

    @property
    def rb(self) -> Runbook:
        return self.loaded.runbook

    # ------------------------------------------------------------------ writing
    def save(self, force: bool = True) -> None:
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

    def set(
        self,
        step_id: str,
        status: str,
        reason: str | None = None,
        message: str | None = None,
        audit: dict[str, Any] | None = None,
    ) -> None:
        """A step's new status: audited (with where it runs and `audit`'s fields), saved, emitted."""
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
            "where": self.where(step),
        }
        fields.update(audit or {})
        self.audit.append("step.state", **fields)
        self.save()
        self.emit(StepChanged(step_id, status, reason, message, rec.attempt, rec.exit_code))

    # ------------------------------------------------------------------ opening
    def open_readonly(self) -> str:
        """For --dry-run: the latest run's state (or a fresh one) in memory; nothing is written."""
        prior = next(reversed(list_runs(self.state_dir, self.rb.name)), None)
        self.state = prior.model_copy(deep=True) if prior else self._fresh("(dry-run)")
        for s in self.rb.steps:
            self.state.steps.setdefault(s.id, StepRecord())
        return self.state.run_id

    def lock(self, run_id: str, loaded: LoadedRunbook) -> RunStore:
        """Take the run's directory (one engine per run) for the runbook loaded for `run_id`."""
        self.loaded = loaded
        self.store = RunStore(self.state_dir, run_id)
        self.store.lock()
        return self.store

    def begin(self, opened: Opened) -> bool:
        """The checked state (or a new one) and the audit, with the check's notes; resumed?"""
        assert self.store
        state = opened.state
        resumed = state is not None
        if state is None:
            state = self._fresh(self.store.run_id)
        for s in self.rb.steps:
            state.steps.setdefault(s.id, StepRecord())
        self.state = state
        self.audit = AuditLog(self.store.audit_path, self.store.run_id, self.secrets.values())
        for event, fields in opened.notes:
            self.audit.append(event, **fields)
        return resumed

    def started(self, resumed: bool, default_host: str, spool_id: str | None) -> None:
        """Audit the start (or the resumption, with what changed since) and save."""
        assert self.store and self.state and self.audit
        state, loaded, run_id = self.state, self.loaded, self.store.run_id
        info = {
            "runbook": {"name": self.rb.name, "path": str(loaded.path), "sha256": loaded.sha256},
            "vars": loaded.vars,
            "default_host": default_host,
            "spool_id": spool_id,
            "tool_version": TOOL_VERSION,
        }
        if resumed:
            changed = [
                k
                for k in ("runbook_sha256", "vars")
                if getattr(state, k) != (loaded.sha256 if k == "runbook_sha256" else loaded.vars)
            ]
            var_changes = {
                k: [state.vars.get(k), loaded.vars.get(k)]
                for k in sorted(set(state.vars) | set(loaded.vars))
                if state.vars.get(k) != loaded.vars.get(k)
            }
            if changed:
                what = [f"{k}: {_shown(a)} -> {_shown(b)}" for k, (a, b) in var_changes.items()]
                if "runbook_sha256" in changed:
                    what.insert(
                        0,
                        f"runbook file: sha256 {state.runbook_sha256[:12]}… -> "
                        f"{loaded.sha256[:12]}…",
                    )
                self.emit(
                    Notice(
                        "warning",
                        f"resuming run {run_id} with changes: {'; '.join(what)}; "
                        "succeeded steps are not re-run",
                    )
                )
            state.runbook_sha256, state.vars, state.finished = loaded.sha256, loaded.vars, False
            self.audit.append("run.resumed", changed=changed, var_changes=var_changes, **info)
        else:
            self.audit.append("run.started", **info)
        self.save()

    def announce(self, resumed: bool) -> None:
        """RunStarted, then every step's status as recorded."""
        assert self.store and self.state
        self.emit(RunStarted(self.store.run_id, self.rb.name, resumed, str(self.state_dir)))
        for sid, rec in self.state.steps.items():
            if sid in self.rb.step_ids:
                self.emit(
                    StepChanged(
                        sid, rec.status, rec.reason, rec.message, rec.attempt, rec.exit_code
                    )
                )

    def _fresh(self, run_id: str) -> RunState:
        now = time.time()
        return RunState(
            run_id=run_id,
            runbook_name=self.rb.name,
            runbook_path=str(self.loaded.path.resolve()),
            runbook_sha256=self.loaded.sha256,
            vars=self.loaded.vars,
            created_at=now,
            updated_at=now,
            steps={},
        )

    # ------------------------------------------------------------------ the run-all intent
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
        self.save()

    def clear_intent(self, why: str) -> bool:
        """Forget the run-all intent (audited); False when there was none."""
        assert self.state and self.audit
        if self.state.intent is None:
            return False
        old, self.state.intent = self.state.intent, None
        self.audit.append("run.intent_cleared", start=old.start, only=old.only, why=why)
        self.save()
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
        self.save()
        self.emit(RunFinished(code, summary, self.audit.head.hash, self.audit.head.seq))
        return code

    # ------------------------------------------------------------------ closing
    def note_closed(self) -> None:
        """The record tells a driver that let go from one that was killed."""
        if self.audit is not None and self.state is not None:
            try:
                self.audit.append("run.closed")
            except StateWriteError:
                pass  # a full disk: the close goes on (the head and the lock are let go)

    def release(self) -> None:
        """The last save, then the run's lock is let go."""
        if self.store:
            try:
                if self.state is not None:  # None: open() refused before any state existed
                    self.save()
            finally:
                self.store.unlock()


def _shown(value: str | None) -> str:
    return "(unset)" if value is None else repr(value)
