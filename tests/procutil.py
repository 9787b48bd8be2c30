"""Run a command tree for a test and never leave any of it behind (torchrun spawns workers that
outlive a killed launcher)."""

from __future__ import annotations

import os
import signal
import subprocess
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
