"""Step statuses and progress records as text: the icons and styles every view uses."""

from __future__ import annotations

from typing import Any

from runbook.escape import terminal
from runbook.events import (
    BLOCKED,
    CANCELLED,
    FAILED,
    LOST,
    PENDING,
    RUNNING,
    SKIPPED,
    SUCCEEDED,
)
from runbook.units import format_duration

ICONS = {
    PENDING: "·",
    BLOCKED: "⏸",
    RUNNING: "▶",
    SUCCEEDED: "✓",
    FAILED: "✗",
    LOST: "?",
    CANCELLED: "⊘",
    SKIPPED: "↷",
}
STYLES = {
    PENDING: "dim",
    BLOCKED: "yellow",
    RUNNING: "cyan",
    SUCCEEDED: "green",
    FAILED: "red",
    LOST: "magenta",
    CANCELLED: "red",
    SKIPPED: "blue",
}


def progress_text(rec: dict[str, Any]) -> str:
    """`merge 12,000/37,312 records · 5,210/s · ETA 4s` from an eagle3 progress record
    (escaped for a terminal: every view shows it as is)."""
    if rec.get("kind") == "result":
        return "done"
    done, total, unit = rec.get("done"), rec.get("total"), rec.get("unit", "")
    parts = [str(rec.get("stage", ""))]
    if total:
        pct = 100.0 * float(done or 0) / float(total)
        parts.append(f"{done:,}/{total:,} {unit} ({pct:.0f}%)")
    elif done is not None:
        parts.append(f"{done:,} {unit}")
    if rec.get("rate"):
        parts.append(f"{float(rec['rate']):,.1f}/s")
    if rec.get("eta_s") is not None:
        parts.append(f"ETA {format_duration(float(rec['eta_s']))}")
    return terminal(" · ".join(p for p in parts if p))  # the stage is the job's text
