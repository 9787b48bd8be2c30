"""Byte counts as a person reads them, one way on both sides of the wire: the agent's guard
messages, the payload's terminal output and the cockpit (runbook/units.py) say `924.0 GiB` alike."""

from __future__ import annotations


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"
