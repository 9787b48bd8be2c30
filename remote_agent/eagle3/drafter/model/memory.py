"""Exact memory savings of the TTT unroll that cost (almost) no compute: the middle option set.

Where 4K equal work's memory goes (Kimi shape; bench/memory_breakdown.py and the arithmetic in
the README): besides the fp32 masters, gradients and AdamW states (~17 GiB, as SpecForge's), per
TTT step autograd keeps

  * a bf16 copy of every matrix of the layer (q/k/v/o, gate/up/down: 1.41 GiB per step): under
    torch.compile the autocast cast is inside the compiled graph, so each step saves its own;
  * the fp32 TTT-diagonal merge (merge.merge_diagonal: q, keys and values of the
    earlier steps widened to fp32 and stacked: 6.6 GiB over seven steps; recomputed, it is
    also done in blocks of merge.MERGE_ROWS positions, so long sequences never hold it whole);
  * the fp32 insides of the RMSNorm before the draft lm_head (3 x [T, H] fp32 per step).

`cast_weights_once` casts the matrices once per unroll and shares them (SharedCast keeps a
gradient path per step, so the fp32 masters still sum the steps' gradients in fp32, exactly as
autocast's per-step casts do; GradSum adds them in place, about half the memory traffic).
`recompute_elementwise` checkpoints the merge (merge.merge_recomputed) and the loss norm: they keep only their inputs
(already kept by their neighbours) and are recomputed in backward; both are elementwise, so the
recompute is a few milliseconds against a ~400 ms step. Both are the trainer's defaults
(train.TrainSection), as are the input projections' halves of train.embed_once
(SharedCastCols: each half's gradient into its columns of the fp32 sum) and the teacher's
lm_head on the host between teachers (HostWeight, train.lm_head_on_host). All exact:
tests/eagle3/drafter/test_drafter_long_memory.py compares losses and gradients with the plain
unroll, in fp32 and under bf16 autocast.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn


def add_into(total: torch.Tensor, grad: torch.Tensor) -> None:
    """total += grad (fp32 += bf16) in place. On CUDA one compiled kernel with vectorised
    loads: eager's mixed-dtype add is an unrolled kernel at about half the bandwidth (one H200,
    4K equal work: 17.8 ms of a 0.41 s step; compiled 0.369 vs 0.377 s per step,
    bench/results/profile-4k/2026-12-02b-compiled-merge.json). Elementwise, each element
    rounded once: the same values."""
    if not total.is_cuda:
        _add(total, grad)
        return
    from remote_agent.eagle3.drafter.model.compiled import compiled_once

    compiled_once(_add, dynamic=True)(total, grad)


def _add(total: torch.Tensor, grad: torch.Tensor) -> None:
    total.add_(grad)


class GradSum:
    """The fp32 sum of one master's per-step gradients (`uses` TTT steps use the matrix).

    Each step's bf16 gradient is added in place (one fused kernel: read bf16, read and write
    fp32) instead of widened to a new fp32 tensor that autograd then adds out of place (4.3 GB
    more traffic per step and matrix set on the Kimi shape; 0.4288 -> 0.4134 s per 4K step on
    one H200: bench/results/profile-4k/2026-12-02a-gradsum.json). Same values in the same order, so bit for bit what autocast's per-use casts
    give. The last use hands the sum to the master (its AccumulateGrad, so DDP/FSDP hooks fire
    as usual). uses 0: open-ended (a step of several backward passes whose use counts differ
    by matrix, shards.py): nothing is handed over until SharedCasts.finish."""

    def __init__(self, uses: int) -> None:
        self.uses, self.seen = uses, 0
        self.total: torch.Tensor | None = None

    def add(self, grad: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        if self.total is None:
            self.total = grad.to(dtype)
        else:
            add_into(self.total, grad)
        return self._count()

    def add_cols(
        self, grad: torch.Tensor, dtype: torch.dtype, shape: torch.Size, lo: int, hi: int
    ) -> torch.Tensor | None:
        """A use of the columns lo..hi-1 only (a half of an input projection: SharedCastCols)."""
        if self.total is None:
            self.total = grad.new_zeros(shape, dtype=dtype)
        add_into(self.total[:, lo:hi], grad)
        return self._count()

    def _count(self) -> torch.Tensor | None:
        self.seen += 1
        if self.uses == 0 or self.seen < self.uses:
            return None
        total, self.total, self.seen = self.total, None, 0
        return total


class SharedCast(torch.autograd.Function):
    """forward: the already-cast copy of `master` (no new memory); backward: the gradient added
    to the master's fp32 GradSum, which the last of the `uses` nodes returns as the master's
    gradient (the others return None: nothing to add yet)."""

    @staticmethod
    def forward(ctx, master: torch.Tensor, low: torch.Tensor, grads: GradSum) -> torch.Tensor:
        ctx.dtype, ctx.grads = master.dtype, grads
        return low.view_as(low)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.grads.add(grad, ctx.dtype), None, None


class SharedCastCols(torch.autograd.Function):
    """SharedCast of the columns lo..hi-1 of a matrix: its gradient is added to those columns of
    the master's fp32 GradSum (no full-size gradient of a slice per use)."""

    @staticmethod
    def forward(ctx, master, low_cols, grads: GradSum, lo: int, hi: int) -> torch.Tensor:
        ctx.dtype, ctx.shape, ctx.grads, ctx.cols = master.dtype, master.shape, grads, (lo, hi)
        return low_cols.view_as(low_cols)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        total = ctx.grads.add_cols(grad, ctx.dtype, ctx.shape, *ctx.cols)
        return total, None, None, None, None


