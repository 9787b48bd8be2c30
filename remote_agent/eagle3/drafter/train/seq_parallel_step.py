"""Sequence parallelism as a `train` option (`train.sequence_parallel: true`, under torchrun).

Every rank loads the same packed batch (the data plan of one rank) and trains its contiguous
share of the positions (seq_attention.split_offsets: any rank count, uneven shares): the teacher
of its rows plus a halo of `ttt_steps` final states, the TTT unroll of its rows (the causal
attention all-gathers the step-0 keys and values: seq_attention.SeqParallelAttention), the soft
CE of its rows normalised by the valid counts of all ranks, backward; then the parameter
gradients are summed over ranks (one all-reduce) and every rank takes the same optimizer step.
The sum equals the single-rank step's gradient, so a run on N ranks trains what one rank would
(tests/eagle3/drafter/test_drafter_seq_parallel_train.py: the real `train` entry point under
torchrun on 2 and 3 gloo ranks against one rank). Memory per rank: activations O(L / N), plus
the gathered step-0 K/V and the batch's small per-position tensors. Collectives per step: one
all-gather of the step-0 K/V (also under per-step checkpointing), one reduce-scatter of its
gradient, the valid counts, and one in-place all-reduce per parameter gradient.

The result is a step.StepOut over the whole batch in which rows of other ranks carry no weight
(argmax -1, chain starts off), so the metrics window sums every rank's share exactly once.
Attention: the trainer's kernel (sp_split): flex (the GPU's) with rank borders on its
128-position blocks, chunked where a batch has fewer blocks than ranks (or on CPU), or dense.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from remote_agent.eagle3.distributed import Dist
from remote_agent.eagle3.drafter.model.loss import HeadGrad, Teacher, soft_ce_scaled, teacher
from remote_agent.eagle3.drafter.model.memory import check_handed_over, recomputed, unroll_casts
from remote_agent.eagle3.drafter.model.model import StepInputs
from remote_agent.eagle3.drafter.model.ttt_attention import BLOCK
from remote_agent.eagle3.drafter.parallel.seq_attention import SeqParallelAttention, split_offsets
from remote_agent.eagle3.drafter.train.config import TrainSection
from remote_agent.eagle3.drafter.train.data import StepTargets, step_targets, step_tokens
from remote_agent.eagle3.drafter.train.simulate import chain_depth
from remote_agent.eagle3.drafter.train.step import (
    RowPlan,
    StepContext,
    StepOut,
    TTTStep,
    chain_starts,
    step_scales,
    teacher_head,
)


def sp_split(backend: str, n: int, world: int) -> tuple[str, list[int]]:
    """(kernel, rank borders) of an n-position batch: the trainer's kernel, flex with borders on
    its 128-position blocks where every rank gets one, else chunked on near-equal shares."""
    if backend == "flex" and -(-n // BLOCK) >= world:
        return "flex", split_offsets(n, world, BLOCK)
    return (backend if backend == "dense" else "chunked"), split_offsets(n, world)


def sp_forward_backward(c: StepContext, b, step: int, block: int = BLOCK, group=None) -> StepOut:
    """step.forward_backward of this rank's rows (B = 1, no idle-row skipping); block: the
    chunked kernel's query block."""
    tc, n, steps = c.tc, b.input_ids.shape[1], c.steps
    rank = dist.get_rank(group)
    kernel, offsets = sp_split(c.backend, n, dist.get_world_size(group))
    lo, hi = offsets[rank], offsets[rank + 1]
    module: Any = getattr(c.model, "module", c.model)  # the TTTStep: drafter, memory options
    d: Any = module.drafter
    dev = b.input_ids.device
    st = step_targets(b, steps)
    top = min(n, hi + steps)  # the teachers of t+1+k for this rank's t
    part = teacher(
        b.final[0, lo:top], teacher_head(c), c.draft_ids, c.t2d, tc.teacher_chunk,
        tc.teacher_fp32,
    )  # fmt: skip
    argmax = torch.full((n,), -2, dtype=torch.long, device=dev)  # never a draft id: no hit
    argmax[lo:top] = part.argmax
    in_draft = torch.zeros(n, dtype=torch.bool, device=dev)
    in_draft[lo:top] = part.in_draft
    own = torch.zeros(1, n, dtype=torch.bool, device=dev)
    own[0, lo:hi] = True
    weights = []
    for k in range(steps):
        w = st.weight[k][0] & own[0]
        w[: n - 1 - k] &= in_draft[1 + k :]
        weights.append(w[: n - 1 - k].float())
    counts = torch.stack([w.sum() for w in weights])
    dist.all_reduce(counts, group=group)
    depth = min(chain_depth(tc.sim_steps, tc.sim_topk, tc.sim_draft_tokens), steps)
    sim_valid = chain_starts(st, b.loss_mask, depth) & own[0]
    aux = b.aux if c.bf16 else b.aux.float()
    if tc.noise_std > 0:  # the single-rank step's noise (rank 0's seed), this rank's rows of it
        g = torch.Generator(device=aux.device).manual_seed(tc.seed * 1_000_003 + step * 1009)
        rms = aux.float().pow(2).mean(-1, keepdim=True).sqrt()
        noise = torch.randn(aux.shape, generator=g, device=aux.device) * rms * tc.noise_std
        aux = (aux.float() + noise).to(aux.dtype)
    attention = SeqParallelAttention(
        b.doc, offsets, c.scale, kernel, block, group,
        recompute_merge=module.recompute_elementwise,
    )  # fmt: skip
    # the single-rank objective: gradients are summed over ranks (not averaged), so world 1
    scales = step_scales(c.step_w, counts, 1)
    terms, losses, args = [], [], []
    head = None
    p_all = part.p
    assert p_all is not None  # the teacher's p, freed after the forward below
    with c.autocast:
        casts = unroll_casts(d.midlayer, steps, module.cast_weights_once, module.embed_once)
        # step k at t reads row 1+k+t of the batch's step tokens: this rank's rows lo..hi+steps
        inputs = (
            StepInputs(b.embeds[:, lo : hi + steps]) if b.embeds is not None
            else d.step_inputs(step_tokens(b.input_ids, steps)[:, lo : hi + steps])
        )  # fmt: skip
        outs = d.ttt(
            aux[:, lo:hi], inputs, b.positions[:, lo:hi], attention, steps,
            None, module.checkpoint_steps, casts, embed_once=module.embed_once,
        )  # fmt: skip
        norm = partial(recomputed, d.norm) if module.recompute_elementwise else d.norm
        for k in range(steps):
            m = max(0, min(hi, n - 1 - k) - lo)  # this rank's t with a teacher at t+1+k
            h = norm(outs[k][0, :m])
            if head is None:  # cast once, the gradient summed in fp32 over the steps
                head = HeadGrad(d.lm_head.weight, h.dtype, steps)
            term, loss, arg = soft_ce_scaled(
                h, d.lm_head.weight, p_all[1 + k : 1 + k + m], weights[k][lo : lo + m],
                scales[k], head, module.loss_chunk, module.compile_loss,
            )  # fmt: skip
            terms.append(term)
            losses.append(loss)
            full = torch.full((n - 1 - k,), -1, dtype=torch.long, device=dev)
            full[lo : lo + m] = arg
            args.append(full)
    part.p = p_all = None  # needed in forward only (the fused soft CE)
    torch.stack(terms).sum().backward()
    check_handed_over(casts, head)
    mine = StepTargets(st.ids, [w & own for w in st.weight], [v & own for v in st.valid])
    plan = RowPlan(None, [None] * steps, [None] * steps)
    return StepOut(
        losses, args, weights, counts, mine, Teacher(None, argmax, in_draft), sim_valid, plan
    )


