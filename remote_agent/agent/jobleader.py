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

Secrets: when the job was given secret values (SECRETS_FD >= 0: a pipe carrying a JSON list,
read once, never on disk or argv), the command's stdout/stderr is a pipe to the leader, which
redacts it as a stream (remote_agent/wire/redact.py, across write boundaries) before the bytes reach
the spool's log (the leader's own stdout). The log is whole before the exit record is written,
so `log_size` and the client's byte offsets refer to the redacted log. Without secrets the
command writes the log itself, as before.

Before it starts the command the leader records its own pid and start time as the job's pgid
(`pgid`, atomically, next to EXIT_PATH): whoever kills the supervisor, a command that runs
always has its leader on record, and a job dir without that record whose launch lock (`alive`,
inherited from the jobwrap and held until the leader exits; the command does not get it) is free
provably never ran its command (remote_agent/agent/jobs.py).

Started by the jobwrap as `python -I -c <bootstrap> READY_FD EXIT_PATH SECRETS_FD ARGV...`; it
reports on READY_FD one line: "ok" once the command runs, or the reason it could not start.
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from remote_agent import package_parent
from remote_agent.agent.procs import start_time
from remote_agent.agent.spool import PGID, write_record
from remote_agent.wire.atomic_write import write_atomic
from remote_agent.wire.redact import StreamRedactor

CANNOT_START = 127  # exit code when the command does not exist (126: exists, cannot run)
# After the command exits, output still in flight (or from processes it left behind holding the
# pipe) is pumped until EOF or until the pipe stays quiet this long.
DRAIN_IDLE_S = 0.5
DRAIN_MAX_S = 5.0  # a leftover that never stops writing must not hold the exit record back
PUMP_CHUNK = 65536


def bootstrap_argv(
    ready_fd: int, exit_path: Path, argv: list[str], secrets_fd: int = -1
) -> list[str]:
    """argv for the leader: isolated interpreter (the job's PYTHON* env must not steer it)."""
    parent = package_parent()
    code = (
        f"import sys; sys.path.insert(0, {parent!r}); "
        "from remote_agent.agent.jobleader import main; sys.exit(main(sys.argv[1:]))"
    )
    return [
        sys.executable or "python3",
        "-I",
        "-c",
        code,
        str(ready_fd),
        str(exit_path),
        str(secrets_fd),
        *argv,
    ]


def _noop(signum: int, frame: object) -> None:
    pass


def _tell(ready_fd: int, line: str) -> None:
    """The one line for the supervisor; it may have been killed already (EPIPE): the command
    runs (or not) and is recorded all the same."""
    try:
        os.write(ready_fd, line.encode() + b"\n")
    except OSError:
        pass
    os.close(ready_fd)


def _read_secrets(fd: int) -> list[str]:
    if fd < 0:
        return []
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    return [s for s in json.loads(data or b"[]") if s]


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(1, view)
        except OSError:
            return  # (full disk) the output is lost, never written unredacted
        view = view[n:]


def _reap(pid: int, block: bool) -> int | None:
    try:
        got, status = os.waitpid(pid, 0 if block else os.WNOHANG)
    except ChildProcessError:
        return 255 << 8
    return status if got else None


def _pump(child: subprocess.Popen[bytes], out_r: int, redactor: StreamRedactor) -> int:
    """Redact the command's output into the log until it exits and its pipe drains."""
    status: int | None = None
    drain_until = 0.0
    while True:
        try:
            ready, _, _ = select.select(
                [out_r], [], [], DRAIN_IDLE_S if status is not None else 0.2
            )
        except InterruptedError:
            continue
        if status is None:
            status = _reap(child.pid, block=False)
            drain_until = time.monotonic() + DRAIN_MAX_S
        elif time.monotonic() > drain_until:
            break
        if not ready:
            if status is not None:
                break  # exited and the pipe stayed quiet: leftovers lose their later output
            continue
        data = os.read(out_r, PUMP_CHUNK)
        if not data:
            break
        _write_all(redactor.feed(data))
    _write_all(redactor.flush())  # a held-back tail that never became a secret
    os.close(out_r)
    return status if status is not None else (_reap(child.pid, block=True) or 0)


def main(args: list[str]) -> int:
    ready_fd, exit_path, secrets_fd = int(args[0]), Path(args[1]), int(args[2])
    argv = args[3:]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _noop)
    secrets = _read_secrets(secrets_fd)
    me = os.getpid()
    try:  # on record before the command can run: no record, no command
        write_atomic(exit_path.parent / PGID, f"{me} {start_time(me)}\n", mode=0o600)
    except OSError as e:
        _tell(ready_fd, f"error 126 cannot record the job's leader: {e}")
        return 126
    out_r, out_w = os.pipe() if secrets else (-1, -1)
    sink = out_w if secrets else None  # None: the job writes the inherited log fd itself
    try:
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, close_fds=True
        )
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        missing = isinstance(e, FileNotFoundError) or getattr(e, "errno", None) == errno.ENOENT
        _tell(ready_fd, f"error {127 if missing else 126} {e}")
        return CANNOT_START if missing else 126
    _tell(ready_fd, "ok")
    if secrets:
        os.close(out_w)
        status = _pump(child, out_r, StreamRedactor(secrets))
    else:
        status = _reap(child.pid, block=True) or 0
    code = os.waitstatus_to_exitcode(status)
    record = {
        "exit_code": code if code >= 0 else None,
        "signal": -code if code < 0 else None,
        "ended_at": time.time(),
    }
    try:
        write_record(exit_path, record)  # on a full disk the job dir's reserve is used
    except OSError:
        pass  # the supervisor, if alive, still records the status we exit with
    if code < 0:  # die of the same signal, so the supervisor sees the job's own status
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code
