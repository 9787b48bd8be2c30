"""The payload's progress and metric records: `emit` and the rate-limited `Progress` reporter.

The line format (`@@eagle3 {json}`, its kinds) is the agent core's contract,
remote_agent/wire/progress.py, which the engine and the TUI parse too.
A person running a command in a terminal (the stream is a TTY) sees a progress bar, readable
metrics and a summary instead (terminal.py); `EAGLE3_PROGRESS=json` keeps the machine lines.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from remote_agent.wire.progress import PREFIX, format_record, parse

__all__ = ["PREFIX", "Progress", "emit", "for_a_person", "parse"]


def emit(kind: str, stream: TextIO | None = None, **fields: Any) -> None:
    record = {"kind": kind, **fields}
    out = stream if stream is not None else sys.stderr
    if for_a_person(out):
        from remote_agent.eagle3.terminal import show

        show(out, record)
        return
    out.write(format_record(record) + "\n")
    out.flush()


def for_a_person(stream: TextIO) -> bool:
    """A terminal, not a log file or pipe (the agent's jobs write to a log: never a TTY)."""
    if os.environ.get("EAGLE3_PROGRESS", "auto") == "json":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real file
        return False


class Progress:
    """Rate-limited progress reporter: at most one line per `interval` seconds, plus the last."""

    def __init__(
        self,
        stage: str,
        total: int | None,
        unit: str,
        interval: float = 1.0,
        stream: TextIO | None = None,
        start: int = 0,
    ) -> None:
        self.stage, self.total, self.unit = stage, total, unit
        self.done = self._base = start  # a resumed job: the rate counts this run's units only
        self.interval = interval
        self.stream = stream
        self._start = time.monotonic()
        self._last = 0.0

    def advance(self, n: int = 1, **extra: Any) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._emit(now, **extra)

    def finish(self, **extra: Any) -> None:
        self._emit(time.monotonic(), **extra)

    def _emit(self, now: float, **extra: Any) -> None:
        self._last = now
        elapsed = max(now - self._start, 1e-9)
        rate = (self.done - self._base) / elapsed
        eta = None
        if self.total is not None and rate > 0:
            eta = max(self.total - self.done, 0) / rate
        emit(
            "progress",
            stream=self.stream,
            stage=self.stage,
            done=self.done,
            total=self.total,
            unit=self.unit,
            rate=round(rate, 3),
            eta_s=None if eta is None else round(eta, 1),
            **extra,
        )
