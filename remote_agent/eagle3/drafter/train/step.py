"""One optimisation step's forward and backward: teacher, TTT unroll, weighted soft CE.

Read it top to bottom: what a step takes besides the batch (`StepContext`) and what it gives
(`StepOut`), then the step itself, `forward_backward` (the whole step short of the optimizer;
loop.py calls it per batch, bench_train and bench_long_context too):

    teacher    the target's next-token distribution at every position, from the stored final
               hidden states and the target lm_head (`teacher_head`: uploaded first when it
               waits on the host)
    weights    per TTT step: supervised, inside the document, the teacher's argmax drafted;
               their counts over all ranks normalise each step's loss (`step_scales`)
    aux        the batch's aux states as trained (`step_aux`: dtype, train.noise_std)
    rows       which positions the steps >= 1 compute (`RowPlan`: idle rows skipped)
    unroll     `TTTStep`, the module data parallelism wraps: the TTT unroll and the fused soft
               CE of every step, inside forward
    backward   one backward of sum_k scale_k x loss_k; every shared cast handed over

and then its pieces, in the order it uses them. A batch longer than train.shard_tokens (one
process) runs the unroll in query shards instead (shards.py); under sequence parallelism every
rank runs its own rows (seq_parallel_step.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import torch
from torch import nn

from remote_agent.eagle3.distributed import Dist
from remote_agent.eagle3.drafter.model.loss import HeadGrad, soft_ce_scaled, teacher
from remote_agent.eagle3.drafter.model.memory import (
    HostWeight,
    SharedCasts,
    check_handed_over,
    recomputed,
    unroll_casts,
)
from remote_agent.eagle3.drafter.model.model import Eagle3Drafter, StepInputs
from remote_agent.eagle3.drafter.model.ttt_attention import TTTAttention
from remote_agent.eagle3.drafter.train import shards
from remote_agent.eagle3.drafter.train.data import step_targets, step_tokens
from remote_agent.eagle3.drafter.train.simulate import chain_depth


@dataclass
class StepContext:
    """Everything one optimisation step needs besides the batch (shared with bench_train)."""

    model: nn.Module  # TTTStep, possibly DDP/FSDP-wrapped
    lm_head: torch.Tensor | None  # target lm_head [V, H] on the device (None: host_head)
    draft_ids: torch.Tensor  # target ids of the draft vocabulary
    t2d: torch.Tensor
    steps: int
    step_w: list[float]
    scale: float
    backend: str
    autocast: Any
    bf16: bool
    dist: Dist
    tc: Any  # TrainSection
    # the frozen embedding kept on the host (train.embed_on_host): batches carry its rows
    # (Batch.embeds); None = on the device (the drafter's own)
    host_embed: torch.Tensor | None = None
    # the target lm_head between teachers on the host (train.lm_head_on_host, memory.HostWeight)
    host_head: HostWeight | None = None


@dataclass
class StepOut:
    losses: list[torch.Tensor]  # per TTT step: weighted CE sum (this rank)
    args: list[torch.Tensor]  # per TTT step: draft argmax (draft ids)
    weights: list[torch.Tensor]
    counts: torch.Tensor  # per TTT step: valid positions over all ranks
    targets: Any  # StepTargets
    teacher: Any  # Teacher
    sim_valid: torch.Tensor  # [L] bool: positions counted by the simulated acceptance
    plan: RowPlan


def forward_backward(c: StepContext, b, step: int) -> StepOut:
    """Teacher, TTT unroll, per-step soft CE normalised by valid tokens, backward. A batch
    longer than train.shard_tokens (one process) runs its unroll in query shards (shards.py)."""
    tc, n = c.tc, b.input_ids.shape[1]
    st = step_targets(b, c.steps)
    in_shards = shards.applies(c, n)
    # teacher: the target's distribution at every position, then its lm_head off the device
    head = teacher_head(c)
    tch = teacher(
        b.final[0], head, c.draft_ids, c.t2d, tc.teacher_chunk, tc.teacher_fp32,
        keep_p=not in_shards,  # shards make p of their own rows
    )  # fmt: skip
    draft_rows = head.index_select(0, c.draft_ids) if in_shards else None  # their p's rows
    del head
    if c.host_head is not None:  # back on the device during backward (TTTStep.backward_hook)
        c.host_head.release()
    # loss weight of step k at t: supervised, inside the document, teacher argmax drafted
    weights = []
    for k in range(c.steps):
        w = st.weight[k][0].clone()
        w[: n - 1 - k] &= tch.in_draft[1 + k :]
        weights.append(w[: n - 1 - k].float())
    counts = c.dist.all_reduce_sum(torch.stack([w.sum() for w in weights]))
    # the positions the simulated acceptance counts (a chain of `depth` drafts starts there)
    depth = min(chain_depth(tc.sim_steps, tc.sim_topk, tc.sim_draft_tokens), c.steps)
    sim_valid = chain_starts(st, b.loss_mask, depth)
    aux = step_aux(c, b, step)
    if in_shards:  # a long batch: unroll, loss and backward shard by shard
        assert draft_rows is not None
        scales = step_scales(c.step_w, counts, c.dist.world)
        losses, args, tch = shards.sharded_forward_backward(
            c, b, aux, weights, scales, tch, draft_rows
        )
        plan = RowPlan(None, [None] * c.steps, [None] * c.steps)  # every row ran every step
        return StepOut(losses, args, weights, counts, st, tch, sim_valid, plan)
    # rows: steps >= 1 only where some step has loss or the simulation counts the position
    plan = RowPlan.build(weights, sim_valid, depth, tc.skip_idle_rows)
    step_module = cast("TTTStep", getattr(c.model, "module", c.model))  # DDP keeps it as .module
    merge = bool(getattr(step_module, "recompute_elementwise", False))
    attention = TTTAttention(
        b.doc, c.scale, c.backend, rows=plan.rows, recompute_merge=merge,
        compile_merge=tc.compile and aux.is_cuda,
    )  # fmt: skip
    scales = step_scales(c.step_w, counts, c.dist.world)
    tokens = b.embeds if b.embeds is not None else step_tokens(b.input_ids, c.steps)
    hw = c.host_head
    step_module.backward_hook = None if hw is None else hw.prefetch_hook()
    # unroll: TTT steps and their fused soft CE, all inside the (wrapped) module's forward
    with c.autocast:
        terms, losses, args = c.model(
            aux, tokens, b.positions, attention, tch.p, weights, plan, scales
        )
    tch.p = None  # the fused loss needs the teacher in forward only: freed before backward
    # backward of the objective sum_k scale_k x loss_k
    torch.stack(terms).sum().backward()
    check_handed_over(step_module.casts, step_module.head)
    step_module.casts = step_module.head = step_module.backward_hook = None  # die with the step
    if hw is not None:
        hw.prefetch()  # (started by the hook already: nothing then)
    return StepOut(losses, args, weights, counts, st, tch, sim_valid, plan)


def teacher_head(c: StepContext) -> torch.Tensor:
    """The target lm_head on the device for the teacher (uploaded first if it is on the host)."""
    if c.host_head is not None:
        return c.host_head.get()
    if c.lm_head is None:
        raise ValueError("StepContext: no target lm_head (neither lm_head nor host_head)")
    return c.lm_head


def chain_starts(st, loss_mask: torch.Tensor, depth: int) -> torch.Tensor:
    """[L] bool: positions where a simulated chain of `depth` drafts starts on a supervised
    token and stays inside its document (what the simulated acceptance counts)."""
    n = loss_mask.shape[1]
    valid = torch.zeros(n, dtype=torch.bool, device=loss_mask.device)
    if depth:
        m = max(n - depth, 0)
        valid[:m] = st.valid[depth - 1][0, :m] & loss_mask[0, 2 : 2 + m]
    return valid


def step_aux(c: StepContext, b, step: int) -> torch.Tensor:
    """The batch's aux states as the step uses them: fp32 unless bf16, plus train.noise_std
    noise relative to each token's RMS, seeded by (seed, step, rank)."""
    tc = c.tc
    aux = b.aux if c.bf16 else b.aux.float()
    if tc.noise_std > 0:
        g = torch.Generator(device=aux.device).manual_seed(
            tc.seed * 1_000_003 + step * 1009 + c.dist.rank
        )
        rms = aux.float().pow(2).mean(-1, keepdim=True).sqrt()
        noise = torch.randn(aux.shape, generator=g, device=aux.device) * rms * tc.noise_std
        aux = (aux.float() + noise).to(aux.dtype)
    return aux


