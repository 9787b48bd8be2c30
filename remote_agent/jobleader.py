"""The job's process-group leader: runs the command and writes its exit status itself.

The jobwrap (supervisor) used to be the only process that could record how a job ended, so a
`kill -9` of the supervisor left a finished job with "no exit record". The leader is the
job's direct parent inside the job's own process group: it survives the supervisor, waits for
the command, and writes `leader_exit.json` atomically the moment the command ends. It then
exits with the very same status (re-raising a fatal signal), so the supervisor, when alive,
sees the job's own status.

TERM/INT/HUP get a Python handler (not SIG_IGN, which would survive exec): the command starts
with default dispositions and dies of the group signal, while the leader lives to record it.
Only the supervisor's final SIGKILL of the group takes the leader down with the command, and
then the (live) supervisor writes the record.

Started by the jobwrap as `python -I -c <bootstrap> READY_FD EXIT_PATH ARGV...`; it reports
on READY_FD one line: "ok" once the command runs, or the reason it could not start.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from remote_agent.atomic_write import write_atomic

CANNOT_START = 127  # exit code when the command does not exist (126: exists, cannot run)


def bootstrap_argv(ready_fd: int, exit_path: Path, argv: list[str]) -> list[str]:
    """argv for the leader: isolated interpreter (the job's PYTHON* env must not steer it)."""
    here = os.path.abspath(__file__)
    parent = os.path.dirname(os.path.dirname(here))
    code = (
        f"import sys; sys.path.insert(0, {parent!r}); "
        "from remote_agent.jobleader import main; sys.exit(main(sys.argv[1:]))"
    )
    return [sys.executable or "python3", "-I", "-c", code, str(ready_fd), str(exit_path), *argv]


def _noop(signum: int, frame: object) -> None:
    pass


def _write_record(path: Path, record: dict[str, object]) -> None:
    # The spool's atomic record form; atomic_write is stdlib-only, so the leader stays lean.
    write_atomic(path, json.dumps(record, sort_keys=True) + "\n", mode=0o600)


def main(args: list[str]) -> int:
    ready_fd, exit_path, argv = int(args[0]), Path(args[1]), args[2:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _noop)
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, close_fds=True)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        missing = isinstance(e, FileNotFoundError) or getattr(e, "errno", None) == errno.ENOENT
        os.write(ready_fd, f"error {127 if missing else 126} {e}\n".encode())
        os.close(ready_fd)
        return CANNOT_START if missing else 126
    os.write(ready_fd, b"ok\n")
    os.close(ready_fd)
    while True:
        try:
            _, status = os.waitpid(child.pid, 0)
            break
        except ChildProcessError:
            status = 255 << 8
            break
    code = os.waitstatus_to_exitcode(status)
    record = {
        "exit_code": code if code >= 0 else None,
        "signal": -code if code < 0 else None,
        "ended_at": time.time(),
    }
    try:
        _write_record(exit_path, record)
    except OSError:
        pass  # (full disk) the supervisor, if alive, still records the status we exit with
    if code < 0:  # die of the same signal, so the supervisor sees the job's own status
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code
