"""The spool: `<root>/jobs/<job_id>/` per job, `<root>/stats.jsonl` for the stats ring.

Everything is user-only (dirs 0700, files 0600): logs and specs may hold paths, arguments
and data the operator would not share. Secrets are never written here (see jobwrap).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from remote_agent.wire.atomic_write import write_atomic
from remote_agent.wire.protocol import AgentError, bad

JOB_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,200}")

SPOOL_ID = "spool_id"  # in the spool root

# File names inside a job directory.
SPEC = "spec.json"
BOOT_ID = "boot_id"
STARTED_AT = "started_at"
PID = "pid"  # "<jobwrap pid> <start ticks>"
PGID = "pgid"  # "<job pgid> <start ticks of the job leader>"
HEARTBEAT = "heartbeat"
LOG = "log"
EXIT = "exit.json"
CANCEL = "cancel"
LEADER_EXIT = "leader_exit.json"  # written by the job's leader (jobleader) when it ends
JOBWRAP_LOG = "jobwrap.log"  # the jobwrap's own stderr: its tracebacks, never the job's output
# flock'ed for the whole launch chain: the agent while it spawns the jobwrap, the jobwrap, the
# job's leader (one open file description, inherited). Free = no process that could still
# start or record the command is left. The command itself never holds it.
ALIVE = "alive"
# Space kept in the job dir from before the command starts until its end is on record: a job
# that fills the disk still gets its exit recorded (write_record gives the reserve up for it).
RESERVE = "reserve"
RESERVE_BYTES = 64 * 1024
NEW_JOB_PREFIX = "+new-"  # a job dir being made (never a job id: '+' is not allowed in one)
NEW_JOB_SWEEP_S = 60.0


def default_root() -> Path:
    env = os.environ.get("EAGLE_TUI_SPOOL")
    if env:
        return Path(env)
    return Path.home() / ".eagle-tui" / "spool"


def make_private_dir(path: Path) -> None:
    """Create `path` (and missing parents) user-only; tighten it if it exists already."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
    os.chmod(path, 0o700)


def write_private(path: Path, data: bytes, *, atomic: bool = False) -> None:
    """Write a 0600 file; `atomic` = tmp + fsync + rename + fsync(dir), for records read racily."""
    if atomic:
        write_atomic(path, data, mode=0o600)
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def write_json(path: Path, obj: Any, *, atomic: bool = False) -> None:
    write_private(path, json.dumps(obj, indent=1, sort_keys=True).encode() + b"\n", atomic=atomic)


