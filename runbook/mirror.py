"""The local mirror of one job's log, with a cursor kept in step with every append.

What the operator was shown is derived from what was durably mirrored: a chunk is appended to
the mirror first and only then emitted to the console/cockpit. To resume after a `kill -9` of
the client exactly where the mirror ends (not where the state file's cursor, saved at most every
0.5 s, says), each append is preceded by a rewrite of `<mirror>.cursor` (in place: one `pwrite` of a
fixed-size record, which a kill cannot tear):

    {"before": [remote_offset, mirror_size], "after": [remote_end, mirror_size_after],
     "shown": mirror offset the console has drawn}

On resume the mirror's own size says which side of the append the client died on: equal to
`after` (appended; resume after it), equal to `before` (never appended, so never shown: fetch it
again), in between (a torn append: cut it back to `before`). Anything else (a cursor from
another attempt, a mirror edited by hand) falls back to the state file's cursor, cutting the
mirror back to it, as before. `shown` is rewritten after the chunk's event returned (the console draws synchronously, one
write per chunk): mirrored bytes past it are drawn first on resume, from the mirror. Secrets are redacted before the append, so mirror sizes and
remote offsets differ: that is why the cursor records both.

When each chunk arrived is kept beside the mirror in `<mirror>.times`, one `END EPOCH` line per
append (END: the mirror's size after it). A line of the log arrived with the first chunk that
ends past its start: the full-log viewer shows that time per line. The file is derived, never
trusted for anything but display: entries past a resume point are dropped when the mirror is cut
back, and a torn last entry is ignored.
"""

from __future__ import annotations

import bisect
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

CURSOR_SUFFIX = ".cursor"
TIMES_SUFFIX = ".times"
RECORD = 256  # bytes: the cursor is rewritten in place, always whole


def cursor_path(mirror: Path) -> Path:
    return mirror.with_name(mirror.name + CURSOR_SUFFIX)


def times_path(mirror: Path) -> Path:
    return mirror.with_name(mirror.name + TIMES_SUFFIX)


@dataclass
class TimesScan:
    """New entries of a `.times` file read from `start` up to `end` (bytes of that file)."""

    start: int
    end: int
    ends: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    reset: bool = False  # the file shrank (a resume cut it back): start over


class ChunkTimes:
    """When the bytes of a mirror arrived: `at(offset)` is the arrival time (epoch seconds) of
    the chunk holding that byte, None where nothing was recorded (a mirror from before times
    were kept, or an entry lost to a kill). A viewer that follows a growing log reads only what
    was appended since (`scan` in a thread, `apply` where the view reads), as LineIndex does."""

    def __init__(self, mirror: Path) -> None:
        self.mirror = mirror
        self.ends: list[int] = []
        self.times: list[float] = []
        self.read_to = 0  # bytes of the .times file taken in

    @classmethod
    def read(cls, mirror: Path, limit: int | None = None) -> ChunkTimes:
        t = cls(mirror)
        t.apply(t.scan(limit))
        return t

    def scan(self, limit: int | None = None) -> TimesScan:
        """Entries appended since the last apply, up to the first past `limit` (the mirror's
        confirmed size); reads this object only, so it may run in a thread."""
        start = self.read_to
        try:
            with open(times_path(self.mirror), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < start:
                    return TimesScan(start, 0, reset=True)
                f.seek(start)
                raw = f.read(size - start)
        except OSError:
            return TimesScan(start, start)
        found = TimesScan(start, start)
        last = self.ends[-1] if self.ends else -1
        for line in raw.split(b"\n")[:-1]:  # the last piece is b"" or a torn entry
            try:
                end_s, at_s = line.split()
                end, at = int(end_s), float(at_s)
            except ValueError:
                end, at = -1, 0.0
            if limit is not None and end > limit:
                break  # not confirmed yet: read again next time
            found.end += len(line) + 1
            if end <= last:
                continue  # torn or out of order: not ours to guess
            found.ends.append(end)
            found.times.append(at)
            last = end
        return found

    def apply(self, found: TimesScan) -> None:
        if found.reset:
            self.ends, self.times, self.read_to = [], [], 0
            return
        if found.start != self.read_to:
            return  # stale (another scan applied first)
        self.ends += found.ends
        self.times += found.times
        self.read_to = found.end

    def at(self, offset: int) -> float | None:
        i = bisect.bisect_right(self.ends, offset)
        return self.times[i] if i < len(self.times) else None


def _trim_times(mirror: Path, size: int) -> None:
    """Drop entries for bytes past `size` (the mirror was cut back to it on resume)."""
    path = times_path(mirror)
    try:
        raw = path.read_bytes()
    except OSError:
        return
    keep: list[bytes] = []
    for line in raw.split(b"\n")[:-1]:
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) <= size:
            keep.append(line + b"\n")
    trimmed = b"".join(keep)
    if trimmed != raw:
        path.write_bytes(trimmed)


