"""External sort of (64-bit key, payload) items with bounded memory: the merge's shuffle.

Keys are pseudo-random (a keyed hash), so sorting by key is a seeded shuffle. Writers (one per
process) spread items over bucket files by the top bits of the key, so bucket b holds one
contiguous key range and reading buckets in turn, each sorted, yields the global order. A bucket
larger than half the memory budget (skewed lengths, a bad size estimate) is split again over its
own key range, recursively, so at most about budget/2 of payload is ever loaded at once,
whatever the input size. Equal keys (practically never) are ordered by payload, so the output
never depends on which process wrote what.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

_HEAD = struct.Struct("<QI")  # key, payload length
MAX_BUCKETS = 256  # open files per writer stay well below the usual 1024 limit


def bucket_count(total_bytes: int, budget_bytes: int) -> int:
    per_bucket = max(budget_bytes // 2, 1)
    return max(1, min(MAX_BUCKETS, -(-int(total_bytes * 1.1) // per_bucket)))


def _bucket_name(tag: str, i: int) -> str:
    return f"{tag}-b{i:04d}"


class BucketWriter:
    """Appends items to this writer's own bucket files (`<tag>-bNNNN`) in `workdir`."""

    def __init__(self, workdir: Path, tag: str, n_buckets: int, buffer_bytes: int) -> None:
        self.workdir, self.tag, self.n = Path(workdir), tag, n_buckets
        self.buffer = max(1 << 12, min(1 << 20, buffer_bytes))
        self._files: dict[int, BinaryIO] = {}

    def add(self, key: int, payload: bytes) -> None:
        b = (key * self.n) >> 64
        f = self._files.get(b)
        if f is None:
            f = self._files[b] = open(
                self.workdir / _bucket_name(self.tag, b), "ab", buffering=self.buffer
            )
        f.write(_HEAD.pack(key, len(payload)))
        f.write(payload)

    def flush(self) -> None:
        for f in self._files.values():
            f.flush()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


class BucketReader:
    """Every item of every writer in (key, payload) order; deletes bucket files as it goes."""

    def __init__(self, workdir: Path, n_buckets: int, budget_bytes: int) -> None:
        self.workdir, self.n = Path(workdir), n_buckets
        self.budget = max(int(budget_bytes), 1 << 16)
        self.largest_load = 0  # bytes of the largest bucket held in memory (tests assert on it)
        self.splits = 0

    def __iter__(self) -> Iterator[tuple[int, memoryview]]:
        for i in range(self.n):
            files = sorted(self.workdir.glob(f"*-b{i:04d}"))
            lo, hi = (i << 64) // self.n, ((i + 1) << 64) // self.n
            yield from self._drain(files, lo, hi, f"s{i:04d}", depth=0)

    def _drain(
        self, files: list[Path], lo: int, hi: int, name: str, depth: int
    ) -> Iterator[tuple[int, memoryview]]:
        size = sum(p.stat().st_size for p in files)
        if size > self.budget // 2 and hi - lo > 1 and depth < 8:
            yield from self._split(files, lo, hi, size, name, depth)
            return
        chunks = []
        for p in files:
            chunks.append(p.read_bytes())
            p.unlink()
        self.largest_load = max(self.largest_load, size)
        entries = []
        for c, data in enumerate(chunks):
            pos = 0
            while pos < len(data):
                key, n = _HEAD.unpack_from(data, pos)
                pos += _HEAD.size
                entries.append((key, c, pos, n))
                pos += n
        entries.sort(key=lambda e: e[0])
        views = [memoryview(c) for c in chunks]
        i = 0
        while i < len(entries):
            j = i + 1
            while j < len(entries) and entries[j][0] == entries[i][0]:
                j += 1
            run = entries[i:j]
            if len(run) > 1:
                run.sort(key=lambda e: chunks[e[1]][e[2] : e[2] + e[3]])
            for key, c, off, n in run:
                yield key, views[c][off : off + n]  # zero-copy slices of the loaded bucket
            i = j

    def _split(
        self, files: list[Path], lo: int, hi: int, size: int, name: str, depth: int
    ) -> Iterator[tuple[int, memoryview]]:
        self.splits += 1
        parts = min(bucket_count(size, self.budget) * 2, MAX_BUCKETS)
        span = hi - lo
        subs = [self.workdir / f"{name}.{j:03d}-x" for j in range(parts)]
        outs = [open(p, "wb", buffering=1 << 16) for p in subs]
        try:
            for p in files:
                with open(p, "rb", buffering=1 << 20) as f:
                    while head := f.read(_HEAD.size):
                        key, n = _HEAD.unpack(head)
                        j = min(((key - lo) * parts) // span, parts - 1)
                        outs[j].write(head + f.read(n))
                p.unlink()
        finally:
            for o in outs:
                o.close()
        for j, p in enumerate(subs):
            yield from self._drain(
                [p],
                lo + (span * j) // parts,
                lo + (span * (j + 1)) // parts,
                f"{name}.{j:03d}",
                depth + 1,
            )
