"""A sparse line index over a log file on disk (Toolong's technique, with a smaller footprint).

Instead of one offset per line (80 MB for 10 million lines) we keep one checkpoint per block of
bytes read: (line number, byte offset of that line's start). Reading lines [a, b) seeks to the
nearest checkpoint at or before `a` and splits forward, so the cost is bounded by one block.

The index grows incrementally, so it follows a log that is still being written. Scanning (`scan`)
only reads the index and can run in a thread; `apply` mutates it and runs on the UI thread.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass, field
from pathlib import Path

from eagle_tui.app.widgets.logs.feed import clean

BLOCK = 64 * 1024


@dataclass
class ScanResult:
    start: int  # the `scanned` offset the scan began at (stale results are ignored)
    end: int
    newlines: int = 0
    tail_start: int | None = None
    checkpoints: list[tuple[int, int]] = field(
        default_factory=list
    )  # (line relative to start, offset)
    reset: bool = False


class LineIndex:
    def __init__(self, path: Path | str, limit: int | None = None, block: int = BLOCK) -> None:
        self.path = Path(path)
        self.block = block
        self.limit = limit  # index only bytes below this offset (e.g. the mirror's confirmed size)
        self._reset()

    def _reset(self) -> None:
        self._lines: list[int] = [0]  # checkpoint line numbers (ascending)
        self._offsets: list[int] = [0]  # checkpoint byte offsets (each a line start)
        self.complete_lines = 0  # lines ended by a newline in [0, scanned)
        self.scanned = 0  # bytes indexed so far
        self.tail_start = 0  # offset where the last (maybe unterminated) line starts

    @property
    def line_count(self) -> int:
        """Lines to show: complete lines, plus an unterminated last line if there is one."""
        return self.complete_lines + (1 if self.scanned > self.tail_start else 0)

    def scan(self, limit: int | None = None, max_bytes: int | None = None) -> ScanResult:
        """Read bytes appended since the last apply (thread-safe: reads the index only)."""
        start = self.scanned
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return ScanResult(start, start)
        lim = limit if limit is not None else self.limit
        if lim is not None:
            size = min(size, lim)
        if size < start:  # truncated (the engine drops unconfirmed mirror bytes): start over
            return ScanResult(start, 0, reset=True)
        if max_bytes is not None:
            size = min(size, start + max_bytes)
        res = ScanResult(start, start)
        if size == start:
            return res
        with open(self.path, "rb") as f:
            f.seek(start)
            pos = start
            while pos < size:
                data = f.read(min(self.block, size - pos))
                if not data:
                    break
                n = data.count(b"\n")
                if n:
                    res.newlines += n
                    res.tail_start = pos + data.rfind(b"\n") + 1
                    res.checkpoints.append((res.newlines, res.tail_start))
                pos += len(data)
        res.end = pos
        return res

    def apply(self, res: ScanResult) -> bool:
        """Add a scan's findings; False when nothing changed (or the scan was stale)."""
        if res.reset:
            self._reset()
            return True
        if res.start != self.scanned or res.end == res.start:
            return False
        base = self.complete_lines
        for rel, off in res.checkpoints:
            self._offsets.append(off)  # offsets first: a reader bisecting _lines finds both
            self._lines.append(base + rel)
        self.complete_lines += res.newlines
        if res.tail_start is not None:
            self.tail_start = res.tail_start
        self.scanned = res.end
        return True

    def update(self, limit: int | None = None) -> bool:
        """Scan and apply in one go (tests, small files)."""
        if limit is not None:
            self.limit = limit
        changed = False
        while True:
            res = self.scan()
            if not self.apply(res):
                return changed
            changed = True
            if res.reset:
                continue
            return True

    def read_lines(self, start: int, count: int) -> list[str]:
        """Lines [start, start+count) as text (newline stripped, undecodable bytes replaced)."""
        return [text for _, text in self.read_lines_at(start, count)]

    def read_lines_at(self, start: int, count: int) -> list[tuple[int, str]]:
        """Lines [start, start+count) as (byte offset of the line's start, text)."""
        start = max(0, start)
        end = min(self.line_count, start + count)
        if end <= start:
            return []
        i = bisect.bisect_right(self._lines, start) - 1
        line_no, offset = self._lines[i], self._offsets[i]
        scanned = self.scanned
        out: list[tuple[int, str]] = []
        with open(self.path, "rb") as f:
            f.seek(offset)
            pending = b""
            at = offset  # where `pending` starts
            remaining = scanned - offset
            while remaining > 0 and line_no < end:
                data = f.read(min(self.block, remaining))
                if not data:
                    break
                remaining -= len(data)
                parts = (pending + data).split(b"\n")
                pending = parts.pop()
                for raw in parts:
                    if line_no >= start:
                        out.append((at, _text(raw)))
                    at += len(raw) + 1
                    line_no += 1
                    if line_no >= end:
                        break
            if line_no < end and pending:
                out.append((at, _text(pending)))
        return out


def _text(raw: bytes) -> str:
    return clean(raw.decode("utf-8", "replace")).expandtabs(8)
