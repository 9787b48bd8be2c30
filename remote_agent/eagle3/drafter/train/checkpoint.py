"""Checkpoints: atomic directories, pruned by policy, complete enough to resume bit-for-bit.

    OUT/checkpoints/step-00000120/
        state.pt      model (fp32 masters + d2t/t2d), optimizer, scheduler, RNG states, data
                      position (epoch, step in epoch), global step
        meta.json     step, position, config (human-readable; written last = completion marker)
    OUT/checkpoints/latest   name of the newest complete checkpoint

A checkpoint is written into a hidden temp directory (remote_agent.wire.atomic_write), fsynced and
renamed; a crash leaves either the old set or the new one. `latest` is advisory: the newest complete `step-*` directory wins.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from remote_agent.wire.atomic_write import TEMP_MARK, atomic_path, write_atomic


def rng_state() -> dict[str, Any]:
    import numpy as np

    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def step_dirs(root: Path) -> list[Path]:
    """Complete checkpoints (meta.json present), oldest first."""
    root = Path(root)
    if not root.exists():
        return []
    found = [p for p in root.glob("step-*") if p.is_dir() and (p / "meta.json").exists()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def latest(root: Path) -> Path | None:
    dirs = step_dirs(root)
    return dirs[-1] if dirs else None


def save(root: Path, step: int, state: dict[str, Any], meta: dict[str, Any]) -> Path:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    with atomic_path(final) as tmp:  # a re-run of the same step replaces it
        tmp.mkdir()
        with open(tmp / "state.pt", "wb") as f:
            torch.save(state, f)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    write_atomic(root / "latest", final.name + "\n")
    return final


def prune(root: Path, keep_last: int, keep_every: int = 0) -> list[Path]:
    """Delete complete checkpoints beyond the newest `keep_last` (multiples of keep_every stay)."""
    dirs = step_dirs(root)
    keep = set(dirs[-keep_last:]) if keep_last > 0 else set(dirs[-1:])
    removed = []
    for d in dirs:
        step = int(d.name.split("-")[1])
        if d in keep or (keep_every and step % keep_every == 0):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    for stale in Path(root).glob(f".step-*{TEMP_MARK}*"):  # left by a crash mid-write
        shutil.rmtree(stale, ignore_errors=True)
    return removed


def load(path: Path, map_location="cpu") -> dict[str, Any]:
    with open(Path(path) / "state.pt", "rb") as f:
        return torch.load(f, map_location=map_location, weights_only=False)
