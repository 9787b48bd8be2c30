"""Data-parallel wrapping of the TTT module (DDP or FSDP2) and full state across wrappings."""

from __future__ import annotations

import torch
from torch import nn

from remote_agent.eagle3.distributed import Dist
from remote_agent.eagle3.drafter.model.model import Eagle3Drafter


def wrap(step_module: nn.Module, d: Dist, parallel: str, bf16: bool) -> nn.Module:
    """The module the optimizer sees: itself alone, DDP-replicated or FSDP2-sharded."""
    if d.world > 1 and parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        device = d.device
        return DDP(step_module, device_ids=[device.index] if device.type == "cuda" else None)
    if d.world > 1 and parallel == "fsdp":
        return fsdp(step_module, bf16)  # parameters become sharded DTensors
    return step_module


def fsdp(module: nn.Module, bf16: bool) -> nn.Module:
    """FSDP2 over the whole TTT module: parameters are gathered once per step (the layer runs
    7 times), while gradients, fp32 masters and AdamW states stay sharded across ranks."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kw = {}
    if bf16:
        kw["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    fully_shard(module, **kw)
    return module


def trainable_count(model: nn.Module, step_module: nn.Module, drafter: Eagle3Drafter) -> int:
    if is_sharded(model):  # global sizes (DTensor.numel is the full size)
        return sum(p.numel() for p in step_module.parameters() if p.requires_grad)
    return sum(p.numel() for p in drafter.parameters() if p.requires_grad)


def is_sharded(model: nn.Module) -> bool:
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def full_state(model: nn.Module, drafter: Eagle3Drafter, opt) -> tuple[dict, dict]:
    """Full (unsharded) model and optimizer state on CPU, whatever the wrapping."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        msd, osd = get_state_dict(model, opt, options=opts)
        msd = {k.removeprefix("drafter."): v for k, v in msd.items()}
        return msd, osd
    return drafter.state_dict(), opt.state_dict()


def load_optimizer(model: nn.Module, opt, osd: dict) -> None:
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        set_optimizer_state_dict(model, opt, osd, options=StateDictOptions(full_state_dict=True))
    else:
        opt.load_state_dict(osd)
