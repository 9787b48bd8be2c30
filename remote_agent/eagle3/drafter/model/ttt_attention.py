"""Attention across training-time-test steps, without a dense mask per step.

At TTT step k the query at packed position t attends to

    * the step-0 keys at positions j <= t of the same document (causal + document mask), and
    * the keys of steps 1..k at position t itself (the "diagonal"),

which is what the query of draft step k sees in SGLang's chain (target context + the earlier
draft tokens). SpecForge concatenates the K/V of all steps (KV length L*(k+1)) under one flex
mask. Here the two parts are split: one causal/document attention over the step-0 keys that
also returns its log-sum-exp, and the diagonal terms (k dot products per position) merged in
closed form (merge.py):

    out = (e^lse0 * o0 + sum_j e^s_j v_j) / (e^lse0 + sum_j e^s_j),   s_j = q . k_j * scale

so a step costs one causal attention plus O(L*k*d), and the block mask (built once per batch)
is shared by every step.

Query rows. A position's step-k query depends on the step-0 keys and on its own earlier steps
only, never on another position's steps 1..k. So steps >= 1 can run on a subset of positions
(`rows`: those that carry loss or the acceptance metric; the trainer passes them) and give
exactly the values and gradients they would have in the full unroll. The causal part then takes
queries for `rows` only (q has len(rows) rows) against all step-0 keys.

Backends for the causal part (all return (out, lse) with gradients through both):
    flex     torch flex_attention with a document block mask (CUDA; compiled)
    chunked  pure torch, query blocks with recomputation (memory O(block x L); CPU fallback)
    dense    the plain formula with a full mask (reference for tests)
"""

from __future__ import annotations

import torch

from remote_agent.eagle3.drafter.model.merge import _acc, _expand_kv, _merge_fn, merge_recomputed

BLOCK = 128


def doc_ids_from_lengths(lengths: list[int], total: int, device=None) -> torch.Tensor:
    """[total] document id per packed position; padding after the documents is one more doc."""
    ids = torch.full((total,), len(lengths), dtype=torch.int32, device=device)
    start = 0
    for i, n in enumerate(lengths):
        ids[start : start + n] = i
        start += n
    return ids


class TTTAttention:
    """Callable attention(q, k0, v0, ks, vs) for one packed batch (doc ids [B, L])."""

    def __init__(
        self,
        doc: torch.Tensor,
        scale: float,
        backend: str = "chunked",
        block: int = BLOCK,
        compiled: bool = True,
        rows: torch.Tensor | None = None,
        recompute_merge: bool = False,
        compile_merge: bool = False,
    ):
        self.doc = doc
        # merge.merge_recomputed (memory.py's option): the fp32 merge keeps only its inputs
        # and is recomputed in backward
        self.recompute_merge = recompute_merge
        # the merge as fused kernels (the trainer's compile on CUDA): eager, it is ~20 fp32
        # passes over [heads, L, d] per earlier step, forward and backward
        self.merge = _merge_fn(compile_merge)
        self.compiled = compiled  # eager flex (tests on CPU) materialises the scores
        self.scale = scale
        self.backend = backend
        self.block = block
        n = doc.shape[1]
        self.all_rows = torch.arange(n, device=doc.device)
        if rows is not None and (doc.shape[0] != 1 or rows.ndim != 1 or rows.numel() == 0):
            raise ValueError("query rows need one packed sequence (doc [1, L]) and rows [R > 0]")
        if rows is not None and bool((rows[1:] <= rows[:-1]).any()):
            raise ValueError("query rows must be strictly increasing positions")
        self.rows = rows
        self.block_mask = self.rows_mask = None
        if backend == "flex":  # built directly for packed documents (no compile, no L x L)
            compile_mask = compiled and doc.is_cuda
            self.block_mask = _flex_block_mask(doc, None, compile_mask)
            if rows is not None:
                self.rows_mask = _flex_block_mask(doc, rows, compile_mask)
        elif backend not in ("chunked", "dense"):
            raise ValueError(f"unknown attention backend {backend!r}")

    def causal(self, q, k, v):
        """(out, lse) of queries q (all L positions, or len(rows) rows) over the step-0 keys."""
        n, m = k.shape[2], q.shape[2]
        if m == n:
            rows, block_mask = self.all_rows, self.block_mask
        elif self.rows is not None and m == self.rows.numel():
            rows, block_mask = self.rows, self.rows_mask
        else:
            given = "" if self.rows is None else f" or {self.rows.numel()}"
            raise ValueError(f"{m} query rows: expected {n}{given}")
        if self.backend == "flex":
            if m == n:
                return _flex_causal(q, k, v, block_mask, self.scale, self.compiled)
            # flex wants L query rows: scatter the subset into place; rows outside it attend to
            # their own key only (block mask), so their blocks cost almost nothing
            full = q.new_zeros(q.shape[0], q.shape[1], n, q.shape[3]).index_copy(2, rows, q)
            out, lse = _flex_causal(full, k, v, block_mask, self.scale, self.compiled)
            return out.index_select(2, rows), lse.index_select(2, rows)
        if self.backend == "dense":
            return _softmax_attend(q, k, v, _mask(self.doc, rows, n), self.scale)
        return _chunked_causal(q, k, v, self.doc, rows, self.scale, self.block)

    def __call__(self, q, k0, v0, ks, vs):
        o0, lse0 = self.causal(q, k0, v0)
        if not ks:
            return o0
        if self.recompute_merge:
            return merge_recomputed(o0, lse0, q, ks, vs, self.scale, merge=self.merge)
        return self.merge(o0, lse0, q, ks, vs, self.scale)


