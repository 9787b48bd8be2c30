"""`eagle3 merge`: several tokenized sources -> one seeded-shuffled JSONL + manifest + index.

Pass 1 reads the sources in command-line order, in line-aligned chunks spread over worker
processes (`merge_worker`): every line is validated (a record without `source` takes the
source name: the file stem or NAME), truncated to --max-len (every mask bit kept: the trainer
predicts token t from position t-2, so the final end-of-turn token trains too), and spilled as a
canonical line into
key-range buckets (`shuffle`). The parent decides, in input order, what is dropped: records left
with nothing to train, exact duplicates (same input_ids; the first kept copy wins) and id
clashes. Pass 2 sorts each bucket by key, applies per-source caps (a cap keeps the records with
the smallest keys: a seeded uniform sample) and writes OUT.jsonl. Same inputs + same seed ->
same bytes, whatever the memory budget or worker count. The manifest is written last: it is the
commit point that verify checks.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from remote_agent.eagle3.errors import BadInput, Failed

if TYPE_CHECKING:  # heavy-ish modules stay out of `eagle3 --help`
    from collections.abc import Iterator

    from remote_agent.eagle3.data.chunks import ChunkScanner
    from remote_agent.eagle3.data.manifest import SourceStats
    from remote_agent.eagle3.data.merge_worker import MergeOptions
    from remote_agent.eagle3.data.shuffle import BucketReader

HELP = "deterministic merge + shuffle of tokenized sources, with a manifest"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="tokenized JSONL, as PATH (source name = file stem) or NAME=PATH",
    )
    parser.add_argument("--out", type=Path, required=True, help="merged OUT.jsonl")
    parser.add_argument("--max-len", type=int, help="truncate records to this many tokens")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    parser.add_argument(
        "--drop", action="append", default=[], metavar="SOURCE", help="leave a source out"
    )
    parser.add_argument(
        "--cap",
        action="append",
        default=[],
        metavar="SOURCE=N",
        help="keep at most N records of SOURCE (a seeded random sample)",
    )
    parser.add_argument("--max-per-source", type=int, help="cap every source at N records")
    parser.add_argument(
        "--memory-mb",
        type=float,
        default=512,
        help="memory budget for the shuffle buffers in MiB (default 512)",
    )
    parser.add_argument(
        "--allow-empty",
        action="store_true",
        help="write an empty dataset when no record survives (otherwise an error, exit 2)",
    )
    parser.add_argument("--prefix-ids", action="store_true", help="make ids unique as SOURCE/ID")
    parser.add_argument(
        "--workers", type=int, help="parsing processes (default: CPUs available, at most 8)"
    )
    vocab = parser.add_mutually_exclusive_group()
    vocab.add_argument("--tokenizer", type=Path, help="check ids against this tokenizer's vocab")
    vocab.add_argument("--vocab-size", type=int, help="check ids are below this")


@dataclass
class SourceSpec:
    name: str
    path: Path


def parse_sources(specs: list[str]) -> list[SourceSpec]:
    out: list[SourceSpec] = []
    for spec in specs:
        name, sep, rest = spec.partition("=")
        if sep and name and "/" not in name and not Path(spec).exists():
            path = Path(rest)
        else:
            name, path = Path(spec).stem, Path(spec)
        if not name:
            raise BadInput(f"{spec}: empty source name")
        if not path.is_file():
            raise BadInput(f"{path}: no such file")
        if any(s.name == name for s in out):
            raise BadInput(f"{spec}: source name {name!r} given twice; name them as NAME=PATH")
        out.append(SourceSpec(name, path))
    return out


def parse_caps(caps: list[str], names: set[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for cap in caps:
        name, sep, value = cap.rpartition("=")
        if not sep or not value.isdigit():
            raise BadInput(f"--cap {cap}: expected SOURCE=N")
        if name not in names:
            raise BadInput(
                f"--cap {cap}: no source named {name!r} (sources: {', '.join(sorted(names))})"
            )
        out[name] = int(value)
    return out


@dataclass
class Pass1:
    """What pass 1 decided, in input order: spilled duplicates to skip, keys per source."""

    drop: set[tuple[int, int]]  # (source index, line) of spilled records that are duplicates
    keys: dict[str, list[int]]


@dataclass
class Written:
    sha256: str
    size: int
    entries: list[list[object]]  # the index rows
    histogram: dict[int, int]


def run(args: argparse.Namespace) -> int:
    from remote_agent.eagle3.data import merge_worker
    from remote_agent.eagle3.data.chunks import ChunkScanner, default_workers, plan
    from remote_agent.eagle3.data.manifest import SourceStats, build_manifest
    from remote_agent.eagle3.data.records import index_path, manifest_path, write_json_atomic
    from remote_agent.eagle3.data.shuffle import BucketReader, bucket_count
    from remote_agent.eagle3.progress import emit

    specs = parse_sources(args.inputs)
    names = {s.name for s in specs}
    args.drop = [n for n in args.drop if n]  # `--drop ""`: a runbook's unset drop_source
    for name in args.drop:
        if name not in names:
            raise BadInput(
                f"--drop {name}: no source named {name!r} (sources: {', '.join(sorted(names))})"
            )
    caps = parse_caps(args.cap, names)
    if args.max_per_source is not None:
        for name in names:
            caps.setdefault(name, args.max_per_source)
    if args.max_len is not None and args.max_len < 3:
        raise BadInput("--max-len: must be at least 3 (the first target is position 2)")
    if args.memory_mb <= 0:
        raise BadInput("--memory-mb: must be positive")
    vocab = args.vocab_size
    if args.tokenizer is not None:
        from remote_agent.eagle3.data.tokenizer_files import vocab_size

        vocab = vocab_size(args.tokenizer)
    out: Path = args.out
    if out.suffix != ".jsonl":
        raise BadInput(f"--out {out}: must end in .jsonl (the manifest and index go next to it)")
    kept = [s for s in specs if s.name not in args.drop]
    if not kept:
        raise BadInput("every source is dropped; nothing to merge")

    stats = {s.name: SourceStats() for s in kept}
    budget = int(args.memory_mb * (1 << 20))
    expected = sum(s.path.stat().st_size for s in kept)
    n_buckets = bucket_count(expected, budget)
    workers, chunk_bytes = plan(expected, args.workers or default_workers())
    _remove_stale_spills(out)
    workdir = out.parent / f".{out.name}.merge-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    opts = merge_worker.MergeOptions(
        str(workdir),
        n_buckets,
        # every worker keeps a write buffer per bucket: a quarter of the budget in all
        budget // (4 * n_buckets * workers),
        args.seed,
        args.max_len,
        vocab,
        args.prefix_ids,
    )
    scanners = [ChunkScanner(s.path, chunk_bytes) for s in kept]
    reader = BucketReader(workdir, n_buckets, budget)
    manifest_file = manifest_path(out)
    try:
        with _no_space_is_one_line(out):
            first = _pass1(kept, scanners, stats, opts, workers, expected)
        thresholds: dict[str, int] = {}
        for name, cap in caps.items():
            if name in first.keys and len(first.keys[name]) > cap:
                stats[name].capped = len(first.keys[name]) - cap
                thresholds[name] = sorted(first.keys[name])[cap - 1] if cap else -1
        n_items = sum(len(k) for k in first.keys.values()) + len(first.drop)
        survivors = sum(len(k) for k in first.keys.values()) - sum(s.capped for s in stats.values())
        if survivors <= 0 and not args.allow_empty:
            # an empty dataset would pass verify and every guard built on it: refuse, write nothing
            raise BadInput(
                f"no records to merge from {', '.join(str(s.path) for s in kept)} "
                "(empty, or every record dropped); nothing written. Pass --allow-empty to mean it"
            )
        first.keys.clear()
        manifest_file.unlink(missing_ok=True)  # never leave an old manifest describing new data
        with _no_space_is_one_line(out):
            written = _pass2(
                out, reader, [s.name for s in kept], stats, thresholds, first.drop, n_items
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    with _no_space_is_one_line(out):
        write_json_atomic(
            index_path(out),
            {"data_size": written.size, "data_sha256": written.sha256, "records": written.entries},
        )
    manifest = build_manifest(
        file=out.name,
        sha256=written.sha256,
        sources=stats,
        dropped_sources=[s.name for s in specs if s.name in args.drop],
        histogram=written.histogram,
        seed=args.seed,
        max_len=args.max_len,
    )
    with _no_space_is_one_line(out):
        write_json_atomic(manifest_file, manifest)
    emit(
        "result",
        command="merge",
        out=str(out),
        manifest=str(manifest_file),
        records=manifest["records"],
        tokens=manifest["tokens"],
        trainable_tokens=manifest["trainable_tokens"],
        sha256=written.sha256,
        sources={n: {k: v for k, v in vars(s).items() if k != "sha256"} for n, s in stats.items()},
        dropped_sources=manifest["dropped_sources"],
        workers=workers,
        shuffle={
            "budget_bytes": budget,
            "buckets": n_buckets,
            "splits": reader.splits,
            "largest_load_bytes": reader.largest_load,
        },
    )
    return 0


def _pass1(
    kept: list[SourceSpec],
    scanners: list[ChunkScanner],
    stats: dict[str, SourceStats],
    opts: MergeOptions,
    workers: int,
    expected: int,
) -> Pass1:
    """Workers validate, truncate and spill; here, in input order: duplicates (first kept copy
    wins), untrainable records, id clashes, and every kept record's shuffle key."""
    from remote_agent.eagle3.data import merge_worker
    from remote_agent.eagle3.data.chunks import file_sha256, ordered_map
    from remote_agent.eagle3.progress import Progress

    def tasks():
        for si, (spec, scanner) in enumerate(zip(kept, scanners, strict=True)):
            for chunk in scanner:
                yield si, spec.name, str(spec.path), chunk

    seen_content: set[bytes] = set()
    seen_ids: set[bytes] = set()
    result = Pass1(set(), {s.name: [] for s in kept})
    progress = Progress("merge-read", expected, "bytes")
    for si, metas, nbytes in ordered_map(
        merge_worker.scan, tasks(), workers, merge_worker.init, (opts,)
    ):
        spec, st = kept[si], stats[kept[si].name]
        for lineno, digest, rid, key, _truncated in metas:
            if rid is None:  # nothing left to train: never kept, so never a "first" copy
                st.dropped_untrainable += 1
                continue
            if digest in seen_content:
                st.dropped_duplicates += 1
                result.drop.add((si, lineno))
                continue
            seen_content.add(digest)
            id_digest = hashlib.blake2b(rid.encode("utf-8", "surrogatepass"), digest_size=16)
            if id_digest.digest() in seen_ids:
                raise BadInput(
                    f"{spec.path}:{lineno}: id {rid!r} is already used by an earlier record; "
                    "ids must be unique across sources (pass --prefix-ids to use SOURCE/ID)"
                )
            seen_ids.add(id_digest.digest())
            result.keys[spec.name].append(key)
        progress.advance(nbytes)
    progress.finish()
    for spec, scanner in zip(kept, scanners, strict=True):
        # set when its scan finished (the pool has joined its task thread by now)
        stats[spec.name].sha256 = scanner.sha256 or file_sha256(spec.path)
    return result


