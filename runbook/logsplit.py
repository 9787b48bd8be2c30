"""Split a job's stream into lines, at constant memory however long a line is.

- `LineSplitter` (bytes) picks out the `@@eagle3 {...}` progress/metric records: a line that
  cannot be a record (it does not start with the prefix) is not kept past its first bytes.
- `LineClip` (text) gives the lines a console or the cockpit shows: at most `limit` characters
  of each line are kept; the rest is counted and said (`… 12,345 more bytes`). The mirror on
  disk keeps every byte; only what is drawn is bounded.
Each chunk is handled in time proportional to its own size (no re-scan of the line so far).
"""

from __future__ import annotations

from typing import Any

from remote_agent.wire.progress import PREFIX, parse

_PREFIX = PREFIX.encode()
LINE_LIMIT = 64 * 1024  # characters of one line a view shows
RECORD_LIMIT = 1 << 20  # a progress record longer than this is not one


class LineSplitter:
    """Complete lines that may be records; others are dropped as soon as they cannot be."""

    def __init__(self, max_partial: int = RECORD_LIMIT) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self._skip = False  # the current line is no record: drop bytes up to its newline
        self.max_partial = max_partial

    def _add(self, piece: bytes) -> None:
        if self._skip or not piece:
            return
        before = self._size
        self._parts.append(piece)
        self._size += len(piece)
        if before < len(_PREFIX):  # the prefix is still being read: is this line a record?
            head = b"".join(self._parts)
            self._parts = [head]
            n = min(len(head), len(_PREFIX))
            self._skip = head[:n] != _PREFIX[:n]
        if self._size > self.max_partial:
            self._skip = True
        if self._skip:
            self._parts, self._size = [], 0

    def _end(self) -> bytes | None:
        line = None if self._skip else b"".join(self._parts)
        self._parts, self._size, self._skip = [], 0, False
        if line is not None and not line.startswith(_PREFIX):
            return None  # shorter than the prefix: no record
        return line

    def feed(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                self._add(data[start:])
                return out
            self._add(data[start:nl])
            line = self._end()
            if line:
                out.append(line)
            start = nl + 1

    def flush(self) -> list[bytes]:
        line = self._end()
        return [line] if line else []


class LineClip:
    """Text chunks in, display lines out: each at most `limit` characters, plus a count."""

    def __init__(self, limit: int = LINE_LIMIT) -> None:
        self.limit = limit
        self._parts: list[str] = []
        self._kept = 0
        self._more = 0  # bytes (UTF-8) of the current line past the limit

    @property
    def partial(self) -> str:
        """The current line so far, as it would be shown."""
        return self._line()

    def _add(self, piece: str) -> None:
        room = self.limit - self._kept
        if room > 0 and piece:
            self._parts.append(piece[:room])
            self._kept += min(room, len(piece))
        if len(piece) > room:
            self._more += len(piece[max(room, 0) :].encode("utf-8", "surrogateescape"))

    def _line(self) -> str:
        text = "".join(self._parts)
        if len(self._parts) > 1:
            self._parts = [text]
        return text + (f" … {self._more:,} more bytes" if self._more else "")

    def _end(self) -> str:
        line = self._line()
        self._parts, self._kept, self._more = [], 0, 0
        return line

    def feed(self, text: str) -> list[str]:
        pieces = text.split("\n")
        out: list[str] = []
        for piece in pieces[:-1]:
            self._add(piece)
            out.append(self._end())
        self._add(pieces[-1])
        return out

    def set_partial(self, text: str) -> None:
        self._end()
        self._add(text)

    def flush(self) -> str | None:
        """The line in progress (the job ended without a final newline), or None."""
        if not self._parts and not self._more:
            return None
        return self._end()


def parse_record(line: bytes) -> dict[str, Any] | None:
    """The progress/metrics record a job printed on this line (the progress contract,
    remote_agent/wire/progress.py)."""
    if not line.startswith(_PREFIX):
        return None
    return parse(line.decode("utf-8", "replace"))
