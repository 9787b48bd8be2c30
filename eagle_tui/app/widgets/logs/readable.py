"""`@@eagle3 {...}` machine lines as an operator reads them in the log pane (the full-log viewer
and the mirror keep the raw line): progress as `step/total · rate · ETA`, metrics with 4
significant figures instead of 16-digit floats. The live pane leaves progress records to the
progress bar above it (`is_progress`): one line per update buried the job's own output."""

from __future__ import annotations

from typing import Any

from eagle_tui.present.status import progress_text
from remote_agent.wire.progress import PREFIX, parse


def figure(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, list) and all(isinstance(x, (int, float)) for x in v):
        return "/".join(figure(x) for x in v[:8]) + ("/…" if len(v) > 8 else "")
    return str(v)


def is_progress(line: str) -> bool:
    if not line.startswith(PREFIX):
        return False
    rec = parse(line)
    return rec is not None and rec.get("kind") == "progress"


def readable(line: str) -> str:
    if not line.startswith(PREFIX):
        return line
    rec = parse(line)
    if rec is None:
        return line
    kind = rec.get("kind")
    if kind == "progress":
        return "▸ " + progress_text(rec)
    fields = " · ".join(f"{k} {figure(v)}" for k, v in rec.items() if k != "kind")
    return f"▸ {kind}" + (f" · {fields}" if fields else "")
