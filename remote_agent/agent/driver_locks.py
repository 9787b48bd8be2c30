"""Box-side records that no operator machine can rewrite alone: the driver lock and audit heads.

    <root>/locks/<sha256(name NUL work_dir)>.json   who drives runbook `name` in `work_dir` now
    <root>/audit-heads/<run_id>.json                the last audit head each driver recorded

A lock is held by one agent process (= one driver connection). It is stale, and taken over, when
that agent is gone: its pid with its start time no longer runs, or the box rebooted (boot id).
A driver that reconnects (new agent) presents the same `driver_id` and takes its own lock back.
Check-then-write runs under flock on the lock file, so two agents never both win.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from remote_agent.agent.procs import boot_id, is_alive, start_time
from remote_agent.agent.spool import make_private_dir, read_json, write_json
from remote_agent.wire.protocol import AgentError, bad

RUN_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,200}")


def _opt_str(args: dict[str, Any], key: str) -> str | None:
    return None if args.get(key) is None else _str(args, key)


def _str(args: dict[str, Any], key: str) -> str:
    v = args.get(key)
    if not isinstance(v, str) or not v or "\0" in v:
        raise bad(f"{key} must be a non-empty string")
    return v


def _unusable(where: Path, e: OSError) -> AgentError:
    return AgentError(
        "spool_unusable",
        f"cannot record the driver lock in {where}: {e.strerror or e}; free space there, then retry",
    )


class DriverLocks:
    def __init__(self, root: Path) -> None:
        self.locks = root / "locks"
        self.heads = root / "audit-heads"
        self.pid = os.getpid()
        self.start = start_time(self.pid)
        self.boot = boot_id()
        self._mine: set[Path] = set()
        self._guard = threading.Lock()

    # --- locks -------------------------------------------------------------------------------

    def _path(self, args: dict[str, Any]) -> tuple[Path, str, str]:
        name = _str(args, "name")
        work = _opt_str(args, "work_dir") or os.getcwd()
        work = os.path.realpath(os.path.expanduser(work))
        key = hashlib.sha256(f"{name}\0{work}".encode()).hexdigest()[:32]
        return self.locks / f"{key}.json", name, work

    def _stale(self, rec: dict[str, Any]) -> str | None:
        """Why the holder no longer holds, or None if it does."""
        if rec.get("boot_id") != self.boot:
            return "the box rebooted since it was taken"
        pid, start = rec.get("agent_pid"), rec.get("agent_start")
        if not isinstance(pid, int) or not is_alive(pid, start if isinstance(start, int) else None):
            return f"its agent (pid {pid}) is gone"
        return None

    def _locked(self, path: Path) -> tuple[int, dict[str, Any] | None]:
        make_private_dir(self.locks)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.pread(fd, 1 << 16, 0)
        try:
            rec = json.loads(raw) if raw.strip() else None
        except ValueError:
            rec = None  # torn by a crash mid-write: nobody holds it
        return fd, rec if isinstance(rec, dict) else None

    def acquire(self, args: dict[str, Any]) -> dict[str, Any]:
        path, name, work = self._path(args)
        holder = args.get("holder") or {}
        if not isinstance(holder, dict):
            raise bad("holder must be an object {host, user, pid, driver_id}")
        driver_id = _str(holder, "driver_id")
        try:
            fd, rec = self._locked(path)
        except OSError as e:
            raise _unusable(self.locks, e) from None
        try:
            recovered = None
            if rec is not None:
                ours = rec.get("agent_pid") == self.pid or rec.get("driver_id") == driver_id
                why = None if ours else self._stale(rec)
                if not ours and why is None:
                    return {"acquired": False, "holder": rec}
                if why:
                    recovered = {"holder": rec, "why": why}
            new = {
                "name": name,
                "work_dir": work,
                "host": str(holder.get("host")),
                "user": str(holder.get("user")),
                "pid": holder.get("pid"),
                "driver_id": driver_id,
                "since": rec["since"] if rec and rec.get("driver_id") == driver_id else time.time(),
                "agent_pid": self.pid,
                "agent_start": self.start,
                "boot_id": self.boot,
            }
            data = json.dumps(new, sort_keys=True).encode()
            try:  # write, then cut: a full disk leaves the old record whole, never an empty one
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))
                os.fsync(fd)
            except OSError as e:
                raise _unusable(self.locks, e) from None
            with self._guard:
                self._mine.add(path)
            return {"acquired": True, "holder": new, "recovered": recovered}
        finally:
            os.close(fd)

    def _release_path(self, path: Path) -> bool:
        try:
            fd, rec = self._locked(path)
        except OSError:
            return False
        try:
            if rec is not None and rec.get("agent_pid") == self.pid:
                os.ftruncate(fd, 0)
                os.fsync(fd)
                return True
            return False
        finally:
            os.close(fd)
            with self._guard:
                self._mine.discard(path)

    def release(self, args: dict[str, Any]) -> dict[str, Any]:
        path, _, _ = self._path(args)
        return {"released": self._release_path(path)}

    def release_all(self) -> None:
        """At EOF/shutdown: the connection is gone, and with it the driver's claim."""
        with self._guard:
            paths = list(self._mine)
        for p in paths:
            self._release_path(p)

    def status(self, args: dict[str, Any]) -> dict[str, Any]:
        path, _, _ = self._path(args)
        rec = read_json(path) if path.exists() else None
        if not isinstance(rec, dict) or self._stale(rec):
            return {"holder": None}
        return {"holder": rec}

    # --- audit heads -------------------------------------------------------------------------

    def _head_path(self, args: dict[str, Any]) -> Path:
        run_id = _str(args, "run_id")
        assert run_id is not None
        if not RUN_ID_RE.fullmatch(run_id) or run_id in (".", ".."):
            raise bad("run_id must match [A-Za-z0-9._-]{1,200}")
        return self.heads / f"{run_id}.json"

    def head_set(self, args: dict[str, Any]) -> dict[str, Any]:
        path = self._head_path(args)
        seq, hash_ = args.get("seq"), args.get("hash")
        if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(hash_, str):
            raise bad("seq must be an int and hash a string")
        rec = {
            "run_id": args["run_id"],
            "seq": seq,
            "hash": hash_,
            "clean": bool(args.get("clean", False)),
            "ts": time.time(),
        }
        make_private_dir(self.heads)
        write_json(path, rec, atomic=True)
        return rec

    def head_get(self, args: dict[str, Any]) -> dict[str, Any]:
        rec = read_json(self._head_path(args))
        return {"head": rec if isinstance(rec, dict) else None}
