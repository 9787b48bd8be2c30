"""Agents and transports left behind when an event loop ends.

An asyncio subprocess (the local agent) that was not reaped on its loop is finalized later, on
a closed loop: its transport's __del__ fails with "Event loop is closed", which pytest reports
as PytestUnraisableExceptionWarning (and a finalizer at interpreter teardown can crash the run).
`run_and_collect` runs a coroutine on a fresh loop as the suite does, closes it, collects the
garbage and returns what went wrong; `recording_agents` remembers every local agent started.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import warnings
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from runbook.transports.local import LocalTransport


def run_and_collect(main: Callable[[], Coroutine[Any, Any, Any]]) -> list[str]:
    """asyncio.run(main()), then gc: every unraisable exception (a finalizer that failed) and
    every "unclosed transport" warning, one line each; [] when nothing was left."""
    seen: list[str] = []

    def hook(u: Any) -> None:
        seen.append(f"{u.exc_type.__name__}: {u.exc_value} (in {u.object!r})")

    old = sys.unraisablehook
    sys.unraisablehook = hook
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            asyncio.run(main())
            for _ in range(3):
                gc.collect()
    finally:
        sys.unraisablehook = old
    seen += [
        str(w.message)
        for w in caught
        if issubclass(w.category, ResourceWarning) and "transport" in str(w.message)
    ]
    return seen


def recording_agents(monkeypatch: pytest.MonkeyPatch) -> list[asyncio.subprocess.Process]:
    """Every local agent process started from now on (LocalTransport.open), in order."""
    started: list[asyncio.subprocess.Process] = []
    opened = LocalTransport.open

    async def recording(self: LocalTransport) -> Any:
        channel = await opened(self)
        started.append(channel.proc)
        return channel

    monkeypatch.setattr(LocalTransport, "open", recording)
    return started


def running(procs: list[asyncio.subprocess.Process]) -> list[int]:
    """The pids of those whose exit their loop never saw."""
    return [p.pid for p in procs if p.returncode is None]