def seq_parallel_step(drafter, b, lm_head, steps: int, step_w: list[float], **kw):
    """One packed sequence's TTT loss split across ranks, backward included (B = 1): the
    trainer's step (sp_forward_backward) for a bare drafter in fp32.

    Returns (per-step weighted CE sums over all ranks, valid counts); after it, the parameter
    gradients all-reduced with SUM equal the single-rank step's (step.forward_backward
    without idle-row skipping). kw: backend, block, loss_chunk, teacher_chunk, group,
    checkpoint (per-step activation checkpointing).
    """
    group = kw.get("group")
    tc = TrainSection(
        ttt_steps=steps, skip_idle_rows=False, loss_chunk=kw.get("loss_chunk", 2048),
        teacher_chunk=kw.get("teacher_chunk", 1024), device="cpu",
    )  # fmt: skip
    ctx = StepContext(
        TTTStep(drafter, steps, tc.loss_chunk, checkpoint_steps=kw.get("checkpoint", False)),
        lm_head, drafter.draft_ids(), drafter.t2d, steps,
        step_w, drafter.midlayer.self_attn.scale, kw.get("backend", "chunked"), nullcontext(),
        False, Dist(dist.get_rank(group), dist.get_world_size(group)), tc,
    )  # fmt: skip
    out = sp_forward_backward(ctx, b, 0, kw.get("block", BLOCK), group)
    sums = torch.stack([x.detach() for x in out.losses])
    dist.all_reduce(sums, group=group)
    return sums, out.counts


def all_reduce_grads(params: Sequence[torch.Tensor], group=None) -> None:
    """Sums the gradients over ranks, each in place (no flat copy of all of them: +4.6 GiB
    per rank at the Kimi shape); a missing one counts 0."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, group=group)
