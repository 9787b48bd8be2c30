"""Exact memory savings of the TTT unroll that cost (almost) no compute: the middle option set.

Where 4K equal work's memory goes (Kimi shape; bench/memory_breakdown.py and the arithmetic in
the README): besides the fp32 masters, gradients and AdamW states (~17 GiB, as SpecForge's), per
TTT step autograd keeps

  * a bf16 copy of every matrix of the layer (q/k/v/o, gate/up/down: 1.41 GiB per step): under
    torch.compile the autocast cast is inside the compiled graph, so each step saves its own;
  * the fp32 TTT-diagonal merge (ttt_attention.merge_diagonal: q, keys and values of the
    earlier steps widened to fp32 and stacked: 6.6 GiB over seven steps; recomputed, it is
    also done in blocks of MERGE_ROWS positions, so long sequences never hold it whole);
  * the fp32 insides of the RMSNorm before the draft lm_head (3 x [T, H] fp32 per step).

`cast_weights_once` casts the matrices once per unroll and shares them (SharedCast keeps a
gradient path per step, so the fp32 masters still sum the steps' gradients in fp32, exactly as
autocast's per-step casts do). `recompute_elementwise` checkpoints the merge and the loss norm:
they keep only their inputs (already kept by their neighbours) and are recomputed in backward;
both are elementwise, so the recompute is a few milliseconds against a ~400 ms step. All exact:
tests/eagle3/drafter/test_drafter_long_memory.py compares losses and gradients with the plain
unroll, in fp32 and under bf16 autocast.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn


class SharedCast(torch.autograd.Function):
    """forward: the already-cast copy of `master` (no new memory); backward: the gradient
    widened to the master's dtype. One node per use, so per-use gradients meet in fp32."""

    @staticmethod
    def forward(ctx, master: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
        ctx.dtype = master.dtype
        return low.view_as(low)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.to(ctx.dtype), None


def shared_casts(
    layer: nn.Module, dtype: torch.dtype
) -> dict[str, tuple[nn.Parameter, torch.Tensor]]:
    """{name: (master, low-precision copy)} for the layer's matrices (norm vectors stay fp32:
    the norms compute in fp32 from them). Made once per unroll."""
    out = {}
    for name, p in layer.named_parameters():
        if p.ndim == 2 and p.dtype != dtype:
            with torch.no_grad():
                low = p.detach().to(dtype)
            out[name] = (p, low)
    return out


def layer_weights(
    layer: nn.Module, casts: dict[str, tuple[nn.Parameter, torch.Tensor]] | None
) -> AbstractContextManager:
    """Within: the layer's matrices are the shared copies (through a SharedCast node each)."""
    if not casts:
        return nullcontext()
    from torch.nn.utils.stateless import _reparametrize_module

    swapped = {name: SharedCast.apply(master, low) for name, (master, low) in casts.items()}
    return _reparametrize_module(layer, swapped)


MERGE_ROWS = 4096  # positions per recomputed merge block: its fp32 insides exist per block only


def merge_recomputed(o0, lse0, q, ks, vs, scale: float, rows: int | None = None) -> torch.Tensor:
    """ttt_attention.merge_diagonal in blocks of positions, each kept as its inputs only and
    recomputed in backward. Every position's merge is its own (its query, the earlier steps'
    keys and values at that position), so the blocks give exactly the whole: at 100K tokens the
    seventh step's fp32 stack alone would be ~17 GiB, a 4,096-row block holds 0.7 GiB."""
    from remote_agent.eagle3.drafter.ttt_attention import merge_diagonal

    n, rows = q.shape[2], rows or MERGE_ROWS
    parts = []
    for lo in range(0, n, rows):
        hi = min(lo + rows, n)
        block = [k[:, :, lo:hi] for k in ks], [v[:, :, lo:hi] for v in vs]
        parts.append(
            recomputed(
                merge_diagonal, o0[:, :, lo:hi], lse0[:, :, lo:hi], q[:, :, lo:hi], *block, scale
            )
        )
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def recomputed(fn, *args):
    """fn(*args) keeping only its inputs for backward (fn is recomputed there)."""
    if not torch.is_grad_enabled():
        return fn(*args)
    from torch.utils.checkpoint import checkpoint

    return checkpoint(fn, *args, use_reentrant=False)
