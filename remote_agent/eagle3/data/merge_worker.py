"""Merge pass 1, per chunk (runs in worker processes): validate, truncate, key, spill.

For each record the worker returns a small tuple to the parent (which alone decides duplicates,
id clashes and caps, in input order) and writes the finished output line, keyed by its shuffle
key, to its own bucket files. Records are never sent through the pipe: only their metadata.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from remote_agent.eagle3.data.chunks import Chunk, chunk_lines
from remote_agent.eagle3.data.manifest import shuffle_key
from remote_agent.eagle3.data.records import RawRecord, parse_raw
from remote_agent.eagle3.data.shuffle import BucketWriter

# source index, line number, n_tokens, n_trainable, id length, truncated, line digest
PAYLOAD = struct.Struct("<HIIIIBI")


@dataclass(frozen=True)
class MergeOptions:
    workdir: str
    n_buckets: int
    buffer_bytes: int
    seed: int
    max_len: int | None
    vocab: int | None
    prefix_ids: bool


_OPTS: MergeOptions | None = None
_WRITER: BucketWriter | None = None


def init(opts: MergeOptions) -> None:
    global _OPTS, _WRITER
    _OPTS, _WRITER = opts, None


def _writer() -> BucketWriter:
    global _WRITER
    if _WRITER is None:
        assert _OPTS is not None
        _WRITER = BucketWriter(
            Path(_OPTS.workdir), f"w{os.getpid()}", _OPTS.n_buckets, _OPTS.buffer_bytes
        )
    return _WRITER


# Per record: (line, content digest, id or None when nothing is left to train, key, truncated)
Meta = tuple[int, bytes, "str | None", int, bool]


def scan(task: tuple[int, str, str, Chunk]) -> tuple[int, list[Meta], int]:
    """One chunk of one source -> (source index, per-record metadata, bytes read)."""
    si, name, path_s, chunk = task
    opts = _OPTS
    assert opts is not None
    path = Path(path_s)
    writer = _writer()
    metas: list[Meta] = []
    max_len = opts.max_len
    for lineno, _off, raw in chunk_lines(path, chunk):
        if not raw.strip():
            continue
        rec = parse_raw(raw, path, lineno, opts.vocab, default_source=name)
        digest = hashlib.sha256(rec.ids_text).digest()[:16]  # sha256 is hardware-accelerated
        truncated = max_len is not None and rec.n_tokens > max_len
        if max_len is not None and truncated:
            rec = rec.truncated(max_len)
        if rec.n_trainable == 0:
            metas.append((lineno, digest, None, 0, truncated))
            continue
        rid = f"{name}/{rec.id}" if opts.prefix_ids else rec.id
        key = shuffle_key(opts.seed, name, rid)
        line = RawRecord(rid, name, rec.ids_text, rec.mask_text, 0, 0).line()
        rid_bytes = rid.encode("utf-8", "surrogatepass")
        head = PAYLOAD.pack(
            si,
            lineno,
            rec.n_tokens,
            rec.n_trainable,
            len(rid_bytes),
            truncated,
            zlib.crc32(line),
        )
        writer.add(key, head + rid_bytes + line)
        metas.append((lineno, digest, rid, key, truncated))
    writer.flush()  # the parent reads the buckets once every task has returned
    return si, metas, chunk.end - chunk.start
