"""Agent side of jobs: start (via jobwrap), reconcile state from the spool, read, cancel, hash.

The agent keeps no job state of its own beyond the children it must reap: every answer is
derived from the spool, so a freshly started agent (after a crash or a reconnect over SSH)
sees exactly what the previous one saw.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

from remote_agent.jobenv import job_base_env
from remote_agent.launchguard import check_launch_guards
from remote_agent.procs import JobTree, boot_id, is_alive
from remote_agent.protocol import (
    AgentError,
    arg_bool,
    arg_env,
    arg_float,
    arg_int,
    arg_str,
    arg_str_list,
    bad,
    bytes_to_text,
)
from remote_agent.spool import CANCEL, JOBWRAP_LOG, LOG, JobDir, Spool, check_job_id, read_text

log = logging.getLogger("remote_agent.jobs")

READY_TIMEOUT_S = 30.0
STARTING_GRACE_S = 60.0  # a job dir without a pid file this young may still be starting
DEFAULT_MAX_READ = 1 << 20
MAX_READ = 16 << 20


def jobwrap_command(job_dir: str) -> tuple[list[str], dict[str, str]]:
    """How to launch the jobwrap from wherever this package was loaded.

    The package's parent is a directory (a checkout, site-packages) or a zipapp archive
    (`agent.pyz/remote_agent/...`); zipimport serves `-m remote_agent` from either, so one
    form works for both and does not depend on how the zipapp's own __main__ is written.
    """
    here = os.path.abspath(__file__)
    parent = os.path.dirname(os.path.dirname(here))
    env = dict(os.environ)
    env["PYTHONPATH"] = parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    python = sys.executable or "python3"
    return [python, "-m", "remote_agent", "jobwrap", job_dir], env


class JobManager:
    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        self._lock = threading.Lock()
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    # --- start -----------------------------------------------------------------------------

    def start(self, args: dict[str, Any]) -> dict[str, Any]:
        job_id = check_job_id(args.get("job_id"))
        argv = arg_str_list(args, "argv", nullable=True)
        shell = arg_str(args, "shell", None)
        if (argv is None) == (shell is None):
            raise bad("exactly one of args.argv and args.shell must be given")
        if argv is not None and not argv:
            raise bad("args.argv must not be empty")
        spec = {
            "job_id": job_id,
            "run_id": arg_str(args, "run_id", None),
            "step_id": arg_str(args, "step_id", None),
            "argv": argv,
            "shell": shell,
            "cwd": arg_str(args, "cwd", None),
            "env": arg_env(args, "env"),
            "timeout_s": arg_float(args, "timeout_s", None),
            "grace_s": arg_float(args, "grace_s", None, positive=False),
            "detach": arg_bool(args, "detach", False),
        }
        secret_env = arg_env(args, "secret_env")
        jd = self.spool.job(job_id)
        if jd.path.exists():  # a repeat after a reconnect: its guards were checked at its launch
            raise AgentError("exists", f"job {job_id!r} already exists; reattach to it")
        guards = check_launch_guards(args.get("guards"))
        try:
            os.mkdir(jd.path, 0o700)  # atomic: the one guard against relaunch after a reconnect
        except FileExistsError:
            raise AgentError("exists", f"job {job_id!r} already exists; reattach to it") from None

        bound_r = bound_w = None
        if not spec["detach"]:
            bound_r, bound_w = os.pipe()
        payload = {
            **spec,
            "secret_env": secret_env,
            "base_env": job_base_env(),
            "default_cwd": _cwd(),
            "agent_fd": bound_r,
        }
        argv_wrap, env = jobwrap_command(str(jd.path))
        err_fd = os.open(jd.file(JOBWRAP_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen(
                argv_wrap,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err_fd,
                cwd=jd.path,
                env=env,
                close_fds=True,
                pass_fds=(bound_r,) if bound_r is not None else (),
                start_new_session=True,
            )
        except OSError as e:
            # Nothing ran: remove the job dir so that a retry under the same id is possible.
            if bound_w is not None:
                os.close(bound_w)
            os.unlink(jd.file(JOBWRAP_LOG))
            os.rmdir(jd.path)
            raise AgentError(
                "internal", f"cannot launch the jobwrap ({argv_wrap[0]}): {e}"
            ) from None
        finally:
            os.close(err_fd)
            if bound_r is not None:
                os.close(bound_r)
        # Reap it whenever it ends (no zombies); closing the write end then frees the pipe.
        threading.Thread(
            target=self._reap, args=(job_id, proc, bound_w), name=f"reap-{job_id}", daemon=True
        ).start()
        with self._lock:
            self._children[job_id] = proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(payload).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        payload.clear()
        secret_env.clear()
        ready = self._read_ready(proc)
        if ready is None:
            tail = (read_text(jd.file(JOBWRAP_LOG)) or "")[-2000:]
            raise AgentError("internal", f"jobwrap for {job_id!r} did not start: {tail.strip()}")
        if "error" in ready:
            raise AgentError("start_failed", str(ready["error"]))
        log.info("started job %s pid %s", job_id, ready["pid"])
        return {
            "job_id": job_id,
            "pid": ready["pid"],
            "pgid": ready["pgid"],
            "started_at": ready["started_at"],
            "spool_dir": str(jd.path),
            "guards": guards,
        }

    def _read_ready(self, proc: subprocess.Popen[bytes]) -> dict[str, Any] | None:
        """The jobwrap's one line, sent after the pgid file exists (so cancel works at once)."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    return None
                chunk = os.read(fd, 4096)
                if not chunk:
                    return None
                buf += chunk
        finally:
            proc.stdout.close()
        try:
            msg = json.loads(buf.split(b"\n", 1)[0])
        except ValueError:
            return None
        return msg if isinstance(msg, dict) else None

    def _reap(self, job_id: str, proc: subprocess.Popen[bytes], bound_w: int | None) -> None:
        proc.wait()
        if bound_w is not None:
            os.close(bound_w)
        with self._lock:
            if self._children.get(job_id) is proc:
                del self._children[job_id]

    # --- state -----------------------------------------------------------------------------

    def _child_running(self, job_id: str) -> bool:
        with self._lock:
            proc = self._children.get(job_id)
        return proc is not None and proc.poll() is None

    def state(self, jd: JobDir) -> tuple[str, dict[str, Any] | None, bool]:
        """(state, exit record, boot id matches). `lost` only when the jobwrap is provably gone."""
        current_boot = boot_id()
        job_boot = jd.boot_id()
        boot_ok = job_boot is None or job_boot == current_boot
        exit_ = jd.exit()
        if exit_ is not None:
            return "exited", exit_, boot_ok
        if not boot_ok:
            return "lost", None, False
        wrap = jd.jobwrap()
        if wrap is None:
            starting = self._child_running(jd.job_id) or jd.created_age() < STARTING_GRACE_S
            return ("running" if starting else "lost"), None, boot_ok
        if is_alive(*wrap):
            return "running", None, boot_ok
        exit_ = jd.exit()  # it may have written the record just before exiting
        if exit_ is not None:
            return "exited", exit_, boot_ok
        return _without_supervisor(jd)

    def info(self, jd: JobDir) -> dict[str, Any]:
        state, exit_, boot_ok = self.state(jd)
        spec = jd.spec()
        pg = jd.pgid()
        wrap = jd.jobwrap()
        return {
            "job_id": jd.job_id,
            "run_id": spec.get("run_id"),
            "step_id": spec.get("step_id"),
            "state": state,
            "pid": pg[0] if pg else None,
            "pgid": pg[0] if pg else None,
            "jobwrap_pid": wrap[0] if wrap else None,
            "started_at": jd.started_at(),
            "exit": _public_exit(exit_),
            "log_size": jd.log_size(),
            "heartbeat_age_s": jd.heartbeat_age(),
            "boot_id_matches": boot_ok,
            "detach": spec.get("detach"),
            "spool_dir": str(jd.path),
        }

    def tree(self, jd: JobDir) -> JobTree | None:
        pg = jd.pgid()
        wrap = jd.jobwrap()
        if pg is None:
            return None
        if jd.boot_id() not in (None, boot_id()):
            return None  # ids from another boot mean nothing now
        return JobTree(pg[0], pg[1], wrap[0] if wrap else None, wrap[1] if wrap else None)

    def ended(self, jd: JobDir) -> tuple[str, dict[str, Any] | None] | None:
        """For readers: (state, exit) once no more output can come from the job's main process."""
        state, exit_, _ = self.state(jd)
        if state == "running":
            return None
        return state, _public_exit(exit_)

    def status(self, args: dict[str, Any]) -> dict[str, Any]:
        return self.info(self.spool.existing_job(check_job_id(args.get("job_id"))))

    def list(self, args: dict[str, Any]) -> dict[str, Any]:
        run_id = arg_str(args, "run_id", None)
        jobs = []
        for job_id in self.spool.job_ids():
            jd = self.spool.job(job_id)
            if run_id is not None and jd.spec().get("run_id") != run_id:
                continue
            jobs.append(self.info(jd))
        return {"jobs": jobs}

    # --- logs ------------------------------------------------------------------------------

    def read(self, args: dict[str, Any]) -> dict[str, Any]:
        jd = self.spool.existing_job(check_job_id(args.get("job_id")))
        offset = arg_int(args, "offset", 0)
        max_bytes = min(arg_int(args, "max_bytes", DEFAULT_MAX_READ, minimum=1), MAX_READ)
        # Decide "ended" before reading: bytes written before the exit record are all visible.
        ended = self.ended(jd) is not None
        size, data = 0, b""
        try:
            fd = os.open(jd.file(LOG), os.O_RDONLY)
        except FileNotFoundError:
            pass
        else:
            try:
                size = os.fstat(fd).st_size
                if offset <= size:
                    data = os.pread(fd, min(max_bytes, size - offset), offset)
            finally:
                os.close(fd)
        if offset > size:
            raise bad(f"offset {offset} is past the end of the log ({size} bytes)")
        nxt = offset + len(data)
        return {
            "data": bytes_to_text(data),
            "offset": offset,
            "next_offset": nxt,
            "eof": ended and nxt == size,
        }

    def log_hash(self, args: dict[str, Any]) -> dict[str, Any]:
        jd = self.spool.existing_job(check_job_id(args.get("job_id")))
        start = arg_int(args, "start", 0)
        size_now = jd.log_size()
        end = arg_int(args, "end", None)
        end = size_now if end is None else end
        if end < start:
            raise bad("args.end must be >= args.start")
        if end > size_now:
            raise bad(f"args.end {end} is past the end of the log ({size_now} bytes)")
        h = hashlib.sha256()
        with open(jd.file(LOG), "rb") as f:
            f.seek(start)
            left = end - start
            while left:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    break
                h.update(chunk)
                left -= len(chunk)
        return {"sha256": h.hexdigest(), "size": end - start - left, "start": start, "end": end}

    # --- cancel ----------------------------------------------------------------------------

    def cancel(self, args: dict[str, Any]) -> dict[str, Any]:
        jd = self.spool.existing_job(check_job_id(args.get("job_id")))
        grace_s = arg_float(args, "grace_s", 10.0, positive=False)
        state, _, _ = self.state(jd)
        if state == "exited":
            return self.info(jd)
        if not jd.file(CANCEL).exists():
            os.close(os.open(jd.file(CANCEL), os.O_WRONLY | os.O_CREAT, 0o600))
        tree = self.tree(jd)
        if tree is not None:
            log.info("cancelling job %s (grace %.1fs)", jd.job_id, grace_s)
            tree.terminate(grace_s)
        # The jobwrap (if alive) now reaps the leader and writes the record with "cancelled".
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and self.state(jd)[0] == "running":
            time.sleep(0.02)
        return self.info(jd)


def _without_supervisor(jd: JobDir) -> tuple[str, dict[str, Any] | None, bool]:
    """The jobwrap died without a record: the job's leader may still run, or have recorded it."""
    pg = jd.pgid()
    if pg is not None and is_alive(*pg):
        return "running", None, True  # unsupervised now (no timeout), but its exit will be kept
    leader = jd.leader_exit()  # written before the leader exits, so read after the check
    if leader is None:
        return "lost", None, True
    return (
        "exited",
        {
            **leader,
            "reason": "signaled" if leader.get("signal") else "exited",
            "log_size": jd.log_size(),
            "supervisor_lost": True,
        },
        True,
    )


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:  # our cwd was deleted under us
        return os.path.expanduser("~")


def _public_exit(exit_: dict[str, Any] | None) -> dict[str, Any] | None:
    if exit_ is None:
        return None
    keys = (
        "exit_code",
        "signal",
        "reason",
        "ended_at",
        "duration_s",
        "log_size",
        "leftover_pids",
        "error",
        "supervisor_lost",
    )
    return {k: exit_[k] for k in keys if k in exit_}