class SharedCasts:
    """The layer's matrices cast once for an unroll of `uses` steps: {name: (master, low copy,
    GradSum)} (norm vectors stay fp32: the norms compute in fp32 from them). split: the input
    projections are used by halves (DecoderLayer.pre_parts: each TTT step its hidden half, the
    unroll once its embedding half), one more use each."""

    def __init__(
        self, layer: nn.Module, dtype: torch.dtype, uses: int, split: bool = False
    ) -> None:
        """uses: the TTT steps of the unroll, or 0: open-ended sums (finish hands them over)."""
        self.items: dict[str, tuple[nn.Parameter, torch.Tensor, GradSum]] = {}
        attn = getattr(layer, "self_attn", None)
        halves = {id(p.weight) for p in attn.in_projs()} if split and attn is not None else set()
        for name, p in layer.named_parameters():
            if p.ndim == 2 and p.dtype != dtype:
                with torch.no_grad():
                    low = p.detach().to(dtype)
                extra = 1 if uses and id(p) in halves else 0
                self.items[name] = (p, low, GradSum(uses + extra))

    def unfinished(self) -> list[str]:
        """Matrices whose gradient sum was started but not handed over (a step's backward
        missing): empty after every complete backward."""
        return [name for name, (_, _, g) in self.items.items() if g.seen]

    def finish(self) -> None:
        """Open-ended sums (GradSum uses 0) to their masters' .grad, added to what is there:
        after the last backward pass of a step made of several (shards.py)."""
        for master, _, g in self.items.values():
            if g.total is not None:
                master.grad = g.total if master.grad is None else master.grad + g.total
            g.total, g.seen = None, 0


def unroll_casts(
    layer: nn.Module, uses: int, enabled: bool, split: bool = False
) -> SharedCasts | None:
    """The shared casts for an unroll of `uses` steps (each uses every matrix once; split: the
    input projections by halves, SharedCasts) when `enabled` (train.cast_weights_once) and
    autocast is on: its dtype; else None."""
    dev = next(layer.parameters()).device.type
    if not (enabled and torch.is_autocast_enabled(dev)):
        return None
    return SharedCasts(layer, torch.get_autocast_dtype(dev), uses, split)


