"""`job.watch`: stream a job's log from a byte offset as `log` events, then one `job_end`.

Chunks are cut at the last newline (at most CHUNK bytes) so the client mostly gets whole
lines; a partial line goes out only when it alone fills a chunk or the job has ended. Event
offsets are contiguous, so the client's persisted `next_offset` is an exact resume cursor.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from remote_agent.agent.jobs import JobManager, JobState
from remote_agent.agent.spool import LOG, JobDir
from remote_agent.wire.protocol import bytes_to_text

CHUNK = 256 * 1024  # bytes per log event: fewer, larger events stream a long line faster
IDLE_POLL_S = 0.05
LOST_CHECK_S = 0.5

# emit(event, stop) writes the event unless `stop` is set, atomically w.r.t. other writes.
Emit = Callable[[dict[str, Any], threading.Event], bool]


class LogWatch:
    def __init__(self, jobs: JobManager, jd: JobDir, offset: int, emit: Emit) -> None:
        self.jobs = jobs
        self.jd = jd
        self.offset = offset
        self.emit = emit
        self.stop = threading.Event()
        self._lost_checked = 0.0

    def _ended(self) -> JobState | None:
        end = self.jobs.ended(self.jd)
        if end is None or end.state != "lost":
            return end
        # Lost means its leader is gone; the command itself may still be writing. Keep reading
        # until no process of its tree is left (checked at a slower pace: it scans /proc).
        now = time.monotonic()
        if now - self._lost_checked < LOST_CHECK_S:
            return None
        self._lost_checked = now
        tree = self.jobs.tree(self.jd)
        return end if tree is None or not tree.members() else None

    def run(self) -> None:
        fd: int | None = None
        try:
            while not self.stop.is_set():
                if fd is None:
                    try:
                        fd = os.open(self.jd.file(LOG), os.O_RDONLY)
                    except FileNotFoundError:
                        fd = None
                chunk = os.pread(fd, CHUNK, self.offset) if fd is not None else b""
                if chunk:
                    cut = chunk.rfind(b"\n") + 1
                    if cut == 0 and len(chunk) < CHUNK:
                        if self._ended() is None:  # wait for the rest of the line
                            self.stop.wait(IDLE_POLL_S)
                            continue
                        cut = len(chunk)
                    elif cut == 0:
                        cut = len(chunk)
                    if not self._send_log(chunk[:cut]):
                        return
                    continue
                # Nothing new. Check for the end first, then re-check the size: every byte the
                # job wrote before its exit record is visible by then.
                end = self._ended()
                if end is None:
                    self.stop.wait(IDLE_POLL_S)
                    continue
                size = os.fstat(fd).st_size if fd is not None else 0
                if size > self.offset:
                    continue
                self.emit(
                    {
                        "event": "job_end",
                        "job_id": self.jd.job_id,
                        "state": end.state,
                        "fate": end.fate,
                        "exit": end.exit,
                        "log_size": self.offset,
                    },
                    self.stop,
                )
                return
        finally:
            if fd is not None:
                os.close(fd)

    def _send_log(self, data: bytes) -> bool:
        nxt = self.offset + len(data)
        sent = self.emit(
            {
                "event": "log",
                "job_id": self.jd.job_id,
                "offset": self.offset,
                "next_offset": nxt,
                "data": bytes_to_text(data),
            },
            self.stop,
        )
        self.offset = nxt
        return sent


class WatchRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[str, set[LogWatch]] = {}

    def add(self, w: LogWatch) -> None:
        with self._lock:
            self._watches.setdefault(w.jd.job_id, set()).add(w)

    def remove(self, w: LogWatch) -> None:
        with self._lock:
            ws = self._watches.get(w.jd.job_id)
            if ws is not None:
                ws.discard(w)
                if not ws:
                    del self._watches[w.jd.job_id]

    def stop(self, job_id: str) -> int:
        with self._lock:
            ws = self._watches.pop(job_id, set())
        for w in ws:
            w.stop.set()
        return len(ws)

    def stop_all(self) -> None:
        with self._lock:
            ws = [w for s in self._watches.values() for w in s]
            self._watches.clear()
        for w in ws:
            w.stop.set()
