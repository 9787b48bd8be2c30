"""`eagle3 verify OUT.jsonl`: does the merged file match its manifest? The guard before deletion.

Exit 0 only when everything matches; exit 1 naming the first discrepancy; exit 2 when the check
cannot be made (manifest or data missing or unreadable, manifest malformed, bad flags).

Checks, in file order for each line, then for the whole file:
- every line is a well-formed record in canonical form (ids within the vocabulary with
  --tokenizer/--vocab-size), trains something, fits max_len, and comes
  from a source the manifest lists and did not drop;
- against OUT.index.json (when present): same id, byte offset, lengths and content digest, which
  names the exact line of a dropped, inserted, moved or edited record;
- strictly ascending shuffle keys for the manifest's seed (reordering, duplication, changed seed);
- totals, per-source counts, length histogram, sha256, and the manifest's own checksum.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput, Failed

HELP = "check a merged JSONL against its manifest (exit 0 only when it matches)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data", type=Path, metavar="OUT.jsonl", help="merged file")
    parser.add_argument("--manifest", type=Path, help="manifest (default OUT.manifest.json)")
    parser.add_argument(
        "--workers", type=int, help="checking processes (default: CPUs available, at most 8)"
    )
    vocab = parser.add_mutually_exclusive_group()
    vocab.add_argument("--tokenizer", type=Path, help="also check ids are in this vocabulary")
    vocab.add_argument("--vocab-size", type=int, help="also check ids are below this")


class Discrepancy(Failed):
    pass


def _load_index(data: Path) -> list[list[Any]] | None:
    from remote_agent.eagle3.data.records import index_path

    path = index_path(data)
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_bytes())
        records = obj["records"]
        if not isinstance(records, list) or not all(map(_entry_ok, records)):
            raise TypeError
    except (ValueError, KeyError, TypeError, RecursionError):
        raise Discrepancy(f"{path}: index is not valid (rebuild it with eagle3 merge)") from None
    return records


def _entry_ok(e: Any) -> bool:
    """[id, offset, n_tokens, n_trainable(, line_crc32)] with the right types."""
    return (
        isinstance(e, list)
        and len(e) in (4, 5)
        and isinstance(e[0], str)
        and all(type(v) is int for v in e[1:4])
        and (len(e) == 4 or isinstance(e[4], str))
    )


def verify(data: Path, manifest_file: Path, vocab: int | None, workers: int = 1) -> dict[str, Any]:
    """Raise Discrepancy (exit 1) at the first mismatch; return the summary otherwise."""
    from remote_agent.eagle3.data import verify_worker as vw
    from remote_agent.eagle3.data.chunks import ChunkScanner, ordered_map, plan
    from remote_agent.eagle3.data.manifest import (
        FORMAT,
        VERSION,
        histogram_json,
        load_manifest,
        self_sha256,
    )
    from remote_agent.eagle3.data.records import index_path
    from remote_agent.eagle3.progress import Progress

    manifest = load_manifest(manifest_file)
    if not data.is_file():
        raise BadInput(f"{data}: no such file")
    if manifest["format"] != FORMAT or manifest["version"] != VERSION:
        raise Discrepancy(
            f"{manifest_file}: format {manifest['format']!r} version {manifest['version']!r}, "
            f"expected {FORMAT!r} version {VERSION}"
        )
    if manifest["file"] != data.name:
        raise Discrepancy(
            f"{manifest_file}: manifest describes {manifest['file']!r}, not {data.name!r}"
        )
    index = _load_index(data)
    ipath = index_path(data)
    opts = vw.VerifyOptions(
        str(data),
        ipath.name,
        None if index is None else len(index),
        manifest["seed"],
        manifest["max_len"],
        frozenset(manifest["sources"]),
        frozenset(manifest["dropped_sources"]),
        vocab,
    )
    size = data.stat().st_size
    workers, chunk_bytes = plan(size, workers)
    scanner = ChunkScanner(data, chunk_bytes)

    def tasks():
        for chunk in scanner:
            part = None
            if index is not None:
                part = index[chunk.first_line - 1 : chunk.first_line - 1 + chunk.lines]
            yield chunk, part

    counts: dict[str, list[int]] = {}
    histogram: dict[int, int] = {}
    prev_key = -1
    line = 0
    progress = Progress("verify", size, "bytes")
    for report in ordered_map(vw.check, tasks(), workers, vw.init, (opts,)):
        first = line + 1
        if report.bad is not None and report.bad[0] == first:
            raise Discrepancy(report.bad[1])
        if report.first_key is not None and report.first_key <= prev_key:
            rid = f"record {report.first_id!r}"
            raise Discrepancy(
                vw.order_message(f"{data}:{first}", rid, report.first_key == prev_key, opts.seed)
            )
        if report.bad is not None:
            raise Discrepancy(report.bad[1])
        line += report.lines
        prev_key = report.last_key
        for src, c in report.counts.items():
            total = counts.setdefault(src, [0, 0, 0])
            for k in range(3):
                total[k] += c[k]
        for bound, n in report.histogram.items():
            histogram[bound] = histogram.get(bound, 0) + n
        progress.advance(report.nbytes)
    progress.finish()

    records = sum(c[0] for c in counts.values())
    if index is not None and len(index) > records:
        raise Discrepancy(
            f"{data}: ends after {records} records, {ipath.name} lists {len(index)} "
            f"(file truncated; next expected id {index[records][0]!r})"
        )
    totals = {
        "records": records,
        "tokens": sum(c[1] for c in counts.values()),
        "trainable_tokens": sum(c[2] for c in counts.values()),
    }
    for name, value in totals.items():
        if manifest[name] != value:
            raise Discrepancy(f"{manifest_file}: {name} is {manifest[name]}, the file has {value}")
    for name, st in sorted(manifest["sources"].items()):
        have = counts.get(name, [0, 0, 0])
        for k, fld in enumerate(("records", "tokens", "trainable_tokens")):
            if st[fld] != have[k]:
                raise Discrepancy(
                    f"{manifest_file}: sources.{name}.{fld} is {st[fld]}, the file has {have[k]}"
                )
    if manifest["length_histogram"] != histogram_json(histogram):
        raise Discrepancy(f"{manifest_file}: length_histogram does not match the file's lengths")
    digest = scanner.sha256
    if manifest["sha256"] != digest:
        raise Discrepancy(
            f"{manifest_file}: sha256 is {manifest['sha256'][:16]}..., the file's is "
            f"{str(digest)[:16]}... (content changed)"
        )
    if manifest["self_sha256"] != self_sha256(manifest):
        raise Discrepancy(
            f"{manifest_file}: fields were edited after the merge (self_sha256 does not match); the "
            "data-derived fields agree, so one of sources.*.sha256/dropped_duplicates/truncated/"
            "capped/dropped_untrainable, dropped_sources, created_at or tool_version changed"
        )
    return {
        "records": records,
        **{k: v for k, v in totals.items() if k != "records"},
        "sha256": digest,
    }


def run(args: argparse.Namespace) -> int:
    from remote_agent.eagle3.data.records import manifest_path
    from remote_agent.eagle3.progress import emit

    data: Path = args.data
    manifest_file = args.manifest or manifest_path(data)
    vocab = args.vocab_size
    if args.tokenizer is not None:
        from remote_agent.eagle3.data.tokenizer_files import vocab_size

        vocab = vocab_size(args.tokenizer)
    from remote_agent.eagle3.data.chunks import default_workers

    try:
        summary = verify(data, manifest_file, vocab, args.workers or default_workers())
    except Discrepancy as exc:
        emit("result", command="verify", ok=False, file=str(data), discrepancy=str(exc))
        raise
    emit("result", command="verify", ok=True, file=str(data), vocab_size=vocab, **summary)
    return 0
