"""Write-then-rename: a reader (or a crash) sees the old file or the complete new one, never a part.

The one place for it (stdlib only: the agent core, the engine and the ML payload all import it;
`eagle3/dense.py` ships alone into SGLang and keeps its own copy). The temp file is a hidden,
uniquely named sibling (same filesystem, so the rename is atomic; unique, so two writers never
share one), fsynced before the rename, and the directory is fsynced after it so the rename
itself survives a power cut.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

TEMP_MARK = ".tmp-"  # every temp name holds it: sweepers and readers skip such names


def temp_path(path: Path) -> Path:
    """A hidden sibling no other writer (process or thread) picks."""
    path = Path(path)
    return path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


def fsync_dir(directory: Path) -> None:
    """Persist a rename in `directory` (best effort: some filesystems refuse a dir fsync)."""
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


def _fsync_tree(path: Path) -> None:
    if path.is_dir():
        for child in path.iterdir():
            _fsync_tree(child)
        fsync_dir(path)
    else:
        with open(path, "rb") as f:
            os.fsync(f.fileno())


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """`with atomic_path(p) as tmp:` write a file *or a directory* at `tmp` by any means (a library
    that takes a path); on success it is fsynced and renamed to `p`, on error removed.

    POSIX cannot rename over a non-empty directory, so an existing directory `p` is first
    renamed aside (itself atomic), then deleted: a crash between the two renames leaves no `p`,
    never a partial one (deleting `p` in place would, if killed midway)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        yield tmp
        _fsync_tree(tmp)
        old = None
        if tmp.is_dir() and path.is_dir():
            old = temp_path(path)
            os.replace(path, old)
        os.replace(tmp, path)
        fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


class AtomicWriter:
    """`with AtomicWriter(path) as f: f.write(b"...")`: fsync + rename on success, unlink on error.

    `mode` sets the file's permission bits exactly (umask aside); None leaves open()'s default."""

    def __init__(self, path: Path, *, mode: int | None = None, buffering: int = 1 << 20) -> None:
        self.path = Path(path)
        self.tmp = temp_path(self.path)
        self.mode = mode
        self.buffering = buffering
        self.file: BinaryIO | None = None

    def __enter__(self) -> BinaryIO:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            if self.mode is not None:
                os.fchmod(fd, self.mode)
            self.file = open(fd, "wb", buffering=self.buffering)
        except BaseException:
            os.close(fd)
            self.tmp.unlink(missing_ok=True)
            raise
        return self.file

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self.file is not None
        try:
            if exc_type is None:
                self.file.flush()
                os.fsync(self.file.fileno())
                self.file.close()
                os.replace(self.tmp, self.path)
                fsync_dir(self.path.parent)
        finally:
            self.file.close()
            self.tmp.unlink(missing_ok=True)


def write_atomic(path: Path, data: bytes | str, *, mode: int | None = None) -> None:
    """Replace `path` with `data` (str is written as UTF-8) atomically and durably."""
    with AtomicWriter(path, mode=mode) as f:
        f.write(data.encode() if isinstance(data, str) else data)
