"""The live log pane's data path, kept free of widgets so it can be tested and benchmarked.

`LogFeed` turns text chunks into complete lines and holds them until the next flush (the pane
flushes every 100 ms into `Log.write_lines`: per-line writes manage ~1k lines/s, batches ~60k).
A flush writes at most `max_batch` lines: under a flood the oldest lines of a batch would scroll
past within the same frame anyway, so they are skipped and a marker line says how many (the
full-log viewer has every line). Nothing is skipped silently.

`read_tail` rebuilds the pane from the on-disk mirror (reattach, or selecting another step).
"""

from __future__ import annotations

import os
from collections import deque
from pathlib import Path

from runbook.escape import log_line as clean  # CR semantics, then the one terminal sanitizer
from runbook.logsplit import LineClip


class LogFeed:
    def __init__(self, max_batch: int) -> None:
        self.max_batch = max_batch
        self.pending: deque[str] = deque(maxlen=max_batch)
        self.clip = LineClip()  # the line in progress: at most LINE_LIMIT characters kept
        self.total_lines = 0  # complete lines fed since the last reset (for tests and the bench)
        self.dropped = 0  # lines skipped under a flood since the last reset
        self._skipped = 0  # ... in the batch now pending

    def reset(self) -> None:
        self.pending.clear()
        self.clip = LineClip()
        self.total_lines = self.dropped = self._skipped = 0

    def feed(self, text: str) -> None:
        if not text:
            return
        lines = self.clip.feed(text)
        if not lines:
            return
        n = len(lines)
        self.total_lines += n
        over = max(0, len(self.pending) + n - self.max_batch)
        self.dropped += over
        self._skipped += over
        if n > self.max_batch:
            lines = lines[-self.max_batch :]
        self.pending.extend(clean(x) for x in lines)

    @property
    def partial(self) -> str:
        return self.clip.partial

    @partial.setter
    def partial(self, text: str) -> None:
        self.clip.set_partial(text)

    def flush_partial(self) -> None:
        """The job ended: its last line had no newline; show it anyway."""
        rest = self.clip.flush()
        if rest:
            self.pending.append(clean(rest))

    def take(self) -> list[str]:
        out = list(self.pending)
        self.pending.clear()
        if self._skipped:
            out.insert(
                0,
                f"⋯ {self._skipped:,} lines skipped at this rate; the full log (l) has every line ⋯",
            )
            self._skipped = 0
        return out


def read_tail(
    path: Path | str, end: int, max_lines: int, block: int = 1 << 16, max_bytes: int = 16 << 20
) -> tuple[list[str], str]:
    """The last `max_lines` complete lines of the file's first `end` bytes, and the partial line
    after them (bytes after `end` are not ours yet: the engine has not confirmed them)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return [], ""
    end = min(end, size)
    if end <= 0:
        return [], ""
    chunks: list[bytes] = []
    newlines = 0
    pos = end
    with open(path, "rb") as f:
        while pos > 0 and newlines <= max_lines and end - pos < max_bytes:
            n = min(block, pos)
            pos -= n
            f.seek(pos)
            data = f.read(n)
            chunks.append(data)
            newlines += data.count(b"\n")
    buf = b"".join(reversed(chunks))
    parts = buf.split(b"\n")
    partial = parts.pop()
    if pos > 0 and parts:  # the first piece may be the cut-off end of an older line
        parts = parts[1:]
    lines = [_shown(p) for p in parts[-max_lines:]] if max_lines else []
    return lines, partial.decode("utf-8", "replace")  # raw: the feed bounds and escapes it


def _shown(line: bytes) -> str:
    """A mirrored line as the pane shows it: bounded like a live one, then sanitized."""
    clip = LineClip()
    clip.set_partial(line.decode("utf-8", "replace"))
    return clean(clip.flush() or "")
