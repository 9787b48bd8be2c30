"""The GPU to oneself while timing, with other benchmark workers sharing it the rest of the time.

Workers of one benchmark run side by side (a SpecForge worker compiling while ours measures)
and each is its own process group (`start_new_session`), listed in `<work>/pgids`. A worker
about to time steps takes `<work>/gate.lock` and stops every other listed group (SIGSTOP:
their GPU launches and their compile subprocesses pause, their memory stays), times, and lets
them go on (SIGCONT). The lock makes one timer at a time; the orchestrator holds it while it
lists a new worker, and continues every group whenever a worker ends or is killed, so no group
stays stopped behind a dead timer.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path


def _pgids(work: Path) -> list[int]:
    try:
        text = (work / "pgids").read_text()
    except FileNotFoundError:
        return []
    return [int(x) for x in text.split()]


def signal_groups(pgids: list[int], sig: int) -> None:
    for g in pgids:
        try:
            os.killpg(g, sig)
        except (ProcessLookupError, PermissionError):
            pass


@contextlib.contextmanager
def locked(work: Path, timeout: float | None = None) -> Iterator[bool]:
    """Holds the lock inside (yields True), or yields False after `timeout` seconds without it."""
    with open(work / "gate.lock", "a") as fd:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if end is not None else 0))
                break
            except BlockingIOError:
                if end is not None and time.monotonic() > end:
                    yield False
                    return
                time.sleep(0.05)
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def exclusive(work: Path | None, record: dict | None = None) -> Iterator[None]:
    """Everything else of this benchmark paused while inside; `record` gets the seconds waited
    for the lock and the groups paused."""
    if work is None:
        yield
        return
    t0 = time.perf_counter()
    with locked(work):
        mine = os.getpgid(0)
        others = [g for g in _pgids(work) if g != mine]
        signal_groups(others, signal.SIGSTOP)
        if record is not None:
            record["gate_wait_s"] = round(
                record.get("gate_wait_s", 0) + time.perf_counter() - t0, 2
            )
            record["paused_groups"] = len(others)
        try:
            yield
        finally:
            signal_groups(others, signal.SIGCONT)


def register(work: Path, pgids: list[int]) -> None:
    """The orchestrator's list of live worker groups (under the lock: never mid-timing, unless
    a timer holds it for over 30 s; then listed at once)."""
    with locked(work, timeout=30):
        tmp = work / "pgids.tmp"
        tmp.write_text(" ".join(map(str, pgids)))
        os.replace(tmp, work / "pgids")
