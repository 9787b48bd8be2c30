"""Processes in tests: facts from /proc, and command trees that never leave anything behind
(torchrun spawns workers that outlive a killed launcher)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_tree(cmd: list[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess:
    """subprocess.run in its own session; on timeout or any error the whole group is killed."""
    proc = subprocess.Popen(
        cmd,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise
    finally:
        try:  # workers that outlived their launcher (normally none)
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


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
