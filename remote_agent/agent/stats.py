"""Disk and GPU samples: a sampler thread, a ring of the last 3600 samples, `stats.since`.

The ring is also persisted as JSON lines in `<spool>/stats.jsonl` (trimmed), so a fresh agent
(the previous one died with its SSH session) still serves the history by `seq`. One agent at a
time samples: the one holding an flock on `<spool>/stats.lock`; any other agent on the same
spool follows the file instead, so two agents overlapping after a reconnect never fork the
sequence numbers.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from remote_agent.agent import gpu
from remote_agent.agent.probes import disk_usage
from remote_agent.agent.spool import write_private
from remote_agent.wire.protocol import arg_float, arg_int, arg_str_list

log = logging.getLogger("remote_agent.stats")

RING = 3600
DEFAULT_INTERVAL_S = 2.0
MIN_INTERVAL_S = 0.05


def take_sample(paths: list[str]) -> dict[str, Any]:
    disk = []
    for p in paths:
        try:
            du = disk_usage(Path(p).expanduser())
            disk.append({"path": p, "total": du["total"], "free": du["free"], "used": du["used"]})
        except OSError as e:
            disk.append(
                {
                    "path": p,
                    "total": None,
                    "free": None,
                    "used": None,
                    "error": e.strerror or str(e),
                }
            )
    gpus: list[dict[str, Any]] | None
    try:
        gpus = [
            {k: g[k] for k in ("index", "name", "util", "mem_used_mib", "mem_total_mib")}
            for g in gpu.gpus()
        ]
        gpu_error = None
    except gpu.GpuError as e:
        gpus, gpu_error = None, str(e)
    return {"t": time.time(), "disk": disk, "gpus": gpus, "gpu_error": gpu_error}


class Stats:
    def __init__(self, root: Path, emit: Callable[[dict[str, Any]], Any], ring: int = RING) -> None:
        self.file = root / "stats.jsonl"
        self.lock_file = root / "stats.lock"
        self.emit = emit
        self.ring: deque[dict[str, Any]] = deque(maxlen=ring)
        self.last_seq = 0
        self.paths: list[str] = []
        self.interval = DEFAULT_INTERVAL_S
        self.watching = False
        self._emitted = 0  # events go out for samples after this seq, whoever read them in
        self._lock = threading.Lock()  # ring, last_seq and the file cursor
        self._ino: int | None = None
        self._off = 0
        self._lines = 0
        self._holder_fd: int | None = None
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    # --- the file is the source of truth; the ring is its in-memory tail ------------------------

    def _sync(self) -> list[dict[str, Any]]:
        """Read samples appended since last time (by anyone); returns those new to the ring."""
        try:
            fh = open(self.file, "rb")
        except FileNotFoundError:
            return []
        with fh:
            st = os.fstat(fh.fileno())
            if st.st_ino != self._ino or st.st_size < self._off:  # first read, or trimmed
                self._ino, self._off, self._lines = st.st_ino, 0, 0
            fh.seek(self._off)
            data = fh.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._off += len(complete)
        new = []
        for line in complete.splitlines():
            self._lines += 1
            try:
                s = json.loads(line)
            except ValueError:
                continue
            seq = s.get("seq") if isinstance(s, dict) else None
            if isinstance(seq, int) and seq > self.last_seq:
                self.ring.append(s)
                self.last_seq = seq
                new.append(s)
        return new

    def _append(self, sample: dict[str, Any]) -> None:
        fd = os.open(self.file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, json.dumps(sample, separators=(",", ":")).encode() + b"\n")
        finally:
            os.close(fd)

    def _trim(self) -> None:
        if self._lines <= 2 * (self.ring.maxlen or RING):
            return
        body = b"".join(json.dumps(s, separators=(",", ":")).encode() + b"\n" for s in self.ring)
        write_private(self.file, body, atomic=True)
        st = os.stat(self.file)
        self._ino, self._off, self._lines = st.st_ino, st.st_size, len(self.ring)

    def _try_lock(self) -> None:
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return
        self._holder_fd = fd

    # --- sampling ----------------------------------------------------------------------------

    def tick(self) -> list[dict[str, Any]]:
        """One round: sample if we hold the lock, else pick up what the holder wrote."""
        if self._holder_fd is None:
            self._try_lock()
        if self._holder_fd is not None:
            sample = take_sample(self.paths)  # outside the lock: nvidia-smi may be slow
            with self._lock:
                self._sync()
                self._append({"seq": self.last_seq + 1, **sample})
                new = self._sync()
                self._trim()
        else:
            with self._lock:
                new = self._sync()
        return new

    def _run(self) -> None:
        while True:
            t0 = time.monotonic()
            try:
                self.tick()
            except Exception:
                log.exception("stats sampler")
            with self._lock:
                pending = [s for s in self.ring if s["seq"] > self._emitted]
                self._emitted = self.last_seq
            if self.watching:
                for s in pending:
                    self.emit({"event": "stats", **s})
            self._wake.wait(max(0.0, self.interval - (time.monotonic() - t0)))
            self._wake.clear()

    # --- ops ---------------------------------------------------------------------------------

    def op_sample(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"seq": None, **take_sample(arg_str_list(args, "paths", nullable=True) or [])}

    def op_watch(self, args: dict[str, Any]) -> dict[str, Any]:
        paths = arg_str_list(args, "paths", nullable=True) or []
        interval = max(MIN_INTERVAL_S, arg_float(args, "interval_s", DEFAULT_INTERVAL_S))
        with self._lock:
            self._sync()
            self.paths, self.interval, self.watching = paths, interval, True
            last = self._emitted = self.last_seq
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stats", daemon=True)
                self._thread.start()
        self._wake.set()  # sample now with the new paths
        return {"last_seq": last}

    def op_unwatch(self, args: dict[str, Any]) -> dict[str, Any]:
        self.watching = False  # the sampler keeps filling the ring
        return {}

    def op_since(self, args: dict[str, Any]) -> dict[str, Any]:
        seq = arg_int(args, "seq", 0, minimum=None)
        with self._lock:
            self._sync()
            samples = [s for s in self.ring if s["seq"] > seq]
            return {"samples": samples, "last_seq": self.last_seq}
