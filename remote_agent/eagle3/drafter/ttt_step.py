"""One optimisation step's forward and backward: teacher, TTT unroll, weighted soft CE.

`forward_backward` is the whole step short of the optimizer (shared with bench_train and
bench_long_context); `TTTStep` is the module data parallelism wraps; `RowPlan` says which
positions the steps >= 1 must compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from remote_agent.eagle3.distributed import Dist
from remote_agent.eagle3.drafter.data import step_targets
from remote_agent.eagle3.drafter.loss import soft_ce, teacher
from remote_agent.eagle3.drafter.memory import (
    SharedCasts,
    check_handed_over,
    recomputed,
    unroll_casts,
)
from remote_agent.eagle3.drafter.model import Eagle3Drafter
from remote_agent.eagle3.drafter.simulate import chain_depth
from remote_agent.eagle3.drafter.ttt_attention import TTTAttention


class TTTStep(nn.Module):
    """The wrapped module (DDP/FSDP): TTT unroll + per-step soft CE, all inside forward."""

    def __init__(
        self,
        drafter: Eagle3Drafter,
        steps: int,
        loss_chunk: int,
        checkpoint_steps: bool = False,
        loss_recompute: bool = False,
        cast_weights_once: bool = False,
        recompute_elementwise: bool = False,
        compile_loss: bool = False,
    ) -> None:
        super().__init__()
        self.drafter, self.steps, self.loss_chunk = drafter, steps, loss_chunk
        # long-sequence memory options (exact: same losses and gradients, more compute)
        self.checkpoint_steps, self.loss_recompute = checkpoint_steps, loss_recompute
        # the middle set (memory.py): exact, next to no extra compute
        self.cast_weights_once = cast_weights_once
        self.recompute_elementwise = recompute_elementwise
        self.compile_loss = compile_loss  # the soft CE's chunk math as compiled kernels
        self.casts: SharedCasts | None = None  # the last unroll's (checked after backward)

    def forward(self, aux, ids, positions, attention, p, weights, plan: RowPlan):
        """Per TTT step: (weighted CE sum, draft argmax per position; -1 where not computed)."""
        d = self.drafter
        self.casts = unroll_casts(d.midlayer, self.steps, self.cast_weights_once)
        outs = d.ttt(
            aux, ids, positions, attention, self.steps, plan.rows, self.checkpoint_steps, self.casts
        )
        norm = partial(recomputed, d.norm) if self.recompute_elementwise else d.norm
        n = aux.shape[1]
        losses, args = [], []
        w = None
        for k, out in enumerate(outs):
            pos, idx, m = plan.loss_rows[k], plan.out_index[k], n - 1 - k
            # position t uses the teacher of t+1+k
            if pos is None:  # every position: plain slices, no copies
                h, pk, wk = norm(out[0, :m]), p[1 + k : 1 + k + m], weights[k]
            else:
                h = norm(out[0].index_select(0, idx))
                pk, wk = p.index_select(0, pos + 1 + k), weights[k][pos]
            if w is None:  # cast the fp32 master once per step, not once per TTT step
                w = d.lm_head.weight.to(h.dtype)
            loss_k, arg_k = soft_ce(
                h, w, pk, wk, self.loss_chunk, self.loss_recompute, self.compile_loss
            )
            losses.append(loss_k)
            if pos is not None:
                arg_k = torch.full((m,), -1, device=arg_k.device).index_put((pos,), arg_k)
            args.append(arg_k)
        return losses, args


@dataclass
class RowPlan:
    """Which positions each TTT step computes (see ttt_attention: query rows).

    rows: positions steps >= 1 run on (None = all). loss_rows[k]: positions whose draft logits
    step k needs (loss weight > 0, or counted by the simulated acceptance; None = all of its
    n-1-k); out_index[k]: their rows in step k's output. Everything else has zero weight, so the
    loss, its gradients and the metrics equal those of the full computation.
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
            return cls(None, loss_rows, loss_rows)
        rows = later.nonzero().flatten()
        if rows.numel() == 0:
            rows = rows.new_zeros(1)  # keep one row: every parameter still gets a gradient
        # a step whose every position is needed has them first in `rows` (rows is sorted)
        out_index = [loss_rows[0]] + [
            None if r is None else torch.searchsorted(rows, r) for r in loss_rows[1:]
        ]
        return cls(rows, loss_rows, out_index)


@dataclass
class StepContext:
    """Everything one optimisation step needs besides the batch (shared with bench_train)."""

    model: nn.Module  # TTTStep, possibly DDP/FSDP-wrapped
    lm_head: torch.Tensor  # target lm_head [V, H]
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


def chain_starts(st, loss_mask: torch.Tensor, depth: int) -> torch.Tensor:
    """[L] bool: positions where a simulated chain of `depth` drafts starts on a supervised
    token and stays inside its document (what the simulated acceptance counts)."""
    n = loss_mask.shape[1]
    valid = torch.zeros(n, dtype=torch.bool, device=loss_mask.device)
    if depth:
        m = max(n - depth, 0)
        valid[:m] = st.valid[depth - 1][0, :m] & loss_mask[0, 2 : 2 + m]
    return valid


def forward_backward(c: StepContext, b, step: int) -> StepOut:
    """Teacher, TTT unroll, per-step soft CE normalised by valid tokens, backward."""
    tc, n = c.tc, b.input_ids.shape[1]
    st = step_targets(b, c.steps)
    tch = teacher(b.final[0], c.lm_head, c.draft_ids, c.t2d, tc.teacher_chunk, tc.teacher_fp32)
    # loss weight of step k at t: supervised, inside the document, teacher argmax drafted
    weights = []
    for k in range(c.steps):
        w = st.weight[k][0].clone()
        w[: n - 1 - k] &= tch.in_draft[1 + k :]
        weights.append(w[: n - 1 - k].float())
    counts = c.dist.all_reduce_sum(torch.stack([w.sum() for w in weights]))
    depth = min(chain_depth(tc.sim_steps, tc.sim_topk, tc.sim_draft_tokens), c.steps)
    sim_valid = chain_starts(st, b.loss_mask, depth)
    plan = RowPlan.build(weights, sim_valid, depth, tc.skip_idle_rows)
    aux = b.aux if c.bf16 else b.aux.float()
    if tc.noise_std > 0:  # relative to each token's RMS; seeded by (seed, step, rank)
        g = torch.Generator(device=aux.device).manual_seed(
            tc.seed * 1_000_003 + step * 1009 + c.dist.rank
        )
        rms = aux.float().pow(2).mean(-1, keepdim=True).sqrt()
        noise = torch.randn(aux.shape, generator=g, device=aux.device) * rms * tc.noise_std
        aux = (aux.float() + noise).to(aux.dtype)
    step_module = getattr(c.model, "module", c.model)  # DDP keeps it as .module
    merge = bool(getattr(step_module, "recompute_elementwise", False))
    attention = TTTAttention(
        b.doc, c.scale, c.backend, rows=plan.rows, recompute_merge=merge,
        compile_merge=tc.compile and aux.is_cuda,
    )  # fmt: skip
    with c.autocast:
        losses, args = c.model(aux, st.ids, b.positions, attention, tch.p, weights, plan)
    # normalised by the valid tokens of all ranks; DDP averages gradients over ranks
    world = c.dist.world
    total = sum(c.step_w[k] * losses[k] * world / counts[k].clamp(min=1) for k in range(c.steps))
    total.backward()
    check_handed_over(step_module.casts)
    step_module.casts = None  # its bf16 copies (1.4 GiB at the Kimi shape) die with the step
    return StepOut(losses, args, weights, counts, st, tch, sim_valid, plan)