def _read_cursor(mirror: Path) -> tuple[tuple[int, int], tuple[int, int], int] | None:
    try:
        v = json.loads(cursor_path(mirror).read_text())
        before, after = v["before"], v["after"]
        pair = (int(before[0]), int(before[1])), (int(after[0]), int(after[1]))
        shown = int(v.get("shown", after[1]))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    (rb, mb), (ra, ma) = pair
    if not (0 <= rb <= ra and 0 <= mb <= ma):
        return None
    return pair[0], pair[1], shown


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def resume_point(mirror: Path, saved_remote: int, saved_mirror: int) -> tuple[int, int]:
    """(remote offset, mirror size) to resume at; never changes a file (readers use it too)."""
    return _resume(mirror, saved_remote, saved_mirror)[:2]


def _resume(mirror: Path, saved_remote: int, saved_mirror: int) -> tuple[int, int, int]:
    """(remote offset, mirror size, mirror offset the console has shown)."""
    size = _size(mirror)
    cur = _read_cursor(mirror)
    if cur is not None:
        (rb, mb), (ra, ma), shown = cur
        if size == ma:
            return ra, ma, min(max(shown, mb), ma)
        if mb <= size < ma:
            return rb, mb, mb
    size = min(saved_mirror, size)
    return saved_remote, size, size


class LogMirror:
    """Appends to one mirror file; `remote`/`size` are where the mirror ends."""

    def __init__(self, path: Path, saved_remote: int, saved_mirror: int) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.remote, self.size, self.shown = _resume(path, saved_remote, saved_mirror)
        self._before = [self.remote, self.size]
        # One pwrite of a fixed-size record per update: a kill -9 cannot tear a single write of a
        # regular file, and the gap between the console's write and this one is a few syscalls.
        self._fd = os.open(cursor_path(path), os.O_RDWR | os.O_CREAT, 0o600)
        # Bytes past the resume point were never shown (or are torn): they come again.
        with open(path, "ab") as f:
            f.truncate(self.size)
        _trim_times(path, self.size)
        self._times = os.open(times_path(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def unshown(self) -> bytes:
        """Mirrored bytes the console never finished showing (the client died while it drew
        them): shown first on resume, from the mirror itself."""
        if self.shown >= self.size:
            return b""
        with open(self.path, "rb") as f:
            f.seek(self.shown)
            return f.read(self.size - self.shown)

    def append(self, remote_end: int, data: bytes) -> None:
        self._before = [self.remote, self.size]
        after = self.size + len(data)
        self._write_cursor([remote_end, after], shown=self.size)
        with open(self.path, "ab") as f:
            f.write(data)
        self.remote, self.size = remote_end, after
        os.write(self._times, f"{after} {time.time():.3f}\n".encode())  # one write: whole or none

    def mark_shown(self) -> None:
        """The console has drawn everything appended so far (called after the chunk's event)."""
        self._write_cursor([self.remote, self.size], shown=self.size)
        self.shown = self.size

    def _write_cursor(self, after: list[int], shown: int) -> None:
        text = json.dumps({"before": self._before, "after": after, "shown": shown})
        os.pwrite(self._fd, text.ljust(RECORD).encode(), 0)

    def close(self) -> None:
        os.close(self._fd)
        os.close(self._times)
