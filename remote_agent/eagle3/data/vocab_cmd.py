"""`eagle3 vocab`: draft-vocabulary mapping (d2t/t2d) from supervised-token frequencies.

Writes OUT (safetensors: d2t int64 [draft], t2d bool [target], metadata) and OUT's `.json`
coverage report. Cached under --cache-dir by tokenizer hash + data hash + both vocab sizes, so a
different draft size (or tokenizer, or data) is never served a stale mapping.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from remote_agent.eagle3.errors import BadInput

HELP = "draft-vocabulary mapping (d2t/t2d) with a coverage report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data", nargs="+", type=Path, help="tokenized JSONL file(s)")
    parser.add_argument("--tokenizer", type=Path, required=True, help="target tokenizer/model dir")
    parser.add_argument("--out", type=Path, required=True, help="output vocab.safetensors")
    parser.add_argument("--draft-vocab", type=int, default=32000, help="draft vocab size (32000)")
    parser.add_argument(
        "--target-vocab",
        type=int,
        help="target vocab size (default: config.json's vocab_size, else the tokenizer's size)",
    )
    parser.add_argument(
        "--target-coverage",
        type=float,
        default=0.99,
        help="report the draft size covering this share of supervised tokens (0.99)",
    )
    parser.add_argument("--cache-dir", type=Path, help="default: $EAGLE3_CACHE/vocab")
    parser.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    parser.add_argument("--workers", type=int, help="counting processes (default: CPUs, max 8)")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from remote_agent.eagle3.atomic import write_bytes_atomic
    from remote_agent.eagle3.data import vocab_mapping as vm
    from remote_agent.eagle3.data.chunks import (
        ChunkScanner,
        default_workers,
        file_sha256,
        ordered_map,
        plan,
    )
    from remote_agent.eagle3.data.tokenizer_files import model_vocab_size, tokenizer_sha256
    from remote_agent.eagle3.progress import Progress, emit
    from remote_agent.eagle3.tiny.cache import cache_root

    for p in args.data:
        if not p.is_file():
            raise BadInput(f"{p}: no such file")
    tok_sha = tokenizer_sha256(args.tokenizer)
    target = args.target_vocab or model_vocab_size(args.tokenizer)
    if not 0 < args.draft_vocab <= target:
        raise BadInput(
            f"--draft-vocab {args.draft_vocab}: must be in 1..{target} (the target vocab)"
        )
    if not 0 < args.target_coverage <= 1:
        raise BadInput("--target-coverage: must be in (0, 1]")
    data_shas = [file_sha256(p) for p in args.data]
    key = vm.cache_key(tok_sha, data_shas, target, args.draft_vocab)
    cache_dir = args.cache_dir or cache_root() / "vocab"
    cached_map, cached_report = cache_dir / f"{key}.safetensors", cache_dir / f"{key}.json"
    report_path = args.out.with_name(args.out.name.removesuffix(".safetensors") + ".json")

    if not args.no_cache and cached_map.is_file() and cached_report.is_file():
        write_bytes_atomic(args.out, cached_map.read_bytes())
        report = json.loads(cached_report.read_text())
        write_bytes_atomic(report_path, json.dumps(report, indent=1).encode() + b"\n")
        emit(
            "result",
            command="vocab",
            out=str(args.out),
            cached=True,
            cache_key=key,
            **report["coverage"],
        )
        return 0

    total = sum(p.stat().st_size for p in args.data)
    workers, chunk_bytes = plan(total, args.workers or default_workers())
    scanners = [ChunkScanner(p, chunk_bytes) for p in args.data]

    def tasks():
        for p, s in zip(args.data, scanners, strict=True):
            for chunk in s:
                yield str(p), chunk

    counts = np.zeros(target, dtype=np.int64)
    progress = Progress("vocab", total, "bytes")
    for part, nbytes in ordered_map(vm.count_chunk, tasks(), workers, vm.init_counter, (target,)):
        counts += part
        progress.advance(nbytes)
    progress.finish()
    if scanners and [s.sha256 for s in scanners] != data_shas:
        raise BadInput("the data changed while it was being read; run again")

    d2t, t2d = vm.build(counts, args.draft_vocab)
    coverage = vm.coverage_report(counts, args.draft_vocab, t2d, args.target_coverage)
    metadata = {
        "target_vocab": str(target),
        "draft_vocab": str(args.draft_vocab),
        "coverage": f"{coverage['coverage']:.6f}",
        "tokenizer_sha256": tok_sha,
        "data_sha256": ",".join(data_shas),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    vm.save(args.out, d2t, t2d, metadata)
    report = {"metadata": metadata, "coverage": coverage, "cache_key": key}
    write_bytes_atomic(report_path, json.dumps(report, indent=1).encode() + b"\n")
    if not args.no_cache:
        cache_dir.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(cached_map, args.out.read_bytes())  # the very bytes served later
        write_bytes_atomic(cached_report, json.dumps(report).encode())
    emit("result", command="vocab", out=str(args.out), cached=False, cache_key=key, **coverage)
    return 0
