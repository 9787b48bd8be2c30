"""Fixtures for the remote agent tests: a spool per test and an agent subprocess over pipes."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.jobs import kill_leftover_jobs

from .agent_proc import AgentProc


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    return tmp_path / "spool"


@pytest.fixture
def agent(spool: Path) -> Iterator[AgentProc]:
    a = AgentProc(spool, keep_raw=True)
    a.hello()
    try:
        yield a
        assert not a.garbage, f"non-JSON lines on the agent's stdout: {a.garbage[:3]}"
    finally:
        a.close()
        kill_leftover_jobs(spool)


@pytest.fixture
def start_agent(spool: Path) -> Iterator:
    """Factory for extra agents on the same spool (restarts); all are cleaned up."""
    started: list[AgentProc] = []

    def make(**kw: object) -> AgentProc:
        a = AgentProc(spool, **kw)  # type: ignore[arg-type]
        started.append(a)
        return a

    yield make
    for a in started:
        if a.proc.poll() is None:
            a.proc.send_signal(signal.SIGKILL)
        a.close()
    kill_leftover_jobs(spool)
