"""Run state on the operator's machine: one directory per run under the state dir.

    <state_dir>/runs/<run_id>/state.json   step records (atomic rewrite on every change)
    <state_dir>/runs/<run_id>/audit.jsonl  hash-chained audit log
    <state_dir>/runs/<run_id>/logs/        byte-faithful mirrors of the jobs' logs (secrets redacted)
    <state_dir>/runs/<run_id>/lock         held by the one engine driving the run

Secrets are never written here.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets as _secrets
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from remote_agent.wire.atomic_write import write_atomic
from runbook.events import DONE, PENDING


def default_state_dir() -> Path:
    env = os.environ.get("EAGLE_TUI_STATE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_STATE_HOME")
    return Path(xdg) / "eagle-tui" if xdg else Path.home() / ".local" / "state" / "eagle-tui"


class StepRecord(BaseModel):
    status: str = PENDING
    reason: str | None = None
    message: str | None = None
    attempt: int = 0
    job_id: str | None = None
    host: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    guards: list[dict[str, Any]] = Field(default_factory=list)
    # log cursor: remote byte offset already mirrored, and the mirror's size at that point
    log_remote_offset: int = 0
    log_mirror_size: int = 0
    log_file: str | None = None
    # the agent spool's id when the job was launched: another id later means the spool was wiped
    spool_id: str | None = None
    progress: dict[str, Any] | None = None
    command: Any = None
    restarts: int = 0  # a service: times a step that uses it restarted it after it died


class RunAllIntent(BaseModel):
    """The operator's standing order "run every step from `start`": it outlives the process
    that was carrying it out (a quit, a kill -9), so the next driver of the run continues it."""

    start: str | None = None
    only: str | None = None
    since: float
    by: str  # "cockpit" | "auto": who gave it


class RunState(BaseModel):
    run_id: str
    runbook_name: str
    runbook_path: str
    runbook_sha256: str
    vars: dict[str, str]
    created_at: float
    updated_at: float
    steps: dict[str, StepRecord]
    audit_seq: int = -1
    audit_head: str = "0" * 64
    finished: bool = False
    exit_code: int | None = None
    intent: RunAllIntent | None = None

    def all_done(self) -> bool:
        return all(r.status in DONE for r in self.steps.values())


def new_run_id(name: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{name}-{_secrets.token_hex(2)}"


class RunLocked(Exception):
    pass


class StateWriteError(Exception):
    """The state dir cannot be written (ENOSPC, EROFS, ...); str() is the one line to show."""


def write_failed(path: Path, exc: OSError) -> StateWriteError:
    return StateWriteError(f"{path}: cannot write: {exc.strerror or exc}; nothing was half-written")


class RunStore:
    def __init__(self, state_dir: Path, run_id: str) -> None:
        self.state_dir = Path(state_dir)
        self.run_id = run_id
        self.dir = self.state_dir / "runs" / run_id
        self.state_path = self.dir / "state.json"
        self.audit_path = self.dir / "audit.jsonl"
        self.logs_dir = self.dir / "logs"
        self._lock_fd: int | None = None

    def create_dirs(self) -> None:
        try:
            self.logs_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise write_failed(self.logs_dir, exc) from None
        os.chmod(self.state_dir, 0o700) if self.state_dir.stat().st_uid == os.getuid() else None

    def lock(self) -> None:
        """One engine per run: a second `eagle-tui run` of the same run is refused, not interleaved."""
        self.create_dirs()
        try:
            fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise write_failed(self.dir / "lock", exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            except OSError:
                pid = "?"
            os.close(fd)
            raise RunLocked(
                f"run {self.run_id} is being driven by another eagle-tui process (pid {pid} on "
                f"this machine); watch it with `eagle-tui status`, or wait for it to end"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        except OSError as exc:
            os.close(fd)
            raise write_failed(self.dir / "lock", exc) from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def load(self) -> RunState | None:
        if not self.state_path.exists():
            return None
        return RunState.model_validate_json(self.state_path.read_text())

    def save(self, state: RunState) -> None:
        state.updated_at = time.time()
        try:
            write_atomic(self.state_path, state.model_dump_json(indent=1))
        except OSError as exc:  # the old state.json stays whole
            raise write_failed(self.state_path, exc) from None

    def log_path(self, step_id: str, attempt: int) -> Path:
        return self.logs_dir / f"{step_id}.{attempt}.log"


def list_runs(state_dir: Path, runbook_name: str | None = None) -> list[RunState]:
    """Runs in the state dir, oldest first (by creation time)."""
    runs = []
    root = Path(state_dir) / "runs"
    if not root.exists():
        return []
    for d in root.iterdir():
        p = d / "state.json"
        if not p.exists():
            continue
        try:
            st = RunState.model_validate_json(p.read_text())
        except (ValueError, OSError):
            continue
        if runbook_name is None or st.runbook_name == runbook_name:
            runs.append(st)
    return sorted(runs, key=lambda s: (s.created_at, s.run_id))


def latest_run(state_dir: Path, runbook_name: str | None = None) -> RunState | None:
    runs = list_runs(state_dir, runbook_name)
    return runs[-1] if runs else None


def unreadable_runs(state_dir: Path, runbook_name: str) -> list[str]:
    """Run dirs of this runbook (by their id) with an audit but no readable state: such a run
    must not vanish (the next start would re-run its steps); opening it explains the refusal."""
    root = Path(state_dir) / "runs"
    out = []
    for d in sorted(root.iterdir()) if root.exists() else []:
        if not re.fullmatch(rf"\d{{8}}T\d{{6}}Z-{re.escape(runbook_name)}-[0-9a-f]{{4}}", d.name):
            continue  # run ids are <stamp>-<name>-<hex> (new_run_id)
        if not (d / "audit.jsonl").exists():
            continue
        try:
            RunState.model_validate_json((d / "state.json").read_text())
        except (ValueError, OSError):
            out.append(d.name)
    return out
