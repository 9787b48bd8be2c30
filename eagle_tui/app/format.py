"""Text for the view: durations, guard summaries and observed values. No widgets here."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import Any

from rich.text import Text
from textual.content import Content

from eagle_tui.app.literal import markup
from runbook.events import RUNNING
from runbook.state import StepRecord
from runbook.units import format_duration, format_size

# Observed-value keys that hold byte counts (the probes' conventions: remote_agent/probes.py).
SIZE_KEYS = {"size", "bytes", "disk_bytes", "total", "free", "used", "min_bytes", "max_bytes"}


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


def value_text(key: str, value: Any) -> str:
    if key in SIZE_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format_size(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str) and len(value) > 80:
        return value[:77] + "…"
    return str(value)


def observed_text(observed: Any) -> str:
    """`exists=yes type=file size=1.2 GiB` from a probe's observed value."""
    if observed is None:
        return "—"
    if isinstance(observed, dict):
        parts = []
        for k, v in observed.items():
            if isinstance(v, (dict, list)):
                v = f"[{len(v)} items]"
            elif isinstance(v, bool):
                v = "yes" if v else "no"
            parts.append(f"{k}={value_text(k, v)}")
        return " ".join(parts)
    return str(observed)


def guard_summary(guards: Iterable[dict[str, Any]]) -> Text:
    """`✓3` when every guard passed, `✗1/3` when one of three failed; empty when none ran."""
    guards = list(guards)
    if not guards:
        return Text("")
    bad = sum(1 for g in guards if not g.get("ok"))
    if bad:
        return Text(f"✗{bad}/{len(guards)}", style="red")
    return Text(f"✓{len(guards)}", style="green")


def guard_lines(guards: Iterable[dict[str, Any]], phase: str | None = None) -> list[Content]:
    """Lines, one pair per guard: mark, check, message, then its observed values (all literal)."""
    out = []
    for g in guards:
        mark = "[green]✓[/]" if g.get("ok") else "[red]✗[/]"
        prefix = "[dim]$phase[/] " if phase else ""
        out.append(
            markup(
                f"  {mark} {prefix}[b]$label[/]: $message",
                phase=phase or "",
                label=g.get("title") or g.get("check"),
                message=g.get("message") or "",
            )
        )
        out.append(markup("      [dim]observed: $v[/]", v=observed_text(g.get("observed"))))
    return out
