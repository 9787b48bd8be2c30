"""A tiny real EAGLE-3 drafter (hidden 32, vocab 100) for CPU tests of the model, loss and export."""

from __future__ import annotations

import torch

from remote_agent.eagle3.drafter.model.model import Eagle3Drafter, build_config
from remote_agent.eagle3.drafter.train.config import DrafterSection


def tiny_drafter(
    arch: str = "llama",
    draft_vocab: int = 50,
    aux: tuple[int, ...] = (2, 4, 5),
    *,
    std: float = 0.02,
    seed: int = 0,
    map_vocab: bool = True,
    **drafter: object,
) -> Eagle3Drafter:
    """Weights N(0, std) from `seed`; `map_vocab`: every (100 // draft_vocab)-th target id is
    in the draft vocabulary (d2t / t2d set), else the mapping is left to the test."""
    ds = DrafterSection(
        arch=arch,
        num_attention_heads=4,
        intermediate_size=96,
        q_lora_rank=24,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=12,
        **drafter,  # type: ignore[arg-type]
    )
    c = build_config(
        ds,
        target_hidden=32,
        vocab_size=100,
        draft_vocab_size=draft_vocab,
        aux_layer_ids=list(aux),
        target_context=2048,
    )
    m = Eagle3Drafter(c)
    m.init_weights(std, torch.Generator().manual_seed(seed))
    if map_vocab:
        ids = torch.arange(0, 100, 100 // draft_vocab)[:draft_vocab]
        t2d = torch.zeros(100, dtype=torch.bool)
        t2d[ids] = True
        m.set_vocab(ids - torch.arange(draft_vocab), t2d)
    return m
