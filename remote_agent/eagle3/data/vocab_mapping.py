"""Draft-vocabulary mapping: which target tokens the drafter can emit, in SGLang's shapes.

- `d2t` int64 [draft_vocab]: target id = draft id + d2t[draft id] (SGLang's llama_eagle3 loader
  turns it into `hot_token_id`);
- `t2d` bool [target_vocab]: True for the target ids in the draft vocabulary.

The draft vocabulary is the `draft_vocab` most frequent *supervised* target ids (loss_mask == 1:
what the drafter is trained to predict), ties broken by lower id, padded with the lowest unused
ids when the data has fewer distinct ids, then sorted by target id (so d2t is non-decreasing).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from remote_agent.eagle3.data.chunks import Chunk, chunk_lines
from remote_agent.eagle3.data.records import parse_raw

MAPPING_FORMAT = 1  # bump when the selection rule changes: it is part of the cache key
REPORT_SIZES = (4096, 8192, 16384, 32000, 32768, 65536)
REPORT_COVERAGES = (0.9, 0.95, 0.99, 0.995, 0.999)

_VOCAB: int | None = None


def init_counter(target_vocab: int) -> None:
    global _VOCAB
    _VOCAB = target_vocab


def count_chunk(task: tuple[str, Chunk]) -> tuple[np.ndarray, int]:
    """Supervised-token counts of one chunk, and its size (runs in worker processes)."""
    path_s, chunk = task
    assert _VOCAB is not None
    path = Path(path_s)
    counts = np.zeros(_VOCAB, dtype=np.int64)
    pending: list[np.ndarray] = []
    size = 0
    for lineno, _off, raw in chunk_lines(path, chunk):
        if not raw.strip():
            continue
        rec = parse_raw(raw, path, lineno, _VOCAB)
        if rec.n_trainable == 0:
            continue
        sel = rec.token_ids()[rec.mask_array()]
        pending.append(sel)
        size += len(sel)
        if size >= 1 << 20:  # one bincount per ~1 M tokens, not one per record
            counts += np.bincount(np.concatenate(pending), minlength=_VOCAB)
            pending, size = [], 0
    if pending:
        counts += np.bincount(np.concatenate(pending), minlength=_VOCAB)
    return counts, chunk.end - chunk.start


def select(counts: np.ndarray, draft_vocab: int) -> np.ndarray:
    """Target ids of the draft vocabulary, ascending."""
    order = np.lexsort((np.arange(len(counts)), -counts))  # by count desc, then id asc
    used = order[counts[order] > 0][:draft_vocab]
    if len(used) < draft_vocab:
        unused = np.setdiff1d(np.arange(len(counts)), used, assume_unique=True)
        used = np.concatenate([used, unused[: draft_vocab - len(used)]])
    return np.sort(used)


def build(counts: np.ndarray, draft_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    selected = select(counts, draft_vocab)
    d2t = (selected - np.arange(draft_vocab)).astype(np.int64)
    t2d = np.zeros(len(counts), dtype=bool)
    t2d[selected] = True
    return d2t, t2d


def coverage_report(
    counts: np.ndarray, draft_vocab: int, t2d: np.ndarray, target_coverage: float
) -> dict[str, Any]:
    total = int(counts.sum())
    ranked = np.sort(counts)[::-1]
    cumulative = np.cumsum(ranked)
    distinct = int((counts > 0).sum())

    def size_for(cov: float) -> int:
        if total == 0:
            return 0
        return int(np.searchsorted(cumulative, cov * total, side="left")) + 1

    def coverage_at(k: int) -> float:
        return float(cumulative[min(k, len(cumulative)) - 1] / total) if total and k else 0.0

    return {
        "supervised_tokens": total,
        "distinct_supervised_ids": distinct,
        "draft_vocab": draft_vocab,
        "coverage": float(counts[t2d].sum() / total) if total else 0.0,
        "target_coverage": target_coverage,
        "suggested_draft_vocab": min(size_for(target_coverage), distinct),
        "size_for_coverage": {str(c): min(size_for(c), distinct) for c in REPORT_COVERAGES},
        "coverage_at_size": {
            str(k): round(coverage_at(k), 6)
            for k in sorted({*REPORT_SIZES, draft_vocab, len(counts) // 4, len(counts) // 2})
            if 0 < k <= len(counts)
        },
    }


def cache_key(tokenizer_sha: str, data_shas: list[str], target_vocab: int, draft_vocab: int) -> str:
    """Everything the mapping depends on; the vocab sizes are in it (SpecForge PR #602's bug)."""
    blob = json.dumps(
        {
            "format": MAPPING_FORMAT,
            "tokenizer_sha256": tokenizer_sha,
            "data_sha256": data_shas,
            "target_vocab": target_vocab,
            "draft_vocab": draft_vocab,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def save(path: Path, d2t: np.ndarray, t2d: np.ndarray, metadata: dict[str, str]) -> None:
    from safetensors.numpy import save_file

    from remote_agent.wire.atomic_write import atomic_path

    with atomic_path(path) as tmp:
        save_file({"d2t": d2t, "t2d": t2d}, str(tmp), metadata=metadata)


def load(path: Path) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
    from safetensors import safe_open

    with safe_open(str(path), "np") as f:
        return f.get_tensor("d2t"), f.get_tensor("t2d"), dict(f.metadata() or {})
