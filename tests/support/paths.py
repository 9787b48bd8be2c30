"""Where the repository is, for tests that start its code as a subprocess or read its files."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
