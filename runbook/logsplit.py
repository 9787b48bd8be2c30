"""Split a job's byte stream into lines and pick out `@@eagle3 {...}` progress/metric records."""

from __future__ import annotations

from typing import Any

from remote_agent.progress import PREFIX, parse

_PREFIX = PREFIX.encode()


class LineSplitter:
    def __init__(self, max_partial: int = 1 << 20) -> None:
        self._partial = b""
        self.max_partial = max_partial

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._partial + data
        lines = buf.split(b"\n")
        self._partial = lines.pop()
        if (
            len(self._partial) > self.max_partial
        ):  # a giant line: hand it out rather than grow forever
            lines.append(self._partial)
            self._partial = b""
        return lines

    def flush(self) -> list[bytes]:
        rest, self._partial = self._partial, b""
        return [rest] if rest else []


def parse_record(line: bytes) -> dict[str, Any] | None:
    """The progress/metrics record a job printed on this line (the progress contract, remote_agent/progress.py)."""
    if not line.startswith(_PREFIX):
        return None
    return parse(line.decode("utf-8", "replace"))
