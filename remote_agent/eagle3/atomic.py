"""The payload's write-then-rename outputs (one home: remote_agent/wire/atomic_write.py) and
HashingSink."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from remote_agent.wire.atomic_write import (
    AtomicWriter,
    atomic_path,
    fsync_dir,
    temp_path,
    write_atomic,
)

__all__ = [
    "AtomicWriter",
    "HashingSink",
    "atomic_path",
    "fsync_dir",
    "temp_name",
    "write_atomic",
    "write_bytes_atomic",
]

temp_name = temp_path  # the names the payload (and drafter/train/) already call


def write_bytes_atomic(path: Path, data: bytes) -> None:
    write_atomic(path, data)


class HashingSink:
    """Writes byte strings to a file and hashes them (sha256) on a helper thread, in batches.

    Both file writes and hashlib release the GIL, so the caller's Python work overlaps with
    them; batching keeps per-call overhead out of the per-record loop."""

    def __init__(self, f: BinaryIO, batch_bytes: int = 8 << 20) -> None:
        import hashlib
        import queue
        import threading

        self.f = f
        self.sha = hashlib.sha256()
        self.batch_bytes = batch_bytes
        self._buf = bytearray()  # a copy: holds no reference to the caller's buffers
        self._queue: queue.Queue[bytearray | None] = queue.Queue(maxsize=4)  # bounded memory
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, name="hashing-sink", daemon=True)
        self._thread.start()

    def __enter__(self) -> HashingSink:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._thread.is_alive():  # an error in the caller: stop the helper, drop the rest
            self._buf = bytearray()
            self._queue.put(None)
            self._thread.join()

    def write(self, data: bytes | memoryview) -> None:
        self._buf += data
        if len(self._buf) >= self.batch_bytes:
            self._flush_batch()

    def close(self) -> str:
        """Flush everything; the sha256 (hex) of all bytes written."""
        self._flush_batch()
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.sha.hexdigest()

    def _flush_batch(self) -> None:
        if self._buf:
            if self._error is not None:
                raise self._error
            self._queue.put(self._buf)
            self._buf = bytearray()

    def _drain(self) -> None:
        while (block := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self.f.write(block)
                    self.sha.update(block)
                except BaseException as exc:  # re-raised in the caller's thread
                    self._error = exc