def input_halves(layer: nn.Module, casts: SharedCasts | None, half: str) -> list[torch.Tensor]:
    """The `half` ("embed": columns 0..H-1, "hidden": H..2H-1) of each input projection's
    weight (DecoderLayer.pre_parts), through a SharedCastCols node each (its gradient to the
    fp32 sum of those columns), or the master's slice without casts."""
    projs: list[nn.Linear] = layer.self_attn.in_projs()  # type: ignore[union-attr, operator]
    h = projs[0].weight.shape[1] // 2
    lo, hi = (0, h) if half == "embed" else (h, 2 * h)
    if casts is None or not casts.items:
        return [p.weight[:, lo:hi] for p in projs]
    by_id = {id(master): (master, low, g) for master, low, g in casts.items.values()}
    out = []
    for p in projs:
        master, low, grads = by_id[id(p.weight)]
        out.append(SharedCastCols.apply(master, low[:, lo:hi], grads, lo, hi))
    return out


def check_handed_over(casts: SharedCasts | None, head=None) -> None:
    """After backward: every shared matrix's gradient reached its master (a TTT step whose
    backward never ran would otherwise drop the sum silently); head: the shared draft lm_head
    (loss.HeadGrad) likewise."""
    left = casts.unfinished() if casts is not None else []
    if head is not None and head.unfinished():
        left.append("lm_head.weight")
    if left:
        raise RuntimeError(
            f"cast_weights_once: the gradient sums of {', '.join(left)} were not handed to their "
            "masters (a TTT step's backward did not run); the step's gradients are incomplete"
        )


def layer_weights(layer: nn.Module, casts: SharedCasts | None) -> AbstractContextManager:
    """Within: the layer's matrices are the shared copies (through a SharedCast node each)."""
    if casts is None or not casts.items:
        return nullcontext()
    from torch.nn.utils.stateless import _reparametrize_module

    swapped = {
        name: SharedCast.apply(master, low, grads)
        for name, (master, low, grads) in casts.items.items()
    }
    return _reparametrize_module(layer, swapped)


def recomputed(fn, *args):
    """fn(*args) keeping only its inputs for backward (fn is recomputed there)."""
    if not torch.is_grad_enabled():
        return fn(*args)
    from torch.utils.checkpoint import checkpoint

    return checkpoint(fn, *args, use_reentrant=False)


class HostWeight:
    """A frozen tensor kept in (pinned) host memory, on the device only while it is used: the
    teacher's target lm_head (train.lm_head_on_host; 2.19 GiB at the Kimi shape) is needed at
    the start of a step only, so the step drops its device copy after the teacher (`release`)
    and uploads it again (`prefetch`, on a side stream: the copy engine works while backward
    computes) once backward has freed more than it takes; the next teacher's `get` waits for
    the upload. The device copy holds the same bytes: nothing changes but where it lives."""

    def __init__(self, tensor: torch.Tensor, device: torch.device) -> None:
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        host = tensor.detach().to("cpu")
        self.host = host.pin_memory() if cuda else host.clone()
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        self.dev: torch.Tensor | None = None
        self.event: torch.cuda.Event | None = None
        self.uploads = 0

    @property
    def shape(self) -> torch.Size:
        return self.host.shape

    def prefetch(self) -> None:
        """Start the upload (no wait); nothing when the device copy is there."""
        if self.dev is not None:
            return
        if self.stream is None:
            self.dev = self.host.to(self.device, copy=True)
        else:
            current = torch.cuda.current_stream(self.device)
            dev = torch.empty(self.host.shape, dtype=self.host.dtype, device=self.device)
            self.stream.wait_stream(current)  # its memory may have been freed by work queued there
            with torch.cuda.stream(self.stream):
                dev.copy_(self.host, non_blocking=True)
            dev.record_stream(self.stream)
            self.event = torch.cuda.Event()
            self.event.record(self.stream)
            self.dev = dev
        self.uploads += 1

    def get(self) -> torch.Tensor:
        """The device copy, its upload finished before anything queued after this call."""
        self.prefetch()
        if self.event is not None:
            torch.cuda.current_stream(self.device).wait_event(self.event)
            self.event = None
        assert self.dev is not None
        return self.dev

    def release(self) -> None:
        """Drop the device copy (the host copy stays): work already queued keeps its memory."""
        self.dev, self.event = None, None

    def prefetch_hook(self):
        """A tensor hook that starts the upload when a gradient reaches it (returns it as is)."""

        def hook(grad: torch.Tensor) -> None:
            self.prefetch()

        return hook
