"""Text for the view: durations and commands. No widgets here (guards: eagle_tui/present)."""

from __future__ import annotations

import shlex
from typing import Any

from runbook.events import RUNNING
from runbook.state import StepRecord
from runbook.units import format_duration


def step_duration(rec: StepRecord, now: float) -> float | None:
    if rec.started_at is None:
        return None
    if rec.status == RUNNING or rec.ended_at is None:
        return max(0.0, now - rec.started_at) if rec.status == RUNNING else None
    return max(0.0, rec.ended_at - rec.started_at)


def duration_text(rec: StepRecord, now: float) -> str:
    d = step_duration(rec, now)
    return format_duration(d) if d is not None else ""


def command_text(command: Any) -> str:
    if command is None:
        return "(no command: a gate of guards only)"
    if isinstance(command, list):
        return shlex.join(str(c) for c in command)
    return str(command)
