"""The TTT diagonal merge: the keys of steps 1..k at a position folded into its causal result.

ttt_attention.py splits a TTT step's attention into a causal part over the step-0 keys (which
also returns its log-sum-exp) and the "diagonal" (the position's own keys of the earlier steps),
merged here in closed form:

    out = (e^lse0 * o0 + sum_j e^s_j v_j) / (e^lse0 + sum_j e^s_j),   s_j = q . k_j * scale

in fp32 (`merge_diagonal`), as one torch.compile'd graph for every step count (`_merge_fn`), or
in blocks of positions recomputed in backward (`merge_recomputed`, memory.py's middle option
set: the fp32 stack never held whole). Every attention uses it: the single-process one
(ttt_attention.TTTAttention), query shards (train/shards.py) and sequence parallelism
(parallel/seq_attention.py).
"""

from __future__ import annotations

import torch

from remote_agent.eagle3.drafter.model.memory import recomputed


def _expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    rep = heads // x.shape[1]
    return x.repeat_interleave(rep, dim=1) if rep > 1 else x


def _acc(x: torch.Tensor) -> torch.dtype:
    """Accumulation dtype: at least fp32 (fp64 stays fp64 for gradient checks)."""
    return torch.promote_types(x.dtype, torch.float32)


def merge_diagonal(o0, lse0, q, ks, vs, scale: float) -> torch.Tensor:
    """Fold the per-position keys of steps 1..k into the causal result (fp32 merge)."""
    if not ks:
        return o0
    return merge_stacked(o0, lse0, q, torch.stack(ks, dim=3), torch.stack(vs, dim=3), scale)


def merge_stacked(o0, lse0, q, kst, vst, scale: float) -> torch.Tensor:
    """merge_diagonal with the earlier steps' keys and values stacked: [B, kv_heads, L, k, d]
    (one compiled graph serves every k)."""
    heads = q.shape[1]
    acc = _acc(q)
    qf = q.to(acc)
    s = (qf.unsqueeze(3) * _expand_kv(kst, heads).to(acc)).sum(-1) * scale  # [B, h, L, k]
    m = torch.maximum(lse0.to(acc), s.amax(-1))
    w0 = torch.exp(lse0.to(acc) - m)
    w = torch.exp(s - m.unsqueeze(-1))
    num = w0.unsqueeze(-1) * o0.to(acc) + (w.unsqueeze(-1) * _expand_kv(vst, heads).to(acc)).sum(-2)
    return (num / (w0 + w.sum(-1)).unsqueeze(-1)).to(q.dtype)


def _merge_fn(compiled: bool):
    """merge_diagonal, or the same with merge_stacked torch.compile'd (_merge_compiled)."""
    return _merge_compiled if compiled else merge_diagonal


def _merge_compiled(o0, lse0, q, ks, vs, scale: float) -> torch.Tensor:
    """merge_diagonal through one compiled graph for every number of earlier steps, length and
    row count (dynamic from the start, so under per-step checkpointing the recompute meets the
    forward's graph: loop.compile_layer); the stack stays outside it (its backward is views)."""
    from remote_agent.eagle3.drafter.model.compiled import compiled_once

    if not ks:
        return o0
    stacked = compiled_once(merge_stacked, dynamic=True)
    return stacked(o0, lse0, q, torch.stack(ks, dim=3), torch.stack(vs, dim=3), scale)


MERGE_ROWS = 4096  # positions per recomputed merge block: its fp32 insides exist per block only


def merge_recomputed(
    o0, lse0, q, ks, vs, scale: float, rows: int | None = None, merge=None
) -> torch.Tensor:
    """merge_diagonal (or `merge`, its compiled form) in blocks of positions, each
    kept as its inputs only and recomputed in backward. Every position's merge is its own (its
    query, the earlier steps' keys and values at that position), so the blocks give exactly the
    whole: at 100K tokens the seventh step's fp32 stack alone would be ~17 GiB, a 4,096-row
    block holds 0.7 GiB."""
    n, rows = q.shape[2], rows or MERGE_ROWS
    merge = merge or merge_diagonal  # or its compiled form (_merge_fn)
    parts = []
    for lo in range(0, n, rows):
        hi = min(lo + rows, n)
        block = [k[:, :, lo:hi] for k in ks], [v[:, :, lo:hi] for v in vs]
        parts.append(
            recomputed(merge, o0[:, :, lo:hi], lse0[:, :, lo:hi], q[:, :, lo:hi], *block, scale)
        )
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
