"""Observed values as a person reads them: sizes in human units, timestamps as local time."""

from __future__ import annotations

import datetime as _dt
from typing import Any

from runbook.units import format_size

# keys that hold byte counts (remote_agent/agent/probes.py's conventions) or epoch seconds
SIZE_KEYS = {"size", "bytes", "disk_bytes", "total", "free", "used", "min_bytes", "max_bytes"}
TIME_KEYS = {"ts", "mtime", "started_at", "ended_at", "created_at", "updated_at"}


def is_size_key(key: str) -> bool:
    return key in SIZE_KEYS or key.endswith("_bytes")


def local_time(ts: float) -> str:
    """`2026-12-02 01:23:45` in the viewer's local time zone."""
    return _dt.datetime.fromtimestamp(ts).isoformat(sep=" ", timespec="seconds")


def value_text(key: str, value: Any) -> str:
    if value is None:
        return "—"
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and is_size_key(key):
        return format_size(value)
    if number and (key in TIME_KEYS or key.endswith("_at")) and value > 1e8:
        return local_time(float(value))
    if isinstance(value, bool):
        return "yes" if value else "no"
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
            if isinstance(v, (dict, list)) and not v:
                continue  # an empty list or object tells nothing (was `fields=[0 items]`)
            shown = _container_text(k, v) if isinstance(v, (dict, list)) else value_text(k, v)
            parts.append(f"{k}={shown}")
        return " ".join(parts)
    return str(observed)


def _container_text(key: str, v: dict | list) -> str:
    """`{format=eagle3-merged, records=12}` when short and flat, else `[N items]`."""
    items = f"[{len(v)} item{'' if len(v) == 1 else 's'}]"
    pairs = v.items() if isinstance(v, dict) else enumerate(v)
    if any(isinstance(x, (dict, list)) for _, x in pairs):
        return items
    if isinstance(v, dict):
        text = "{" + ", ".join(f"{k}={value_text(k, x)}" for k, x in v.items()) + "}"
    else:
        text = "[" + ", ".join(value_text(key, x) for x in v) + "]"
    return text if len(text) <= 80 else items
