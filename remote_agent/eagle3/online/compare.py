"""Online vs offline on the same samples (bench/bench_online.py and tests/eagle3/online):
a dataset, the offline reference dump of it (one sample per forward), the training config for
either mode, and the comparison of two runs' losses and final weights."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any


def write_dataset(path: Path, lengths: list[int], vocab: int, seed: int = 0) -> Path:
    """A merged-dataset JSONL + manifest of random token ids (loss on the second half)."""
    rng = random.Random(seed)
    lines = []
    for i, n in enumerate(lengths):
        ids = [rng.randrange(11, vocab) for _ in range(n)]
        mask = [0] * (n // 2) + [1] * (n - n // 2)
        rec = {"id": f"s{i:05d}", "source": "bench", "input_ids": ids, "loss_mask": mask}
        lines.append(json.dumps(rec, separators=(",", ":")))
    data = ("\n".join(lines) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    manifest = {
        "format": "eagle3-merged",
        "version": 1,
        "file": path.name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "records": len(lengths),
        "tokens": sum(lengths),
    }
    path.with_name(path.name.removesuffix(".jsonl") + ".manifest.json").write_text(
        json.dumps(manifest)
    )
    return path


def offline_dump(model: Path, dataset: Path, out: Path, device: str = "cpu") -> dict[str, Any]:
    """The offline reference dump, one sample per forward (what the reference producer does)."""
    from remote_agent.eagle3.extraction.reference import ReferenceOptions, run_reference

    opts = ReferenceOptions(
        model, dataset, out, max_batch=1, device=device, min_free_gb=0, disk_margin_gb=0,
        progress_interval=1e9,
    )  # fmt: skip
    return run_reference(opts)


def config(
    target: Path, dataset: Path, out_dir: Path, dump: Path | None = None, **sections: dict
) -> dict[str, Any]:
    """A small training config; `online.server` set = online, `dump` = offline."""
    cfg: dict[str, Any] = {
        "target": {"path": str(target)},
        "data": {
            "dump": str(dump or ""),
            "dataset": str(dataset),
            "max_tokens": 256,
            "prefetch": 2,
        },
        "drafter": {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128},
        "train": {
            "out_dir": str(out_dir),
            "epochs": 2,
            "lr": 1e-3,
            "log_every": 1,
            "save_every": 0,
            "ttt_steps": 3,
            "device": "cpu",
            "seed": 3,
        },
    }
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return cfg


def losses(run_dir: Path) -> list[float]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line)["loss"] for line in path.read_text().splitlines() if line.strip()]


def final_weights(run_dir: Path) -> dict[str, Any]:
    from remote_agent.eagle3.drafter import checkpoint as ckpt

    latest = ckpt.latest(Path(run_dir) / "checkpoints")
    if latest is None:
        raise FileNotFoundError(f"{run_dir}: no checkpoint")
    return ckpt.load(latest)["model"]


def max_abs_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    if set(a) != set(b):
        raise ValueError(f"different tensors: {sorted(set(a) ^ set(b))}")
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
