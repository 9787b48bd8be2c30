"""The per-job supervisor: `python -m remote_agent jobwrap JOBDIR` (started by the agent only).

It is what lets a job outlive the agent and the SSH connection: it leads its own session,
owns the job's spool records, touches a heartbeat, enforces the timeout and writes the exit
record atomically. The agent hands it the spec, the environment and the secrets over stdin
(so secrets never touch the disk or argv) and gets back one ready line on stdout.

A bound job (detach false) also inherits the read end of a pipe whose write end only the agent
holds: EOF there means the agent died, and the job is killed with reason "agent_lost".
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
from typing import Any

from remote_agent import __version__
from remote_agent.agent.jobleader import bootstrap_argv
from remote_agent.agent.procs import JobTree, boot_id, start_time
from remote_agent.agent.spool import (
    BOOT_ID,
    CANCEL,
    EXIT,
    HEARTBEAT,
    LEADER_EXIT,
    LOG,
    PID,
    RESERVE,
    SPEC,
    STARTED_AT,
    reserve_space,
    write_json,
    write_private,
    write_record,
)

HEARTBEAT_S = 2.0
DEFAULT_GRACE_S = 10.0

_term_requested = False


def _on_term(signum: int, frame: Any) -> None:
    global _term_requested
    _term_requested = True


def _ready(msg: dict[str, Any]) -> None:
    """Tell the agent we are up (or why not), then detach stdout from its pipe for good."""
    try:
        os.write(1, json.dumps(msg).encode() + b"\n")
    except OSError:
        pass  # the agent is gone already; the spool records still tell the story
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.close(devnull)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)  # Linux >= 5.3: readable when the process exits
    except (AttributeError, OSError):
        return None


def _spawn(
    spec: dict[str, Any],
    env: dict[str, str],
    log_fd: int,
    exit_path: Path,
    secrets: list[str],
    alive_fd: int,
) -> subprocess.Popen[bytes]:
    """Start the job under its leader (jobleader), which records its pgid before it starts
    the command and its exit when it ends, even without us. It inherits `alive_fd` (the job
    dir's launch lock, see spool.ALIVE) and holds it until it has recorded the end.

    With secrets the leader redacts the job's output before it reaches the log; the values go
    to it over a pipe (never argv or disk).

    Raises OSError with the leader's reason when the command itself cannot start.
    """
    argv = spec["argv"] if spec.get("argv") is not None else ["/bin/sh", "-c", spec["shell"]]
    ready_r, ready_w = os.pipe()
    secrets_r, secrets_w = os.pipe() if secrets else (-1, -1)
    # The job leads its own process group inside our session: cancel kills exactly its tree.
    group: dict[str, Any] = (
        {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    )
    try:
        child = subprocess.Popen(
            bootstrap_argv(ready_w, exit_path, argv, secrets_r),
            cwd=spec["cwd"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            close_fds=True,
            pass_fds=(ready_w, alive_fd, secrets_r) if secrets else (ready_w, alive_fd),
            **group,
        )
    except BaseException:
        if secrets:
            os.close(secrets_w)
        raise
    finally:
        os.close(ready_w)
        if secrets:
            os.close(secrets_r)
    if secrets:
        data = json.dumps(secrets).encode()
        try:
            while data:
                data = data[os.write(secrets_w, data) :]
        except BrokenPipeError:
            pass  # the leader died at once; its ready line says why
        finally:
            os.close(secrets_w)
    with os.fdopen(ready_r, "rb") as f:
        line = f.readline().decode(errors="replace").strip()
    if line != "ok":
        child.wait()
        code, _, message = line.partition(" ")[2].partition(" ") if line else ("", "", "")
        err = OSError(message or f"the job leader died before starting it ({child.returncode})")
        err.errno = errno.ENOENT if code == "127" else None
        raise err
    return child  # pyright: ignore[reportReturnType]  (bytes: no text=; `**group` hides that)


def _supervise(
    child: subprocess.Popen[bytes],
    tree: JobTree,
    heartbeat: Path,
    timeout_s: float | None,
    grace_s: float,
    agent_fd: int | None,
) -> str | None:
    """Wait for the job; returns the reason we killed it (timeout, agent_lost) or None."""
    global _term_requested
    reason: str | None = None
    pidfd = _pidfd(child.pid)
    deadline = time.monotonic() + timeout_s if timeout_s else None
    next_hb = 0.0
    while child.poll() is None:
        now = time.monotonic()
        if now >= next_hb:
            try:
                os.utime(heartbeat)
            except OSError:
                pass  # a missing heartbeat must not cost the job its supervisor
            next_hb = now + HEARTBEAT_S
        if _term_requested:  # someone TERMed the supervisor: pass it on, keep supervising
            _term_requested = False
            tree.signal(signal.SIGTERM)
        if deadline is not None and now >= deadline:
            deadline = None
            reason = reason or "timeout"
            tree.terminate(grace_s)
            continue
        fds = [fd for fd in (pidfd, agent_fd) if fd is not None]
        wait = min(next_hb, deadline if deadline is not None else next_hb) - now
        wait = max(0.0, min(wait, 1.0 if pidfd is not None else 0.1))
        try:
            readable, _, _ = select.select(fds, [], [], wait)
        except InterruptedError:
            continue
        if agent_fd is not None and agent_fd in readable:
            try:
                data = os.read(agent_fd, 4096)
            except OSError:
                data = b""
            if not data:  # EOF: the agent (our connection) is gone and this job is bound to it
                os.close(agent_fd)
                agent_fd = None
                if child.poll() is not None:
                    break  # the job ended on its own first: its exit stands
                reason = reason or "agent_lost"
                tree.terminate(grace_s)
    if pidfd is not None:
        os.close(pidfd)
    return reason


def _ignore(signum: int, frame: Any) -> None:
    pass


def _set_signals() -> None:
    # Dispositions set to SIG_IGN survive exec, so an ignored SIGINT/SIGHUP inherited from the
    # agent's launcher (nohup, ssh) would leak into the job: reset them. A Python handler is
    # reset to default by exec, so the job starts clean while we ignore hangups ourselves.
    for sig in signal.valid_signals():
        if sig != signal.SIGPIPE and signal.getsignal(sig) == signal.SIG_IGN:
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    signal.signal(signal.SIGHUP, _ignore)  # a closing terminal/SSH session is not ours
    signal.signal(signal.SIGINT, _ignore)
    signal.signal(signal.SIGTERM, _on_term)


def run(job_dir: str) -> int:
    _set_signals()
    path = Path(job_dir)
    me = os.getpid()
    write_private(path / PID, f"{me} {start_time(me)}\n".encode())

    payload = json.loads(sys.stdin.buffer.read())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    secret_env: dict[str, str] = payload.pop("secret_env", None) or {}
    base_env: dict[str, str] = payload.pop("base_env", None) or {}
    agent_fd: int | None = payload.pop("agent_fd", None)
    alive_fd: int = payload.pop("alive_fd")  # inherited locked; held until we exit
    default_cwd: str = payload.pop("default_cwd", None) or "/"

    spec = dict(payload)
    spec["cwd"] = spec.get("cwd") or default_cwd
    spec["secret_env_names"] = sorted(secret_env)  # names only: values never touch the disk
    spec["created_at"] = time.time()
    spec["agent_version"] = __version__
    spec["jobwrap_pid"] = me
    write_json(path / SPEC, spec, atomic=True)
    write_private(path / BOOT_ID, (boot_id() + "\n").encode())
    write_private(path / HEARTBEAT, b"")

    env = {**base_env, **spec.get("env", {}), **secret_env, "PYTHONUNBUFFERED": "1"}
    log_fd = os.open(path / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    started = time.time()

    def not_started(message: str, code: int | None, reason: str) -> int:
        os.write(log_fd, f"eagle-tui jobwrap: {message}\n".encode())
        os.close(log_fd)
        write_private(path / STARTED_AT, f"{started!r}\n".encode())
        write_record(
            path / EXIT,
            {
                "exit_code": code,
                "signal": None,
                "reason": reason,
                "ended_at": time.time(),
                "error": message,
                "log_size": (path / LOG).stat().st_size,
            },
        )
        _ready({"error": message})
        return 0

    if (path / CANCEL).exists():  # cancelled by another connection while we were starting
        return not_started("cancelled before it started", None, "cancelled")
    try:  # no command runs unless its end can be recorded, full disk or not
        reserve_space(path)
    except OSError as e:
        return not_started(f"cannot reserve space for the job's exit record: {e}", 126, "exited")
    try:
        secrets = sorted(set(secret_env.values()))
        child = _spawn(spec, env, log_fd, path / LEADER_EXIT, secrets, alive_fd)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        missing = isinstance(e, FileNotFoundError) or getattr(e, "errno", None) == errno.ENOENT
        return not_started(f"cannot start job: {e}", 127 if missing else 126, "exited")
    os.close(log_fd)
    env.clear()
    secret_env.clear()
    try:
        write_private(path / STARTED_AT, f"{started!r}\n".encode())
    except OSError:
        pass  # a full disk: the exit record (reserved space) matters, this does not
    child_start = start_time(child.pid)  # the leader recorded its pgid itself, before "ok"
    _ready({"pid": child.pid, "pgid": child.pid, "started_at": started})

    tree = JobTree(child.pid, child_start, me, start_time(me))
    reason = _supervise(
        child,
        tree,
        path / HEARTBEAT,
        spec.get("timeout_s"),
        spec.get("grace_s") or DEFAULT_GRACE_S,
        agent_fd,
    )
    rc = child.returncode
    if (path / CANCEL).exists():
        reason = "cancelled"
    elif reason is None:
        reason = "exited" if rc >= 0 else "signaled"
    record = {
        "exit_code": rc if rc >= 0 else None,
        "signal": -rc if rc < 0 else None,
        "reason": reason,
        "ended_at": time.time(),
        "duration_s": round(time.time() - started, 3),
        "log_size": (path / LOG).stat().st_size,
        # Processes of the job still alive after its leader exited (they may pin GPUs).
        "leftover_pids": tree.members(),
    }
    write_record(path / EXIT, record)
    (path / RESERVE).unlink(missing_ok=True)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m remote_agent jobwrap JOBDIR", file=sys.stderr)
        return 2
    try:
        return run(argv[0])
    except Exception:
        import traceback

        traceback.print_exc()  # stderr is the job dir's jobwrap.log
        return 1
