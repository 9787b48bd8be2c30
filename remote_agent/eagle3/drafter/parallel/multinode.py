"""Training across nodes (torchrun --nnodes N --rdzv-backend c10d): the one thing a multi-node
run needs beyond one node's is that every rank sees the same `train.out`.

Checkpoints live under `train.out/checkpoints`, written by rank 0 and read by every rank on
resume, so `train.out` must be storage all nodes share (NFS, Lustre, a cloud filesystem).
Per-node storage would let node 1 resume from nothing (or a stale step) while node 0 resumes
from step k: the ranks would train different models, or deadlock in a collective. So before
training, rank 0 writes a nonce into `train.out` and every rank must read it back, and on
resume every rank must have chosen the same checkpoint; else a located BadInput on every rank.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from remote_agent.eagle3.distributed import Dist
from remote_agent.eagle3.errors import BadInput
from remote_agent.wire.atomic_write import write_atomic

PROBE = ".shared-storage-probe"


def _gather(d: Dist, obj: Any) -> list[Any]:
    import torch

    out: list[Any] = [None] * d.world
    torch.distributed.all_gather_object(out, obj)
    return out


def check_shared_out(d: Dist, out_dir: Path, resume_from: Path | None) -> None:
    """Every rank sees rank 0's `out_dir` and chose the same checkpoint (no-op on one rank)."""
    if not d.enabled:
        return
    out_dir = Path(out_dir)
    nonce = secrets.token_hex(8) if d.main else None
    if d.main:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(out_dir / PROBE, nonce or "")
    nonce = d.broadcast(nonce)
    d.barrier()
    try:
        seen = (out_dir / PROBE).read_text()
    except OSError:
        seen = None
    views = _gather(d, (os.uname().nodename, seen == nonce, resume_from and resume_from.name))
    blind = [r for r, (_, ok, _) in enumerate(views) if not ok]
    if blind:
        raise BadInput(
            f"train.out {out_dir}: rank(s) {blind} do not see rank 0's files there; checkpoints "
            "are written by rank 0 and read by every rank, so put train.out on storage every "
            "node shares (see remote_agent/eagle3/drafter/parallel/multinode.py)"
        )
    chosen = {v[2] for v in views}
    if len(chosen) > 1:
        raise BadInput(
            f"{out_dir}/checkpoints: ranks would resume from different checkpoints "
            f"{sorted(str(c) for c in chosen)}; every rank must see the same train.out"
        )
