"""Long sequences on one GPU in query shards (train.shard_tokens): exact, activations O(shard).

A position's TTT steps see the other positions only through the step-0 keys and values (the
causal part of ttt_attention reads them; the diagonal is the position's own). So a packed
sequence of L tokens longer than `train.shard_tokens` trains as contiguous shards of query
rows, one after another, each a whole forward and backward, against the step-0 keys and
values of all L positions:

  1. hidden0 = fc(aux) of every position (its graph kept: it saves only the batch's aux), and
     the step-0 keys and values of every position without a graph, shard by shard: k_all,
     v_all, leaves whose gradients the shards sum;
  2. per shard [lo, hi): the teacher's p of its rows (from the draft vocabulary's rows of the
     target lm_head: loss.teacher_probs), the TTT unroll of its rows from hidden0[lo:hi]
     (step 0's causal attention reads k_all, v_all: ShardAttention), the fused soft CE,
     backward: the parameter gradients and those of k_all, v_all and hidden0's rows add up;
  3. step 0's keys and values recomputed shard by shard with their graph and back-propagated
     with the summed gradients, then hidden0 back through fc.

Memory: the batch, hidden0, k_all and v_all with their gradients (a few [L, H]) plus one
shard's unroll with the default options instead of every position's: at the Kimi shape a
128K-token sequence in 16K shards needs about what a 16K one does plus ~15 GiB (the model:
bench/memory_model.py). Compute: the unroll's own (no per-step recompute, unlike
checkpoint_ttt_steps), plus step 0's layer input projections twice more and its k/v
backward once more (phases 1 and 3) and the teacher's draft-vocabulary logits once more:
~2.5 GFLOP per token at the Kimi shape, 4.6 % of a 32K step, 3.2 % of a 128K one. The
valid counts, the objective and the gradients are the one-pass step's (sums over shards: their
order is the only difference, tests/eagle3/drafter/test_drafter_shards.py).

Not with idle-row skipping (every shard row runs every step: the rows without loss carry zero
weight, nothing changes), nor under DDP/FSDP (several backward passes per step; long samples
there: train.sequence_parallel).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from remote_agent.eagle3.drafter.model.loss import (
    HeadGrad,
    Teacher,
    soft_ce_scaled,
    teacher_probs,
)
from remote_agent.eagle3.drafter.model.memory import (
    check_handed_over,
    layer_weights,
    recomputed,
    unroll_casts,
)
from remote_agent.eagle3.drafter.model.merge import _merge_fn
from remote_agent.eagle3.drafter.model.model import StepInputs
from remote_agent.eagle3.drafter.model.ttt_attention import (
    BLOCK,
    TTTAttention,
    _chunked_causal,
    _flex_causal,
    _mask,
    _softmax_attend,
    flex_block_mask_range,
)
from remote_agent.eagle3.drafter.train.data import step_tokens


def shard_bounds(n: int, shard: int) -> list[tuple[int, int]]:
    """Contiguous query shards [lo, hi) of `shard` rows (the last one shorter)."""
    return [(lo, min(lo + shard, n)) for lo in range(0, n, shard)]


def applies(c, n: int) -> bool:
    """Whether forward_backward trains this batch in shards: train.shard_tokens set, the batch
    longer, one process (no DDP/FSDP: several backward passes per step)."""
    shard = int(getattr(c.tc, "shard_tokens", 0) or 0)
    return bool(shard) and n > shard and c.dist.world == 1


class ShardAttention(TTTAttention):
    """attention(q, k0, v0, ks, vs) of the query rows lo..hi-1 of a packed sequence: the causal
    part over the step-0 keys and values of every position (k_all, v_all), whatever k0, v0 the
    step passes (its own rows'); the TTT diagonal as TTTAttention's."""

    def __init__(
        self,
        doc: torch.Tensor,
        lo: int,
        hi: int,
        k_all: torch.Tensor,
        v_all: torch.Tensor,
        scale: float,
        backend: str = "chunked",
        block: int = BLOCK,
        compiled: bool = True,
        recompute_merge: bool = False,
        compile_merge: bool = False,
    ) -> None:
        if backend not in ("flex", "chunked", "dense"):
            raise ValueError(f"unknown attention backend {backend!r}")
        self.doc, self.scale, self.backend, self.block = doc, scale, backend, block
        self.compiled, self.recompute_merge = compiled, recompute_merge
        self.merge = _merge_fn(compile_merge)
        self.k_all, self.v_all = k_all, v_all
        self.rows = torch.arange(lo, hi, device=doc.device)
        self.block_mask = None
        if backend == "flex":
            self.block_mask = flex_block_mask_range(doc, lo, hi, compiled and doc.is_cuda)

    def causal(self, q, k, v):
        k, v = self.k_all, self.v_all
        if self.backend == "flex":
            return _flex_causal(q, k, v, self.block_mask, self.scale, self.compiled)
        if self.backend == "dense":
            return _softmax_attend(q, k, v, _mask(self.doc, self.rows, k.shape[2]), self.scale)
        return _chunked_causal(q, k, v, self.doc, self.rows, self.scale, self.block)


def _step0_keys(d, h0, emb0, positions, casts, bounds):
    """The step-0 keys and values of every position, shard by shard, without a graph."""
    layer = d.midlayer
    k_all = v_all = None
    with torch.no_grad(), layer_weights(layer, casts):
        for lo, hi in bounds:
            _, k, v, _ = layer.pre(h0[:, lo:hi], emb0[:, lo:hi], positions[:, lo:hi])
            if k_all is None or v_all is None:
                n = h0.shape[1]
                k_all = k.new_empty(k.shape[0], k.shape[1], n, k.shape[3])
                v_all = v.new_empty(v.shape[0], v.shape[1], n, v.shape[3])
            k_all[:, :, lo:hi] = k
            v_all[:, :, lo:hi] = v
    assert k_all is not None and v_all is not None
    return k_all.requires_grad_(), v_all.requires_grad_()


def sharded_forward_backward(
    c, b, aux: torch.Tensor, weights, scales: torch.Tensor, tch, draft_rows: torch.Tensor
):
    """step.forward_backward's unroll, loss and backward in query shards (the module
    docstring). aux: the step's aux (noise added); weights, scales: the loss weights and each
    TTT step's scale (weight / valid count) of the whole batch; tch: its teacher (argmax,
    in_draft); draft_rows: the draft vocabulary's rows of the target lm_head (each shard's p)."""
    tc, n, steps = c.tc, b.input_ids.shape[1], c.steps
    module: Any = getattr(c.model, "module", c.model)
    d: Any = module.drafter
    bounds = shard_bounds(n, int(tc.shard_tokens))
    tokens = b.embeds if b.embeds is not None else step_tokens(b.input_ids, steps)
    norm = partial(recomputed, d.norm) if module.recompute_elementwise else d.norm
    compile_merge = bool(tc.compile and aux.is_cuda)
    with c.autocast:
        casts = unroll_casts(d.midlayer, 0, module.cast_weights_once, module.embed_once)
        inputs = StepInputs(tokens) if tokens.is_floating_point() else d.step_inputs(tokens)
        hidden0 = d.project(aux)
        h0 = hidden0.detach().requires_grad_()
        emb0 = inputs.step(0, n)
        k_all, v_all = _step0_keys(d, h0, emb0, b.positions, casts, bounds)
    losses = [torch.zeros((), device=aux.device) for _ in range(steps)]
    args = [torch.full((n - 1 - k,), -1, dtype=torch.long, device=aux.device) for k in range(steps)]
    head: HeadGrad | None = None
    for lo, hi in bounds:
        attention = ShardAttention(
            b.doc, lo, hi, k_all, v_all, c.scale, c.backend,
            recompute_merge=module.recompute_elementwise, compile_merge=compile_merge,
        )  # fmt: skip
        top = min(n, hi + steps)  # the teachers of t+1+k for this shard's t
        p = teacher_probs(b.final[0, lo + 1 : top], draft_rows, tc.teacher_chunk, tc.teacher_fp32)
        terms = []
        with c.autocast:
            outs = d.ttt(
                aux, StepInputs(inputs.ext[:, lo : hi + steps]), b.positions[:, lo:hi],
                attention, steps, None, module.checkpoint_steps, casts, hidden0=h0[:, lo:hi],
                embed_once=module.embed_once,
            )  # fmt: skip
            for k, out in enumerate(outs):
                m = max(0, min(hi, n - 1 - k) - lo)  # this shard's t with a teacher at t+1+k
                h = norm(out[0, :m])
                if head is None:  # cast once; its gradient summed in fp32 over every use
                    head = HeadGrad(d.lm_head.weight, h.dtype, steps * len(bounds))
                term, loss_k, arg_k = soft_ce_scaled(
                    h, d.lm_head.weight, p[k : k + m], weights[k][lo : lo + m], scales[k],
                    head, module.loss_chunk, module.compile_loss,
                )  # fmt: skip
                terms.append(term)
                losses[k] = losses[k] + loss_k.detach()
                args[k][lo : lo + m] = arg_k
        del p, outs
        torch.stack(terms).sum().backward()
        del terms, attention
    if c.host_head is not None:  # the next teacher's lm_head: uploaded during what follows
        c.host_head.prefetch()
    # step 0's keys and values of every position once more, with their graph, and back
    gk, gv = k_all.grad, v_all.grad
    for lo, hi in bounds:
        if gk is None or gv is None:
            break
        with c.autocast, layer_weights(d.midlayer, casts):
            _, k, v, _ = d.midlayer.pre(h0[:, lo:hi], emb0[:, lo:hi], b.positions[:, lo:hi])
        torch.autograd.backward([k, v], [gk[:, :, lo:hi], gv[:, :, lo:hi]])
    if h0.grad is not None:
        hidden0.backward(h0.grad)
    if casts is not None:
        casts.finish()
    check_handed_over(casts, head)
    return losses, args, Teacher(None, tch.argmax, tch.in_draft)
