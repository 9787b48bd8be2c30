"""Pieces both extractors share: the disk preflight, resume (which dataset samples are already
dumped, with their ids checked against the dataset), and a human-readable byte size."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from remote_agent.eagle3.dense import DumpReader
from remote_agent.eagle3.errors import Failed
from remote_agent.eagle3.extraction.dataset import Dataset


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def free_bytes(path: Path) -> int:
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def disk_preflight(
    root: Path, tokens: int, bytes_per_token: int, margin_gb: float
) -> dict[str, Any]:
    """Refuse (Failed) when tokens x bytes/token + margin exceeds the free space under root."""
    estimate = tokens * bytes_per_token
    margin = max(margin_gb * 1e9, 0.02 * estimate)
    free = free_bytes(root)
    report = {"estimate_bytes": estimate, "margin_bytes": int(margin), "free_bytes": free}
    if estimate + margin > free:
        raise Failed(
            f"not enough disk for the dump: estimated {human_bytes(estimate)} ({tokens} tokens x "
            f"{bytes_per_token} B/token) + {human_bytes(margin)} margin = "
            f"{human_bytes(estimate + margin)}, but only {human_bytes(free)} free under {root}; "
            "free space, choose another --out, or store fp8 aux (--aux-dtype fp8_e4m3)"
        )
    return report


def existing_samples(root: Path, dataset: Dataset) -> tuple[set[str], list[str]]:
    """(dataset samples already dumped and matching, problems) for a resume; no dump -> empty."""
    if not (Path(root) / "meta.json").exists():
        return set(), []
    reader = DumpReader(root)
    done: set[str] = set()
    problems: list[str] = []
    for sid in reader.ids():
        if sid not in dataset:
            continue  # not ours (another dataset's sample): verify-dumps reports it
        expected = dataset.input_ids(sid)
        got = reader.input_ids(sid).tolist()
        if got != expected:
            problems.append(
                f"{sid}: dumped input_ids ({len(got)} tokens) differ from the dataset's "
                f"({len(expected)} tokens)"
            )
        else:
            done.add(sid)
    reader.close()
    return done, problems