def step_scales(step_w: list[float], counts: torch.Tensor, world: int) -> torch.Tensor:
    """[steps] fp32: step k's loss weight over the valid positions of all ranks, times the
    world size (DDP averages gradients over ranks): the objective is sum_k scale_k x loss_k."""
    w = torch.tensor(step_w, dtype=torch.float32, device=counts.device)
    return w * world / counts.float().clamp(min=1)


@dataclass
class RowPlan:
    """Which positions each TTT step computes (see ttt_attention: query rows).

    rows: positions steps >= 1 run on (None = all). loss_rows[k]: positions whose draft logits
    step k needs (loss weight > 0, or counted by the simulated acceptance; None = all of its
    n-1-k; also when all steps run on every position and step k needs more than 1 - MIN_SAVING
    of its rows); out_index[k]: their rows in step k's output. Everything else has zero
    weight, so the loss, its gradients and the metrics equal those of the full computation.
    """

    rows: torch.Tensor | None
    loss_rows: list[torch.Tensor | None]
    out_index: list[torch.Tensor | None]

    MIN_SAVING = 0.1  # run steps >= 1 on a subset only when it drops at least this share

    @classmethod
    def build(
        cls, weights: list[torch.Tensor], sim_valid: torch.Tensor, depth: int, skip: bool
    ) -> RowPlan:
        n = sim_valid.numel()
        if not skip:
            return cls(None, [None] * len(weights), [None] * len(weights))
        need = [w > 0 for w in weights]
        for k in range(depth):
            need[k] |= sim_valid[: need[k].numel()]
        later = torch.zeros(n, dtype=torch.bool, device=sim_valid.device)
        for m in need[1:]:
            later[: m.numel()] |= m
        *counts, n_later = torch.stack([m.sum() for m in need] + [later.sum()]).tolist()  # 1 sync
        loss_rows = [
            None if c == m.numel() else m.nonzero().flatten()
            for c, m in zip(counts, need, strict=True)
        ]
        if n_later > (1 - cls.MIN_SAVING) * n:
            # every step runs on all positions: a step that needs nearly all of its rows takes
            # the plain slice (the others carry zero weight: nothing changes) instead of an
            # index_select copy of its output that the loss norm would keep for backward
            dense = [
                None if c > (1 - cls.MIN_SAVING) * m.numel() else r
                for c, m, r in zip(counts, need, loss_rows, strict=True)
            ]
            return cls(None, dense, dense)
        rows = later.nonzero().flatten()
        if rows.numel() == 0:
            rows = rows.new_zeros(1)  # keep one row: every parameter still gets a gradient
        # a step whose every position is needed has them first in `rows` (rows is sorted)
        out_index = [loss_rows[0]] + [
            None if r is None else torch.searchsorted(rows, r) for r in loss_rows[1:]
        ]
        return cls(rows, loss_rows, out_index)


