"""Verify, per chunk (runs in worker processes): every line checked in file order.

A worker stops at the first discrepancy of its chunk and reports it with its line number; the
parent reports the earliest one over all chunks (and the key order across chunk boundaries), so
the message is the one a sequential pass would give.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote_agent.eagle3.data.chunks import Chunk, chunk_lines
from remote_agent.eagle3.data.manifest import hist_bound, shuffle_key
from remote_agent.eagle3.data.records import line_digest, parse_raw
from remote_agent.eagle3.errors import BadInput


@dataclass(frozen=True)
class VerifyOptions:
    data: str
    index_name: str
    index_total: int | None  # records in the index; None when there is no index
    seed: int
    max_len: int | None
    sources: frozenset[str]
    dropped: frozenset[str]
    vocab: int | None


@dataclass
class ChunkReport:
    lines: int = 0
    nbytes: int = 0
    bad: tuple[int, str] | None = None  # (line, message) of the chunk's first discrepancy
    first_key: int | None = None
    last_key: int = -1
    first_id: str = ""
    counts: dict[str, list[int]] = field(default_factory=dict)  # source -> [records, tok, train]
    histogram: dict[int, int] = field(default_factory=dict)


_OPTS: VerifyOptions | None = None


def init(opts: VerifyOptions) -> None:
    global _OPTS
    _OPTS = opts


class _Bad(Exception):
    pass


def check(task: tuple[Chunk, list[list[Any]] | None]) -> ChunkReport:
    chunk, index = task
    o = _OPTS
    assert o is not None
    path = Path(o.data)
    report = ChunkReport(nbytes=chunk.end - chunk.start)
    prev_key = -1
    for lineno, offset, raw in chunk_lines(path, chunk):
        try:
            key = _check_line(
                o, path, lineno, offset, raw, index, chunk.first_line, prev_key, report
            )
        except _Bad as exc:
            report.bad = (lineno, str(exc))
            return report
        if report.first_key is None:
            report.first_key = key
        prev_key = report.last_key = key
        report.lines += 1
    return report


def _check_line(
    o: VerifyOptions,
    path: Path,
    lineno: int,
    offset: int,
    raw: bytes,
    index: list[list[Any]] | None,
    first_line: int,
    prev_key: int,
    report: ChunkReport,
) -> int:
    where = f"{path}:{lineno}"
    if not raw.strip():
        raise _Bad(f"{where}: blank line")
    try:
        rec = parse_raw(raw, path, lineno, o.vocab)
    except BadInput as exc:
        raise _Bad(str(exc)) from None
    rid = f"record {rec.id!r}"
    canonical = rec.line()
    if canonical != raw:
        if not raw.endswith(b"\n") and canonical[:-1] == raw:
            raise _Bad(f"{where}: {rid} has no final newline (file truncated?)")
        raise _Bad(f"{where}: {rid} is not in the canonical form merge writes")
    if index is not None:
        k = lineno - first_line
        if k >= len(index):
            raise _Bad(
                f"{where}: {rid} is beyond the {o.index_total} records of {o.index_name} (line added)"
            )
        e = index[k]
        if e[0] != rec.id:
            raise _Bad(
                f"{where}: id {rec.id!r} but {o.index_name} has {e[0]!r} here "
                "(a line was dropped, inserted or moved, or the id edited)"
            )
        if e[1] != offset:
            raise _Bad(
                f"{where}: {rid} starts at byte {offset}, {o.index_name} says {e[1]} (an earlier line changed)"
            )
        if e[2] != rec.n_tokens:
            raise _Bad(f"{where}: {rid} has {rec.n_tokens} tokens, {o.index_name} says {e[2]}")
        if e[3] != rec.n_trainable:
            raise _Bad(
                f"{where}: {rid} has {rec.n_trainable} trainable tokens, {o.index_name} says {e[3]} "
                "(loss_mask edited)"
            )
        if len(e) > 4 and e[4] != line_digest(raw):
            raise _Bad(
                f"{where}: {rid} differs from its digest in {o.index_name} (input_ids edited)"
            )
    if rec.source not in o.sources or rec.source in o.dropped:
        how = "dropped" if rec.source in o.dropped else "does not list"
        raise _Bad(f"{where}: {rid} is from source {rec.source!r}, which the manifest {how}")
    if rec.n_trainable == 0:
        raise _Bad(f"{where}: {rid} has no trainable token (merge drops those)")
    if o.max_len is not None and rec.n_tokens > o.max_len:
        raise _Bad(f"{where}: {rid} has {rec.n_tokens} tokens, above max_len {o.max_len}")
    key = shuffle_key(o.seed, rec.source, rec.id)
    if key <= prev_key:
        raise _Bad(order_message(where, rid, key == prev_key, o.seed))
    if report.first_key is None:
        report.first_id = rec.id
    c = report.counts.setdefault(rec.source, [0, 0, 0])
    c[0] += 1
    c[1] += rec.n_tokens
    c[2] += rec.n_trainable
    bound = hist_bound(rec.n_tokens)
    report.histogram[bound] = report.histogram.get(bound, 0) + 1
    return key


def order_message(where: str, rid: str, equal: bool, seed: int) -> str:
    what = (
        "a duplicate of the previous record"
        if equal
        else f"out of the shuffle order of seed {seed}"
    )
    return f"{where}: {rid} is {what} (lines moved or duplicated, or the manifest's seed changed)"
