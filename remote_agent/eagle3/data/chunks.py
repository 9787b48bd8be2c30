"""Split big JSONL files into line-aligned chunks for worker processes, keeping file order.

The parent reads each file once, sequentially: it hashes it (sha256) and cuts chunks at line
ends, counting lines so that every chunk knows its first line number (errors stay `file:line`).
Workers re-read their chunk (from the page cache) and do the per-record work; results come back
in chunk order, so every decision that depends on order (first duplicate wins, first
discrepancy) is made by the parent exactly as a sequential pass would.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BLOCK = 1 << 23  # read size of the parent's scan


@dataclass(frozen=True)
class Chunk:
    start: int  # byte offset of its first line
    end: int  # byte offset after its last line
    first_line: int  # 1-based line number of its first line
    lines: int  # lines in it (the last one may lack a newline)


class ChunkScanner:
    """Iterate the chunks of `path`; afterwards `sha256` and `size` describe the whole file."""

    def __init__(self, path: Path, chunk_bytes: int) -> None:
        self.path = Path(path)
        self.chunk_bytes = max(int(chunk_bytes), 1)
        self.sha256: str | None = None
        self.size = 0

    def __iter__(self) -> Iterator[Chunk]:
        sha = hashlib.sha256()
        start, first, pending, pos = 0, 1, 0, 0
        last = b"\n"
        with open(self.path, "rb", buffering=0) as f:
            while block := f.read(min(BLOCK, self.chunk_bytes)):
                sha.update(block)
                base, pos = pos, pos + len(block)
                last = block[-1:]
                if pos - start >= self.chunk_bytes:
                    cut = block.rfind(b"\n")
                    if cut >= 0:
                        n = pending + block.count(b"\n", 0, cut + 1)
                        yield Chunk(start, base + cut + 1, first, n)
                        start, first = base + cut + 1, first + n
                        pending = block.count(b"\n", cut + 1)
                        continue
                pending += block.count(b"\n")
        if pos > start:
            yield Chunk(start, pos, first, pending + (last != b"\n"))
        self.sha256, self.size = sha.hexdigest(), pos


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(BLOCK):
            h.update(block)
    return h.hexdigest()


def chunk_lines(path: Path, chunk: Chunk) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset, line) for every line of the chunk, blank ones included."""
    with open(path, "rb", buffering=1 << 20) as f:
        f.seek(chunk.start)
        offset = chunk.start
        for lineno in range(chunk.first_line, chunk.first_line + chunk.lines):
            raw = f.readline()
            yield lineno, offset, raw
            offset += len(raw)


def default_workers() -> int:
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(8, n or 1))


def plan(total_bytes: int, workers: int) -> tuple[int, int]:
    """(workers, chunk bytes): chunks small enough to keep every worker busy, large enough that
    per-task overhead is noise; no worker processes at all for an input of one chunk.
    EAGLE3_CHUNK_BYTES overrides the chunk size (tests use it to get many chunks)."""
    override = os.environ.get("EAGLE3_CHUNK_BYTES")
    if override:
        chunk = max(1, int(override))
    else:
        chunk = max(1 << 20, min(32 << 20, total_bytes // max(workers * 8, 1) + 1))
    chunks = max(1, -(-total_bytes // chunk))
    return max(1, min(workers, chunks)), chunk


def ordered_map(
    fn: Callable[[Any], Any],
    tasks: Iterable[Any],
    workers: int,
    initializer: Callable[..., None],
    initargs: tuple[Any, ...],
) -> Iterator[Any]:
    """fn over tasks, results in task order; in-process when workers <= 1.

    Worker processes are spawned (not forked): safe whatever threads the parent has, and the
    same on every platform. Exceptions raised by fn (BadInput, ...) re-raise in the parent."""
    if workers <= 1:
        initializer(*initargs)
        yield from map(fn, tasks)
        return
    import multiprocessing

    pool = multiprocessing.get_context("spawn").Pool(workers, initializer, initargs)
    try:
        yield from pool.imap(fn, tasks)
        pool.close()
        pool.join()
    finally:
        pool.terminate()