class TTTStep(nn.Module):
    """The wrapped module (DDP/FSDP): TTT unroll + per-step soft CE, all inside forward."""

    def __init__(
        self,
        drafter: Eagle3Drafter,
        steps: int,
        loss_chunk: int,
        checkpoint_steps: bool = False,
        cast_weights_once: bool = False,
        recompute_elementwise: bool = False,
        compile_loss: bool = False,
        embed_once: bool = False,
    ) -> None:
        super().__init__()
        self.drafter, self.steps, self.loss_chunk = drafter, steps, loss_chunk
        # long-sequence memory option (exact: same losses and gradients, more compute)
        self.checkpoint_steps = checkpoint_steps
        # the middle set (memory.py): exact, next to no extra compute
        self.cast_weights_once = cast_weights_once
        self.recompute_elementwise = recompute_elementwise
        self.compile_loss = compile_loss  # the soft CE's chunk math as compiled kernels
        # the input projections' embedding half once per unroll (model.ttt): exact to rounding
        self.embed_once = embed_once
        self.casts: SharedCasts | None = None  # the last unroll's (checked after backward)
        self.head: HeadGrad | None = None  # the last unroll's shared lm_head
        # a gradient hook on the output of TTT step steps - 5 (step 2 of 7; forward_backward:
        # the teacher's lm_head back to the device once the backward of the later steps freed
        # more than it takes, with three steps' backward left for the upload)
        self.backward_hook: Callable[[torch.Tensor], None] | None = None

    @classmethod
    def for_training(cls, drafter: Eagle3Drafter, tc, cast_once: bool, compiled: bool) -> TTTStep:
        """The step module as `eagle3 train` runs it: TrainSection's options, with
        cast_weights_once and compile as loop.resolved_options resolved them."""
        return cls(
            drafter, tc.ttt_steps, tc.loss_chunk, tc.checkpoint_ttt_steps, cast_once,
            tc.recompute_elementwise, tc.compile_loss and compiled, tc.embed_once,
        )  # fmt: skip

    def forward(self, aux, tokens, positions, attention, p, weights, plan: RowPlan, scales):
        """Per TTT step: (scale x weighted CE sum: the objective's terms, weighted CE sum, draft
        argmax per position; -1 where not computed). tokens: data.step_tokens of the batch
        ([1, L + steps] ids, looked up once here) or their embeddings (Batch.embeds, gathered
        on the host). scales [steps] fp32: each step's weight over its valid count (times the
        world size under DDP's mean)."""
        d = self.drafter
        self.casts = unroll_casts(d.midlayer, self.steps, self.cast_weights_once, self.embed_once)
        inputs = StepInputs(tokens) if tokens.is_floating_point() else d.step_inputs(tokens)
        outs = d.ttt(
            aux, inputs, positions, attention, self.steps, plan.rows, self.checkpoint_steps,
            self.casts, embed_once=self.embed_once,
        )  # fmt: skip
        if self.backward_hook is not None and outs[0].requires_grad:
            outs[max(0, len(outs) - 5)].register_hook(self.backward_hook)
        norm = partial(recomputed, d.norm) if self.recompute_elementwise else d.norm
        n = aux.shape[1]
        terms, losses, args = [], [], []
        self.head = None
        for k, out in enumerate(outs):
            pos, idx, m = plan.loss_rows[k], plan.out_index[k], n - 1 - k
            # position t uses the teacher of t+1+k
            if pos is None:  # every position: plain slices, no copies
                h, pk, wk = norm(out[0, :m]), p[1 + k : 1 + k + m], weights[k]
            else:
                h = norm(out[0].index_select(0, idx))
                pk, wk = p.index_select(0, pos + 1 + k), weights[k][pos]
            if self.head is None:  # the lm_head cast once per step and shared by the TTT steps
                self.head = HeadGrad(d.lm_head.weight, h.dtype, self.steps)
            term, loss_k, arg_k = soft_ce_scaled(
                h, d.lm_head.weight, pk, wk, scales[k], self.head, self.loss_chunk,
                self.compile_loss,
            )  # fmt: skip
            terms.append(term)
            losses.append(loss_k)
            if pos is not None:
                arg_k = torch.full((m,), -1, device=arg_k.device).index_put((pos,), arg_k)
            args.append(arg_k)
        return terms, losses, args