def _mask(doc: torch.Tensor, qpos: torch.Tensor, k_hi: int) -> torch.Tensor:
    """[B, 1, q, k] causal + same-document mask for queries at positions qpos, keys 0..k_hi-1."""
    ki = torch.arange(0, k_hi, device=doc.device)
    causal = ki.unsqueeze(0) <= qpos.unsqueeze(1)
    same = doc[:, qpos].unsqueeze(-1) == doc[:, :k_hi].unsqueeze(-2)
    return (causal.unsqueeze(0) & same).unsqueeze(1)


def _softmax_attend(q, k, v, mask, scale):
    heads, acc = q.shape[1], _acc(q)
    s = (q.to(acc) @ _expand_kv(k, heads).to(acc).transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    return (p @ _expand_kv(v, heads).to(acc)).to(q.dtype), lse


def _chunk_fn(q_blk, k, v, doc, qpos, scale):
    hi = int(qpos[-1]) + 1  # rows are increasing: the last one sees the most keys
    return _softmax_attend(q_blk, k[:, :, :hi], v[:, :, :hi], _mask(doc, qpos, hi), scale)


def _chunked_causal(q, k, v, doc, rows, scale, block):
    """Query blocks; each sees keys up to its last row; recomputed in backward (no L^2 saved)."""
    from torch.utils.checkpoint import checkpoint

    m = q.shape[2]
    outs, lses = [], []
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    for lo in range(0, m, block):
        hi = min(lo + block, m)
        args = (q[:, :, lo:hi], k, v, doc, rows[lo:hi], scale)
        if grad:
            o, lse = checkpoint(_chunk_fn, *args, use_reentrant=False)
        else:
            o, lse = _chunk_fn(*args)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


# -- flex attention --------------------------------------------------------------------------


def _flex_fn(compiled: bool = True):
    """flex_attention compiled once per process, static shapes: one compile per sequence length
    (eager flex materialises the full scores)."""
    from torch.nn.attention.flex_attention import flex_attention

    from remote_agent.eagle3.drafter.model.compiled import compiled_once

    return compiled_once(flex_attention, dynamic=False) if compiled else flex_attention


def _flex_block_mask(doc: torch.Tensor, rows: torch.Tensor | None, compile_mask: bool = False):
    """Causal + document mask; with `rows`, query positions outside them see only their own key.

    Packed documents (doc ids non-decreasing along positions, as data.py and
    doc_ids_from_lengths make them) get their BlockMask built directly from per-block document
    ranges (`_doc_block_mask`): the same tensors create_block_mask returns, never a dense [L, L]
    mask and never a compile. create_block_mask under torch.compile costs a compile per new
    length, and one with a cliff: on torch 2.11 its argsort over the key blocks is lowered to a
    Triton persistent sort for up to 256 blocks (pytorch issues 182060/182745), whose cold
    compile took minutes at 16K tokens (128 blocks; bench/results/long-context.json:
    250 s in the first 16K step of 2026-12-02). Any other doc layout: create_block_mask
    (compiled when `compile_mask`, which avoids the dense [L, L] mask eager flex would build)."""
    from torch.nn.attention.flex_attention import create_block_mask

    b, n = doc.shape
    if rows is None:

        def mask_mod(bi, h, qi, ki):
            return (ki <= qi) & (doc[bi, qi] == doc[bi, ki])

        keep = None
    else:
        keep = torch.zeros(n, dtype=torch.bool, device=doc.device)
        keep[rows] = True

        def mask_mod(bi, h, qi, ki):
            return ((ki <= qi) & (doc[bi, qi] == doc[bi, ki]) & keep[qi]) | (ki == qi)

    if n == 0 or bool((doc[:, 1:] >= doc[:, :-1]).all()):
        return _doc_block_mask(doc, keep, mask_mod)
    return create_block_mask(mask_mod, b, None, n, n, device=doc.device, _compile=compile_mask)


def _doc_block_mask(
    doc: torch.Tensor,
    keep: torch.Tensor | None,
    mask_mod,
    block: int = BLOCK,
    q_range: tuple[int, int] | None = None,
):
    """BlockMask of mask_mod (causal + same document, optionally only kept query rows plus the
    diagonal) from block statistics: O((L / block)^2) booleans, eager, no compile.

    With doc ids non-decreasing, for key block kb before query block qb a pair is visible iff
    its two positions share a document, i.e. iff the last document of kb (its max id) is the
    first one (among the kept rows) of qb; every pair is visible iff kb's first document is
    qb's last and qb has no padding and every row kept. Diagonal blocks always hold (q, q) and
    are never full (keys after the query). Partial = some but not all visible, as
    create_block_mask counts them (positions past L are invisible), so the result equals its
    tensors (tests/eagle3/drafter/test_drafter_long_memory.py). q_range (lo, hi): the query
    rows are positions lo..hi-1 only (block-aligned: lo a multiple of `block`, hi too or L),
    keys all L positions: the rows of those query blocks (shards.py)."""
    from torch.nn.attention.flex_attention import BlockMask

    b, n = doc.shape
    nb = -(-n // block)
    pad = nb * block - n
    big = 1 << 40  # past any doc id (int32), exact as the float pad value
    d = doc.long()
    dmin = torch.nn.functional.pad(d, (0, pad), value=big).view(b, nb, block).amin(-1)
    dmax = torch.nn.functional.pad(d, (0, pad), value=-big).view(b, nb, block).amax(-1)
    if keep is None:
        kmin = dmin
        kept = torch.ones(n, dtype=torch.bool, device=doc.device)
    else:
        kmin = torch.where(keep, d, big)
        kmin = torch.nn.functional.pad(kmin, (0, pad), value=big).view(b, nb, block).amin(-1)
        kept = keep
    # every row of the query block is a real, kept position (padding rows see nothing)
    whole = torch.nn.functional.pad(kept, (0, pad), value=False).view(nb, block).all(-1)
    idx = torch.arange(nb, device=doc.device)
    below = idx[None, :] < idx[:, None]  # [qb, kb]: key block before the query block
    diag = idx[None, :] == idx[:, None]
    some = diag | (below & (dmax[:, None, :] == kmin[:, :, None]))
    full = below & whole[:, None] & (dmin[:, None, :] == dmax[:, :, None])
    partial = some & ~full

    def ordered(m: torch.Tensor):
        m = m.to(torch.int32).unsqueeze(1)  # [B, 1, nq, nkv]
        num = m.sum(-1).to(torch.int32)
        return num, torch.argsort(m, dim=-1, descending=True, stable=True).to(torch.int32)

    q_len = n
    if q_range is not None:
        lo, hi = q_range
        partial, full, q_len = (
            partial[:, lo // block : -(-hi // block)],
            full[:, lo // block : -(-hi // block)],
            hi - lo,
        )
    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=(block, block),
        mask_mod=mask_mod,
        seq_lengths=(q_len, n),
    )


def flex_block_mask_range(doc: torch.Tensor, lo: int, hi: int, compile_mask: bool = False):
    """The causal + document mask of the query rows lo..hi-1 (a shard of the sequence, B = 1)
    over the keys of all L positions: flex then runs Q = hi - lo rows against K = L, the key
    blocks past a query block (and other documents') skipped. lo must be a multiple of BLOCK
    and hi too (or L), so every query block is a block of the whole sequence's mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    b, n = doc.shape
    if lo % BLOCK or (hi % BLOCK and hi != n) or not 0 <= lo < hi <= n:
        raise ValueError(
            f"query rows {lo}..{hi} of {n}: shard borders must be multiples of {BLOCK}"
        )
    off = torch.tensor(lo, device=doc.device)  # a tensor: one compiled kernel for every shard

    def mask_mod(bi, h, qi, ki):
        return (ki <= qi + off) & (doc[bi, qi + off] == doc[bi, ki])

    if n == 0 or bool((doc[:, 1:] >= doc[:, :-1]).all()):
        return _doc_block_mask(doc, None, mask_mod, q_range=(lo, hi))
    return create_block_mask(
        mask_mod, b, None, hi - lo, n, device=doc.device, _compile=compile_mask
    )


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _flex_causal(q, k, v, block_mask, scale, compiled=True):
    heads = q.shape[1]
    dv = v.shape[-1]
    if q.shape[-1] != dv:  # MLA (192 / 128): both padded to one power of two, as measured
        # zero padding leaves q.k unchanged (scale is explicit); padded value columns sliced off
        d = _pow2(max(q.shape[-1], dv))
        q = torch.nn.functional.pad(q, (0, d - q.shape[-1]))
        k = torch.nn.functional.pad(k, (0, d - k.shape[-1]))
        v = torch.nn.functional.pad(v, (0, d - dv))
    # equal widths (Llama: 112) go in as they are: flex rounds a non-power-of-two head width up
    # inside its kernels (masked loads; SpecForge 0.2.0 runs 112 so on the same torch). Padding
    # here made a 128-wide copy of q, k0 and v0 per TTT step that flex kept for backward (7 x 3
    # x 64 MiB at 4K, +1.4 GiB with the padded outputs) and their gradients' copies back.
    out, lse = _flex_fn(compiled)(
        q,
        k,
        v,
        block_mask=block_mask,
        scale=scale,
        enable_gqa=k.shape[1] != heads,
        return_lse=True,
    )
    return out[..., :dv], lse.float()


def pick_backend(requested: str, device: torch.device) -> str:
    if requested != "auto":
        return requested
    return "flex" if device.type == "cuda" else "chunked"