def reserve_space(job_dir: Path) -> None:
    """Allocate RESERVE_BYTES in the job dir for its exit records (OSError if the disk has not)."""
    fd = os.open(job_dir / RESERVE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            os.write(fd, b"\0" * RESERVE_BYTES)  # a filesystem without fallocate
        os.fsync(fd)
    except OSError:
        os.close(fd)
        os.unlink(job_dir / RESERVE)
        raise
    os.close(fd)


def write_record(path: Path, obj: Any) -> None:
    """An exit record (atomic). On a full disk the job dir's reserve is given up for it."""
    data = json.dumps(obj, indent=1, sort_keys=True).encode() + b"\n"
    try:
        write_atomic(path, data, mode=0o600)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        try:
            os.unlink(path.parent / RESERVE)
        except FileNotFoundError:
            raise e from None  # given up already: nothing left to free
        write_atomic(path, data, mode=0o600)


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def read_json(path: Path) -> Any:
    text = read_text(path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def read_id_pair(path: Path) -> tuple[int, int | None] | None:
    """Parse "<pid> <start ticks>" files (`pid`, `pgid`)."""
    text = read_text(path)
    if not text:
        return None
    parts = text.split()
    try:
        return int(parts[0]), (int(parts[1]) if len(parts) > 1 else None)
    except ValueError:
        return None


class Spool:
    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().absolute()
        self.jobs = self.root / "jobs"

    def ensure(self) -> Spool:
        make_private_dir(self.root)
        make_private_dir(self.jobs)
        self.identity()
        self._sweep_new_jobs()
        return self

    def create_job(self, job_id: str) -> tuple[JobDir, int]:
        """Make the job dir with its `alive` file already locked, atomically: it appears under
        its id (rename) complete, so there is no moment at which it exists unlocked while a
        launch may still follow. Returns the dir and the locked fd (the caller hands it on).
        Raises AgentError `exists` when the id is taken (the one guard against a relaunch)."""
        jd = self.job(job_id)
        tmp = self.jobs / f"{NEW_JOB_PREFIX}{secrets.token_hex(8)}"
        os.mkdir(tmp, 0o700)
        fd = os.open(tmp / ALIVE, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(tmp, jd.path)  # fails on an existing (non-empty) job dir
        except OSError as e:
            os.close(fd)
            shutil.rmtree(tmp, ignore_errors=True)
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR):
                raise AgentError(
                    "exists", f"job {job_id!r} already exists; reattach to it"
                ) from None
            raise
        return jd, fd

    def _sweep_new_jobs(self) -> None:
        """Dirs of launches whose agent died before the rename: never a job, nothing ran."""
        try:
            names = os.listdir(self.jobs)
        except OSError:
            return
        for name in names:
            path = self.jobs / name
            if name.startswith(NEW_JOB_PREFIX) and _age(path) > NEW_JOB_SWEEP_S:
                shutil.rmtree(path, ignore_errors=True)

    def identity(self) -> str:
        """This spool's random id, made once: a client that recorded another id for a job knows
        the spool was wiped (tmpfs after a reboot, rm -rf), not that the job never started."""
        path = self.root / SPOOL_ID
        text = read_text(path)
        if text and text.strip():
            return text.strip()
        tmp = self.root / f".{SPOOL_ID}.tmp.{os.getpid()}"
        try:
            write_private(tmp, (secrets.token_hex(16) + "\n").encode())
            os.link(tmp, path)  # first writer wins; never replaces an id a client recorded
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        return (read_text(path) or "").strip()

    def job(self, job_id: str) -> JobDir:
        check_job_id(job_id)
        return JobDir(job_id, self.jobs / job_id)

    def existing_job(self, job_id: str) -> JobDir:
        jd = self.job(job_id)
        if not jd.path.is_dir():
            raise AgentError("not_found", f"no job {job_id!r} in {self.jobs}")
        return jd

    def job_ids(self) -> list[str]:
        try:
            names = os.listdir(self.jobs)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if JOB_ID_RE.fullmatch(n) and (self.jobs / n).is_dir())


def check_job_id(job_id: Any) -> str:
    if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id) or job_id in (".", ".."):
        raise bad("job_id must match [A-Za-z0-9._-]{1,200} (and not be '.' or '..')")
    return job_id


class JobDir:
    """Read access to one job's spool directory (the jobwrap is the only writer of records)."""

    def __init__(self, job_id: str, path: Path) -> None:
        self.job_id = job_id
        self.path = path

    def file(self, name: str) -> Path:
        return self.path / name

    def spec(self) -> dict[str, Any]:
        v = read_json(self.file(SPEC))
        return v if isinstance(v, dict) else {}

    def exit(self) -> dict[str, Any] | None:
        v = read_json(self.file(EXIT))
        return v if isinstance(v, dict) else None

    def leader_exit(self) -> dict[str, Any] | None:
        """The job leader's own record of the command's status (see jobleader)."""
        v = read_json(self.file(LEADER_EXIT))
        return v if isinstance(v, dict) else None

    def boot_id(self) -> str | None:
        text = read_text(self.file(BOOT_ID))
        return text.strip() if text else None

    def started_at(self) -> float | None:
        text = read_text(self.file(STARTED_AT))
        try:
            return float(text) if text else None
        except ValueError:
            return None

    def jobwrap(self) -> tuple[int, int | None] | None:
        return read_id_pair(self.file(PID))

    def pgid(self) -> tuple[int, int | None] | None:
        """Written by the job's leader itself before it starts the command (jobleader)."""
        return read_id_pair(self.file(PGID))

    def chain_alive(self) -> bool | None:
        """Does a process of the launch chain (agent mid-launch, jobwrap, leader) still hold
        `alive`? None for a job dir made by an older agent (no such file)."""
        try:
            fd = os.open(self.file(ALIVE), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return None  # no flock here: the caller falls back to pids
        finally:
            os.close(fd)  # also drops our probe's shared lock
        return False

    def log_size(self) -> int:
        try:
            return self.file(LOG).stat().st_size
        except OSError:
            return 0

    def heartbeat_age(self) -> float | None:
        try:
            return max(0.0, time.time() - self.file(HEARTBEAT).stat().st_mtime)
        except OSError:
            return None


def _age(path: Path) -> float:
    try:
        return max(0.0, time.time() - path.stat().st_mtime)
    except OSError:
        return 0.0
