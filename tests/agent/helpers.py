"""Helpers shared by the agent tests: process facts from /proc and job scripts."""

from __future__ import annotations

import sys
from pathlib import Path

PY = sys.executable


def spool_files(spool: Path) -> list[Path]:
    return [p for p in spool.rglob("*")]
