"""Test hygiene: detached jobs outlive the engine by design, so a test kills what it left."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.support.procs import procs_where


def kill_leftover_jobs(spool: Path) -> None:
    """SIGKILL every job of `spool` still running: its process group (the job tree) and the
    session of its jobwrap (the supervisor, which would otherwise record the kill)."""
    jobs = Path(spool) / "jobs"
    if not jobs.is_dir():
        return
    for d in jobs.iterdir():
        try:
            os.killpg(int((d / "pgid").read_text().split()[0]), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass  # no pgid yet, already gone, or not ours
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
