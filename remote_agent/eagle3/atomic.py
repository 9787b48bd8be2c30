"""Write-then-rename outputs: a reader sees the old file or the complete new one, never a part."""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import BinaryIO


def temp_name(path: Path) -> Path:
    """Hidden sibling in the same directory, so os.replace is atomic (same filesystem)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AtomicWriter:
    """`with AtomicWriter(path) as f: f.write(b"...")` -> fsync + rename on success, unlink on error."""

    def __init__(self, path: Path, buffering: int = 1 << 20) -> None:
        self.path = Path(path)
        self.tmp = temp_name(self.path)
        self.buffering = buffering
        self.file: BinaryIO | None = None

    def __enter__(self) -> BinaryIO:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.tmp, "wb", buffering=self.buffering)
        return self.file

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self.file is not None
        if exc_type is None:
            try:
                self.file.flush()
                os.fsync(self.file.fileno())
                self.file.close()
                os.replace(self.tmp, self.path)
                fsync_dir(self.path.parent)
                return
            except BaseException:
                self.tmp.unlink(missing_ok=True)
                raise
        self.file.close()
        self.tmp.unlink(missing_ok=True)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    with AtomicWriter(path) as f:
        f.write(data)


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
