"""Streaming secret redaction: correct however the stream is chunked and however long its lines.

Each secret is replaced by `***`. The redactor holds back the longest tail of what it has seen
that could still become a secret when more bytes arrive, so a secret split across chunks is
caught; nothing is held back that cannot be part of a secret. Stdlib only (the agent uses it).
"""

from __future__ import annotations

from collections.abc import Iterable

MASK = b"***"


class StreamRedactor:
    def __init__(self, secrets: Iterable[bytes | str]) -> None:
        raw = {s.encode() if isinstance(s, str) else bytes(s) for s in secrets}
        self.secrets = sorted((s for s in raw if s), key=len, reverse=True)
        self._pending = b""

    def _replace(self, buf: bytes) -> bytes:
        for s in self.secrets:
            buf = buf.replace(s, MASK)
        return buf

    def _held(self, buf: bytes) -> int:
        """Length of the longest suffix of buf that is a proper prefix of some secret."""
        best = 0
        for s in self.secrets:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best

    def feed(self, data: bytes) -> bytes:
        if not self.secrets:
            return data
        buf = self._replace(self._pending + data)
        keep = self._held(buf)
        self._pending = buf[len(buf) - keep :] if keep else b""
        return buf[: len(buf) - keep]

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return self._replace(rest)

    @property
    def pending(self) -> int:
        """Bytes seen but not yet handed out (they may be the start of a secret)."""
        return len(self._pending)
