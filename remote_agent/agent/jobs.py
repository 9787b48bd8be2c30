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
import shutil
import subprocess
import sys
import threading
import time
from typing import Any, NamedTuple

from remote_agent import package_parent
from remote_agent.agent.deletion import SPEC as DELETE_SPEC
from remote_agent.agent.deletion import delete_job_spec, delete_targets
from remote_agent.agent.jobenv import job_base_env
from remote_agent.agent.launchguard import check_launch_guards
from remote_agent.agent.procs import JobTree, boot_id, is_alive
from remote_agent.agent.spool import (
    CANCEL,
    JOBWRAP_LOG,
    LOG,
    JobDir,
    Spool,
    check_job_id,
    read_text,
    write_private,
)
from remote_agent.wire.protocol import (
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

log = logging.getLogger("remote_agent.jobs")

READY_TIMEOUT_S = 30.0
DEFAULT_MAX_READ = 1 << 20
MAX_READ = 16 << 20


def jobwrap_command(job_dir: str) -> tuple[list[str], dict[str, str]]:
    """How to launch the jobwrap from wherever this package was loaded.

    The package's parent is a directory (a checkout, site-packages) or a zipapp archive
    (`agent.pyz/remote_agent/...`); zipimport serves `-m remote_agent` from either, so one
    form works for both and does not depend on how the zipapp's own __main__ is written.
    """
    parent = package_parent()
    env = dict(os.environ)
    env["PYTHONPATH"] = parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    python = sys.executable or "python3"
    return [python, "-m", "remote_agent", "jobwrap", job_dir], env


class JobManager:
    def __init__(self, spool: Spool) -> None:
        self.spool = spool

    # --- start -----------------------------------------------------------------------------

    def start(self, args: dict[str, Any]) -> dict[str, Any]:
        job_id = check_job_id(args.get("job_id"))
        argv = arg_str_list(args, "argv", nullable=True)
        shell = arg_str(args, "shell", None)
        delete = delete_targets(args.get("delete"))
        if delete is not None:  # the agent's own job: no command from the client
            if argv is not None or shell is not None:
                raise bad("a delete job runs no command: give args.delete without argv/shell")
            python = sys.executable or "python3"
            argv = [python, "-m", "remote_agent", "delete", str(self.spool.jobs / job_id)]
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
            "detach": arg_bool(args, "detach", False) or delete is not None,  # outlives us
        }
        secret_env = arg_env(args, "secret_env")
        if self.spool.job(job_id).path.exists():  # a repeat after a reconnect: guards were checked
            raise AgentError("exists", f"job {job_id!r} already exists; reattach to it")
        guards = check_launch_guards(args.get("guards"))
        if delete is not None:
            delete_spec = delete_job_spec(delete, args.get("guards"), guards, self.spool.root)
        jd, alive_fd = self.spool.create_job(job_id)  # atomic: the one guard against relaunch
        if delete is not None:
            write_private(jd.file(DELETE_SPEC), json.dumps(delete_spec).encode(), atomic=True)

        bound_r = bound_w = None
        if not spec["detach"]:
            bound_r, bound_w = os.pipe()
        payload = {
            **spec,
            "secret_env": secret_env,
            "base_env": job_base_env(),
            "default_cwd": _cwd(),
            "agent_fd": bound_r,
            "alive_fd": alive_fd,
        }
        argv_wrap, env = jobwrap_command(str(jd.path))
        err_fd = os.open(jd.file(JOBWRAP_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fds = (alive_fd,) if bound_r is None else (alive_fd, bound_r)
        try:
            proc = subprocess.Popen(
                argv_wrap,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err_fd,
                cwd=jd.path,
                env=env,
                close_fds=True,
                pass_fds=fds,  # the jobwrap holds `alive` from here on (same open file)
                start_new_session=True,
            )
        except OSError as e:
            # Nothing ran: remove the job dir so that a retry under the same id is possible.
            if bound_w is not None:
                os.close(bound_w)
            shutil.rmtree(jd.path, ignore_errors=True)
            raise AgentError(
                "internal", f"cannot launch the jobwrap ({argv_wrap[0]}): {e}"
            ) from None
        finally:
            os.close(err_fd)
            os.close(alive_fd)
            if bound_r is not None:
                os.close(bound_r)
        # Reap it whenever it ends (no zombies); closing the write end then frees the pipe.
        threading.Thread(
            target=_reap, args=(proc, bound_w), name=f"reap-{job_id}", daemon=True
        ).start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(payload).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        payload.clear()
        secret_env.clear()
        deadline = time.monotonic() + READY_TIMEOUT_S
        ready = self._read_ready(proc, deadline)
        if ready is not None and "error" in ready:
            raise AgentError("start_failed", str(ready["error"]))
        if ready is None:
            # The jobwrap died (or stalls) before its ready line. Its leader may run the
            # command regardless, so this is no launch error: the job exists, and its status
            # (running, exited, lost, never started) tells its fate.
            tail = (read_text(jd.file(JOBWRAP_LOG)) or "")[-2000:].strip()
            log.warning("jobwrap for %s sent no ready line: %s", job_id, tail)
            while jd.pgid() is None and jd.chain_alive() and time.monotonic() < deadline:
                time.sleep(0.01)
        pg = jd.pgid()
        log.info("started job %s pid %s", job_id, pg[0] if pg else None)
        return {
            "job_id": job_id,
            "pid": pg[0] if pg else None,
            "pgid": pg[0] if pg else None,
            "started_at": jd.started_at() if ready is None else ready["started_at"],
            "spool_dir": str(jd.path),
            "guards": guards,
        }

    def _read_ready(self, proc: subprocess.Popen[bytes], deadline: float) -> dict[str, Any] | None:
        """The jobwrap's one line, sent after the pgid file exists (so cancel works at once)."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        buf = b""
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

    # --- state -----------------------------------------------------------------------------

    def state(self, jd: JobDir) -> JobState:
        """The job's state from the spool alone. `lost` only when no process that could still
        start or record the command is left (the `alive` lock is free), with the evidence."""
        boot_ok = jd.boot_id() in (None, boot_id())
        exit_ = jd.exit()
        if exit_ is not None:
            return JobState("exited", exit_, boot_ok)
        locked = jd.chain_alive()
        alive = locked
        if alive is None:  # no usable `alive` (an older agent's job dir): pids are the evidence
            alive = boot_ok and any(p is not None and is_alive(*p) for p in _chain_ids(jd))
        if alive:
            return JobState("running", None, boot_ok)
        # Every record below is written before its writer lets go of `alive`: read after it.
        exit_ = jd.exit()
        if exit_ is not None:
            return JobState("exited", exit_, boot_ok)
        leader = jd.leader_exit()
        if leader is not None:  # the supervisor died, the leader recorded the command's end
            reason = "signaled" if leader.get("signal") else "exited"
            record = {**leader, "reason": reason, "log_size": jd.log_size()}
            return JobState("exited", {**record, "supervisor_lost": True}, boot_ok)
        return JobState("lost", None, boot_ok, _lost_fate(jd, boot_ok, proven=locked is False))

    def info(self, jd: JobDir) -> dict[str, Any]:
        st = self.state(jd)
        spec = jd.spec()
        pg = jd.pgid()
        wrap = jd.jobwrap()
        return {
            "job_id": jd.job_id,
            "run_id": spec.get("run_id"),
            "step_id": spec.get("step_id"),
            "state": st.state,
            "fate": st.fate,
            "pid": pg[0] if pg else None,
            "pgid": pg[0] if pg else None,
            "jobwrap_pid": wrap[0] if wrap else None,
            "started_at": jd.started_at(),
            "exit": _public_exit(st.exit),
            "log_size": jd.log_size(),
            "heartbeat_age_s": jd.heartbeat_age(),
            "boot_id_matches": st.boot_ok,
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

    def ended(self, jd: JobDir) -> JobState | None:
        """For readers: the state once no more output can come from the job's main process."""
        st = self.state(jd)
        if st.state == "running":
            return None
        return st._replace(exit=_public_exit(st.exit))

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
        if self.state(jd).state == "exited":
            return self.info(jd)
        if not jd.file(CANCEL).exists():
            os.close(os.open(jd.file(CANCEL), os.O_WRONLY | os.O_CREAT, 0o600))
        tree = self.tree(jd)
        if tree is not None:
            log.info("cancelling job %s (grace %.1fs)", jd.job_id, grace_s)
            tree.terminate(grace_s)
        # The jobwrap (if alive) now reaps the leader and writes the record with "cancelled".
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and self.state(jd).state == "running":
            time.sleep(0.02)
        return self.info(jd)


class JobState(NamedTuple):
    state: str  # running | exited | lost
    exit: dict[str, Any] | None
    boot_ok: bool
    fate: dict[str, str] | None = None  # lost only: {reason, evidence}


def _chain_ids(jd: JobDir) -> tuple[tuple[int, int | None] | None, ...]:
    return jd.jobwrap(), jd.pgid()


def _lost_fate(jd: JobDir, boot_ok: bool, proven: bool) -> dict[str, str]:
    """Why a job with no exit record and no live launch chain is lost: what the spool proves.
    `proven`: the `alive` lock was free (not just pids found dead)."""
    pg = jd.pgid()
    if pg is None and proven:
        # The leader records itself before it starts the command, and every process that
        # could still do so is gone: the command provably never ran.
        why = (read_text(jd.file(JOBWRAP_LOG)) or "").strip().splitlines()[-1:]
        try:
            free = shutil.disk_usage(jd.path).free
        except OSError:
            free = None
        return {
            "reason": "never_started",
            "evidence": "the command never started: its leader left no record, and no process "
            "of the job's launch is left"
            + (f" (the supervisor said: {why[0][-300:]})" if why else " (killed mid launch)")
            + (
                f"; the spool's disk has {free} bytes free"
                if free is not None and free < (1 << 20)
                else ""
            ),
        }
    if not boot_ok:
        return {
            "reason": "rebooted",
            "evidence": "the box rebooted after the job started; it left no exit record",
        }
    if pg is None:
        return {"reason": "unknown", "evidence": "no leader record and no launch lock to read"}
    return {
        "reason": "leader_gone",
        "evidence": f"lost while running: its leader (pid {pg[0]}) and its supervisor are gone "
        "and left no exit record",
    }


def _reap(proc: subprocess.Popen[bytes], bound_w: int | None) -> None:
    proc.wait()
    if bound_w is not None:
        os.close(bound_w)


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
