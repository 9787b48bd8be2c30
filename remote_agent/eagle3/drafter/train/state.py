"""Resume and checkpoint state of a training run: what a checkpoint holds, and the checks that
make a resume continue the same run (same drafter, data, packing, ranks and parallelism)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote_agent.eagle3.distributed import Dist
from remote_agent.eagle3.drafter.model.context import target_context_length
from remote_agent.eagle3.drafter.model.model import Eagle3Drafter
from remote_agent.eagle3.drafter.parallel.data_parallel import full_state
from remote_agent.eagle3.drafter.train import checkpoint as ckpt
from remote_agent.eagle3.drafter.train.config import Config
from remote_agent.eagle3.drafter.train.data import Plan
from remote_agent.eagle3.errors import BadInput, Failed


@dataclass
class Resume:
    path: Path | None = None
    state: dict | None = None
    global_step: int = 0
    epoch: int = 0
    step: int = 0


def data_key(cfg: Config) -> dict[str, Any]:
    """What must not change across a resume for the data position to mean the same batches."""
    key = {
        "dump": os.path.abspath(cfg.data.dump),
        "dataset": os.path.abspath(cfg.data.dataset),
        "max_tokens": cfg.data.max_tokens,
        "max_len": cfg.data.max_len,
        "pack_window": cfg.data.pack_window,
        "holdout_fraction": cfg.data.holdout_fraction,
        "seed": cfg.train.seed,
    }
    if cfg.data.long_samples != "truncate":  # only then: older checkpoints keep resuming
        key["long_samples"] = cfg.data.long_samples
    return key


def resume(cfg: Config, ckpt_dir: Path, drafter: Eagle3Drafter, d: Dist) -> Resume:
    """Load the weights of the checkpoint `train.resume` names (optimizer state comes later,
    after wrapping); refuse one from a different run."""
    tc = cfg.train
    path = None
    if tc.resume not in ("auto", "never"):
        path = Path(tc.resume)
        if not (path / "state.pt").exists():
            raise BadInput(f"train.resume: {path} is not a checkpoint directory")
    elif tc.resume == "auto":
        path = ckpt.latest(ckpt_dir)
    if path is None:
        return Resume()
    state = ckpt.load(path)
    if state["model_config"] != drafter.config:
        raise BadInput(f"{path}: the checkpoint's drafter config differs from this one")
    saved = (state["world"], state.get("parallel"), state["data_key"])
    now = (d.world, tc.parallel, data_key(cfg))
    if saved != now:
        raise BadInput(
            f"{path}: saved with (world, parallel, data) {saved}; now {now} "
            "(resuming needs the same data, packing, ranks and parallelism)"
        )
    # the frozen shared embedding is the only thing a checkpoint leaves out
    missing, unexpected = drafter.load_state_dict(state["model"], strict=False)
    frozen = {n for n, p in drafter.named_parameters() if not p.requires_grad}
    if set(missing) != frozen or unexpected:
        raise Failed(
            f"{path}: checkpoint tensors do not match the drafter: missing "
            f"{sorted(set(missing) - frozen)}, unexpected {sorted(unexpected)}"
        )
    pos = state["position"]
    return Resume(path, state, state["global_step"], pos["epoch"], pos["step"])


def next_position(epoch: int, step: int, plan: Plan, world: int) -> dict[str, int]:
    if step + 1 >= len(plan.epoch_batches(epoch)) // world:
        return {"epoch": epoch + 1, "step": 0}
    return {"epoch": epoch, "step": step + 1}


def save(model, drafter, opt, sched, d: Dist, root: Path, step: int, position, cfg: Config) -> None:
    tc = cfg.train
    msd, osd = full_state(model, drafter, opt)
    if d.main:
        frozen = {n for n, p in drafter.named_parameters() if not p.requires_grad}
        state = {
            "model": {k: v.detach().cpu() for k, v in msd.items() if k not in frozen},
            "optimizer": osd,
            "scheduler": sched.state_dict(),
            "rng": ckpt.rng_state(),
            "position": position,
            "global_step": step,
            "world": d.world,
            "parallel": tc.parallel,
            "model_config": drafter.config,
            "capture_layer_ids": drafter.capture_layer_ids,
            "num_target_layers": drafter.num_target_layers,
            "target_context_length": target_context_length(Path(cfg.target.path)),
            "data_key": data_key(cfg),
            "vocab": {"d2t": drafter.d2t.cpu(), "t2d": drafter.t2d.cpu()},
            "train_config": cfg.to_dict(),
        }
        meta = {"step": step, "position": position, "model_config": drafter.config}
        ckpt.save(root, step, state, meta)
        ckpt.prune(root, tc.keep_last, tc.keep_every)
    d.barrier()
