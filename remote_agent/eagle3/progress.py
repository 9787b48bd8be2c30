"""The payload's rate-limited progress reporter; the line contract (PREFIX, emit, parse) is the
agent core's (remote_agent/progress.py), shared with the engine that parses it."""

from __future__ import annotations

import time
from typing import Any, TextIO

from remote_agent.progress import PREFIX, emit, parse

__all__ = ["PREFIX", "Progress", "emit", "parse"]


class Progress:
    """Rate-limited progress reporter: at most one line per `interval` seconds, plus the last."""

    def __init__(
        self,
        stage: str,
        total: int | None,
        unit: str,
        interval: float = 1.0,
        stream: TextIO | None = None,
    ) -> None:
        self.stage, self.total, self.unit = stage, total, unit
        self.done = 0
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
        rate = self.done / elapsed
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