def _pass2(
    out: Path,
    reader: BucketReader,
    names: list[str],
    stats: dict[str, SourceStats],
    thresholds: dict[str, int],
    drop: set[tuple[int, int]],
    n_items: int,
) -> Written:
    """Buckets in key order -> OUT.jsonl (atomic), skipping duplicates and capped records."""
    from remote_agent.eagle3.atomic import AtomicWriter, HashingSink
    from remote_agent.eagle3.data.manifest import hist_bound
    from remote_agent.eagle3.data.merge_worker import PAYLOAD as head
    from remote_agent.eagle3.progress import Progress

    written = Written("", 0, [], {})
    progress = Progress("merge-write", n_items, "records")
    # the sink holds at most ~5 batches in flight: keep them a small part of the budget
    batch = max(1 << 20, min(8 << 20, reader.budget // 16))
    with AtomicWriter(out) as f, HashingSink(f, batch) as sink:
        items = iter(reader)
        # Payloads are zero-copy views of a loaded bucket: no reference may outlive the loop
        # body, or the previous bucket stays in memory while the next one loads.
        while (item := next(items, None)) is not None:
            key, payload = item
            del item
            progress.advance()
            si, lineno, n_tok, n_train, id_len, truncated, crc = head.unpack_from(payload)
            name = names[si]
            if (name in thresholds and key > thresholds[name]) or (si, lineno) in drop:
                del payload
                continue
            rid = bytes(payload[head.size : head.size + id_len]).decode("utf-8", "surrogatepass")
            sink.write(payload[head.size + id_len :])
            line_len = len(payload) - head.size - id_len
            del payload
            written.entries.append([rid, written.size, n_tok, n_train, f"{crc:08x}"])
            written.size += line_len
            st = stats[name]
            st.records += 1
            st.tokens += n_tok
            st.trainable_tokens += n_train
            st.truncated += truncated
            bound = hist_bound(n_tok)
            written.histogram[bound] = written.histogram.get(bound, 0) + 1
        written.sha256 = sink.close()
    progress.finish()
    return written


@contextlib.contextmanager
def _no_space_is_one_line(out: Path) -> Iterator[None]:
    """A full disk is one clear line (exit 1), not a traceback; atomic writes leave nothing half."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise Failed(
            f"{out.parent}: no space left on device while merging ({exc.strerror}); no partial "
            f"{out.name} was left (spill files removed). Free space and run merge again"
        ) from None


def _remove_stale_spills(out: Path) -> None:
    """Spill directories of merges that were killed (their process is gone) waste disk."""
    for d in out.parent.glob(f".{out.name}.merge-*"):
        pid = d.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)
