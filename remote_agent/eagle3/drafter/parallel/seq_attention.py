"""Sequence (context) parallelism for the TTT attention: one long sequence split across ranks.

Rank r holds the contiguous positions [offsets[r], offsets[r+1]) of the packed sequence (any
rank count, uneven splits allowed): its aux states, its queries, its step outputs and its share
of the activations, so per-rank activation memory is O(L / world). The causal part needs the
step-0 keys and values of every earlier position, so they are all-gathered once per batch
(autograd-aware: backward reduce-scatters each rank the gradient of its own keys); the TTT "diagonal"
keys of steps 1..k are per position and never leave their rank. Per rank this keeps the full
step-0 K/V (L x kv_heads x d, small next to the activations of seven steps) and computes only
its own query rows, so the result is exactly the single-rank attention of those rows.

    attention = SeqParallelAttention(doc_full, offsets, scale)   # same doc ids on every rank
    outs = drafter.ttt(aux[:, lo:hi], [ids[:, lo:hi] for ids in step_ids], positions[:, lo:hi],
                       attention, steps)

The whole training step of one sequence on top of it (teacher of the rank's rows plus a halo of
`steps` final states, TTT unroll, soft CE normalised by the global valid counts, backward) is
train/seq_parallel_step.py's (`sp_forward_backward`, which `train.sequence_parallel` runs, and
`seq_parallel_step` for a bare drafter).

Backends: `flex` (the GPU kernel: this rank's query rows against all L keys, the key blocks
past its rows and other documents' skipped; rank borders on multiples of its 128-position block,
`split_offsets(n, world, BLOCK)`), `chunked` (query blocks, recomputed in backward) and `dense`
(reference), exactly as ttt_attention's. A ring variant would hold one remote block at a time
instead of the gathered K/V; the all-gather is the simpler exact form and the memory of K/V is
not the limit here.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from remote_agent.eagle3.drafter.model.merge import merge_diagonal, merge_recomputed
from remote_agent.eagle3.drafter.model.ttt_attention import (
    BLOCK,
    _chunked_causal,
    _flex_causal,
    _mask,
    _softmax_attend,
    flex_block_mask_range,
)


def split_offsets(n: int, world: int, align: int = 1) -> list[int]:
    """Contiguous near-equal chunks: offsets[r]..offsets[r+1] is rank r's share of n positions,
    every border but the last a multiple of `align` (flex: its block), every share non-empty."""
    units = -(-n // align)
    if units < world:
        raise ValueError(f"{n} positions in blocks of {align} cannot be split over {world} ranks")
    base, extra = divmod(units, world)
    out = [0]
    for r in range(world):
        out.append(min(n, out[-1] + (base + (1 if r < extra else 0)) * align))
    return out


class _GatherSeq(torch.autograd.Function):
    """All-gather of equal-width chunks along dim 2; backward reduce-scatters the gradient of
    the whole gathered tensor (each rank receives the sum over ranks of its own chunk: one
    collective, 1/world of an all-reduce's output)."""

    @staticmethod
    def forward(ctx, x, group, rank: int, world: int):
        b, h, m, d = x.shape
        full = x.new_empty((world * b, h, m, d))  # rank r's chunk at rows r*b (dim 0)
        dist.all_gather_into_tensor(full, x.contiguous(), group=group)
        ctx.group, ctx.world = group, world
        # [world, B, h, m, d] -> [B, h, world * m, d]: rank r's chunk at positions r*m
        return full.view(world, b, h, m, d).permute(1, 2, 0, 3, 4).reshape(b, h, world * m, d)

    @staticmethod
    def backward(ctx, grad):
        b, h, n, d = grad.shape
        m = n // ctx.world
        parts = grad.reshape(b, h, ctx.world, m, d).permute(2, 0, 1, 3, 4).reshape(-1, h, m, d)
        out = grad.new_empty((b, h, m, d))
        dist.reduce_scatter_tensor(out, parts.contiguous(), group=ctx.group)
        return out, None, None, None


def gather_seq(x: torch.Tensor, offsets: list[int], group=None) -> torch.Tensor:
    """All-gather along dim 2 ([B, heads, m_r, d] per rank -> [B, heads, L, d]) with gradients;
    chunks are padded to the longest for the collective and trimmed after."""
    world = len(offsets) - 1
    rank = dist.get_rank(group)
    sizes = [offsets[r + 1] - offsets[r] for r in range(world)]
    width = max(sizes)
    pad = width - x.shape[2]
    xp = torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x
    full = _GatherSeq.apply(xp, group, rank, world)
    return torch.cat([full[:, :, r * width : r * width + s] for r, s in enumerate(sizes)], dim=2)


class SeqParallelAttention:
    """Callable attention(q, k0, v0, ks, vs) of this rank's rows of a sequence split across ranks."""

    def __init__(
        self,
        doc: torch.Tensor,
        offsets: list[int],
        scale: float,
        backend: str = "chunked",
        block: int = BLOCK,
        group=None,
        recompute_merge: bool = False,
    ) -> None:
        self.recompute_merge = recompute_merge  # merge.merge_recomputed, as TTTAttention's
        if backend not in ("flex", "chunked", "dense"):
            raise ValueError(
                f"sequence parallel attention: backend {backend!r} (flex|chunked|dense)"
            )
        world = dist.get_world_size(group) if dist.is_initialized() else 1
        if len(offsets) != world + 1 or offsets[0] != 0 or offsets[-1] != doc.shape[1]:
            raise ValueError(
                f"offsets {offsets} do not split {doc.shape[1]} positions over {world}"
            )
        rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.doc, self.offsets, self.scale = doc, list(offsets), scale
        self.backend, self.block, self.group = backend, block, group
        lo, hi = offsets[rank], offsets[rank + 1]
        self.rows = torch.arange(lo, hi, device=doc.device)  # this rank's global positions
        # flex: compiled on the GPU (eager flex, on CPU, materialises the scores); the mask of
        # rows lo..hi over all keys is refused unless lo and hi sit on its block borders
        self.compiled = doc.is_cuda
        self.block_mask = (
            flex_block_mask_range(doc, lo, hi, self.compiled) if backend == "flex" else None
        )
        self._kv: tuple | None = None  # (k0, v0, gathered k, gathered v): once per batch

    def _gathered(self, k: torch.Tensor, v: torch.Tensor):
        """The step-0 keys and values of every rank: one all-gather per batch. Steps >= 1 pass
        the same k, v; a per-step checkpoint's recompute of step 0 in backward (new tensors of
        the same values) reuses the forward's gather instead of a second collective (its
        gradient flows through the forward's node: checkpointing recomputes only what backward
        reads)."""
        recompute = self._kv is not None and torch._C._current_graph_task_id() != -1
        if recompute and self._kv is not None and self._kv[0].shape == k.shape:
            return self._kv[2], self._kv[3]
        if self._kv is None or self._kv[0] is not k or self._kv[1] is not v:
            # one collective for K and V: backward then runs exactly one reduce-scatter per
            # batch, so ranks can never pair up different gradients in a different order
            kv = gather_seq(torch.cat([k, v.to(k.dtype)], dim=-1), self.offsets, self.group)
            kf, vf = kv.split([k.shape[-1], v.shape[-1]], dim=-1)
            self._kv = (k, v, kf, vf.to(v.dtype))
        return self._kv[2], self._kv[3]

    def causal(self, q, k, v):
        kf, vf = self._gathered(k, v)
        if self.backend == "flex":
            return _flex_causal(q, kf, vf, self.block_mask, self.scale, self.compiled)
        if self.backend == "dense":
            mask = _mask(self.doc, self.rows, kf.shape[2])
            return _softmax_attend(q, kf, vf, mask, self.scale)
        return _chunked_causal(q, kf, vf, self.doc, self.rows, self.scale, self.block)

    def __call__(self, q, k0, v0, ks, vs):
        o0, lse0 = self.causal(q, k0, v0)
        if self.recompute_merge and ks:
            return merge_recomputed(o0, lse0, q, ks, vs, self.scale)
        return merge_diagonal(o0, lse0, q, ks, vs, self.scale)
