"""Events the engine emits. The headless CLI and the Textual app are both views of this stream."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runbook.transports import HostKeyRefusal

# Step statuses (DESIGN.md state machine); termination reasons are kept separately.
PENDING, BLOCKED, RUNNING = "pending", "blocked", "running"
SUCCEEDED, FAILED, LOST, CANCELLED, SKIPPED = "succeeded", "failed", "lost", "cancelled", "skipped"
STATUSES = (PENDING, BLOCKED, RUNNING, SUCCEEDED, FAILED, LOST, CANCELLED, SKIPPED)
DONE = (SUCCEEDED, SKIPPED)
TERMINAL_BAD = (FAILED, LOST, CANCELLED)


@dataclass(frozen=True)
class Event:
    pass


@dataclass(frozen=True)
class RunStarted(Event):
    run_id: str
    runbook: str
    resumed: bool
    state_dir: str


@dataclass(frozen=True)
class StepChanged(Event):
    step_id: str
    status: str
    reason: str | None = None
    message: str | None = None
    attempt: int = 0
    exit_code: int | None = None


@dataclass(frozen=True)
class GuardsEvaluated(Event):
    step_id: str
    phase: str  # "skip_if" | "pre" | "post"
    results: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class DryRunStep(Event):
    """--dry-run: what a step would run, where, and whether it is already done or satisfied."""

    step_id: str
    host: str
    command: Any
    destructive: bool
    state: str  # "done" | "satisfied" (skip_if holds) | "would run" | "pending" | "blocked"
    why: str = ""  # pending: on which earlier step; blocked: the guards that failed


@dataclass(frozen=True)
class LogChunk(Event):
    step_id: str
    text: str


@dataclass(frozen=True)
class ProgressUpdate(Event):
    step_id: str
    record: dict[str, Any]


@dataclass(frozen=True)
class MetricsUpdate(Event):
    step_id: str
    record: dict[str, Any]


@dataclass(frozen=True)
class HostStats(Event):
    host: str
    sample: dict[str, Any]


@dataclass(frozen=True)
class ConnectionChanged(Event):
    host: str
    state: str  # "connecting" | "connected" | "reconnecting" | "failed"
    attempt: int = 0
    message: str | None = None
    host_key: str | None = None  # the verified key's fingerprint, once connected
    refused_key: HostKeyRefusal | None = None  # why it failed, when a host key was refused


@dataclass(frozen=True)
class Notice(Event):
    level: str  # "info" | "warning" | "error"
    message: str


@dataclass(frozen=True)
class RunFinished(Event):
    exit_code: int
    summary: dict[str, int] = field(default_factory=dict)
    audit_head: str = ""
    audit_seq: int = -1
