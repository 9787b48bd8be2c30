"""Helpers shared by the agent tests: process facts from /proc and job scripts."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

PY = sys.executable


def proc_field(pid: int, index: int) -> str | None:
    """Field `index` (0-based, after the comm) of /proc/<pid>/stat: 0 state, 2 pgrp, 3 sid."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].split()[index].decode()


def alive(pid: int) -> bool:
    state = proc_field(pid, 0)
    return state is not None and state not in ("Z", "X")


def procs_where(pred: Callable[[int, int, int], bool]) -> list[int]:
    """Live pids whose (pid, pgrp, sid) satisfy pred."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            raw = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            continue
        f = raw[raw.rfind(b")") + 2 :].split()
        if f[0] in (b"Z", b"X"):
            continue
        if pred(pid, int(f[2]), int(f[3])):
            out.append(pid)
    return out


def wait_for(pred: Callable[[], bool], timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout}s: {what}")
        time.sleep(0.02)


def kill_leftover_jobs(spool: Path) -> None:
    """Test hygiene: KILL the sessions of jobwraps a test left running (job trees included)."""
    jobs = spool / "jobs"
    if not jobs.is_dir():
        return
    for d in jobs.iterdir():
        try:
            pid = int((d / "pid").read_text().split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if str(d).encode() not in cmdline:
            continue  # not our jobwrap (gone, pid reused)
        for p in procs_where(lambda p, g, s, pid=pid: s == pid):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def spool_files(spool: Path) -> list[Path]:
    return [p for p in spool.rglob("*")]
