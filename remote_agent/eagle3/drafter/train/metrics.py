"""Training metrics over a log window: summed on device, one sync per emitted line."""

from __future__ import annotations

import math
from typing import Any

import torch

from remote_agent.eagle3.distributed import Dist
from remote_agent.eagle3.drafter.train.metrics_breakdown import Breakdown
from remote_agent.eagle3.drafter.train.simulate import chain_acceptance
from remote_agent.eagle3.drafter.train.step import StepOut
from remote_agent.eagle3.progress import emit


class Window:
    """Metric sums over a log window (kept on device; one sync per emitted line)."""

    def __init__(self, step_w: list[float], depth: int) -> None:
        self.step_w, self.steps, self.depth = step_w, len(step_w), depth
        self._device = torch.device("cpu")  # the steps' device (their norm's): the one reduce
        self.reset()

    def reset(self) -> None:
        self.loss = [0.0] * self.steps
        self.count = [0.0] * self.steps
        self.correct = [0.0] * self.steps
        self.total = 0.0
        self.sim_sum = 0.0
        self.sim_n = 0
        self.tokens = 0
        self.n = 0
        self.grad_norm = 0.0
        self.lr = 0.0
        self.skipped = 0
        self._dev: list[torch.Tensor] = []
        self.breakdown = Breakdown(self.steps, self.depth)  # acc_k_all, sim per source

    def add(self, out: StepOut, b, draft_ids, grad_norm, lr, tokens: int | None = None) -> None:
        """tokens: this rank's share of the batch's tokens (default all of them). A step whose
        gradient norm is not finite was skipped (finite.py): its tokens count as work done, its
        losses and accuracies (NaN perhaps) stay out of the window."""
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
            grad_norm = grad_norm.full_tensor()
        self._device = getattr(grad_norm, "device", self._device)
        norm = float(grad_norm)  # the step's one sync
        self.tokens += b.tokens if tokens is None else tokens
        if not math.isfinite(norm):
            self.skipped += 1
            return
        losses, args, weights, counts = out.losses, out.args, out.weights, out.counts
        tch = out.teacher
        n = b.input_ids.shape[1]
        # target ids; -1 (never a teacher argmax) where a row was not computed (zero weight)
        preds = [torch.where(a >= 0, draft_ids[a.clamp(min=0)], -1) for a in args]
        correct = []
        for k in range(self.steps):
            rows = n - 1 - k
            hit = (preds[k] == tch.argmax[1 + k : 1 + k + rows]).float()
            correct.append((hit * weights[k]).sum())
        self._dev.append(torch.stack([torch.stack(losses).detach(), torch.stack(correct)]))
        self.breakdown.add(out, b, preds, b.sources)
        self.count = [c + float(x) for c, x in zip(self.count, counts.tolist(), strict=True)]
        if self.depth:
            rows = n - self.depth
            match = [preds[k][:rows] == tch.argmax[1 + k : 1 + k + rows] for k in range(self.depth)]
            s, c, _ = chain_acceptance(match, out.sim_valid[:rows], self.depth)
            self.sim_sum += s
            self.sim_n += c
        self.n += 1
        self.grad_norm = norm
        self.lr = lr

    def emit(self, d: Dist, step: int, epoch: int, elapsed: float, wait: float) -> dict[str, Any]:
        # [2, steps]; a window of skipped steps only has none (every rank skips the same steps:
        # the norm is global)
        sums = torch.stack(self._dev).sum(0).cpu() if self._dev else torch.zeros(2, self.steps)
        red = torch.cat(
            [sums.flatten(), torch.tensor([self.sim_sum, self.sim_n, self.tokens, wait, elapsed])]
        ).double()
        red = d.all_reduce_sum(red.to(self._device)).cpu()
        k = self.steps
        loss_sum, correct = red[:k], red[k : 2 * k]
        sim_sum, sim_n, tokens, wait_all, elapsed_all = red[2 * k :].tolist()
        count = torch.tensor(self.count, dtype=torch.float64)  # already global
        loss_k = (loss_sum / count.clamp(min=1)).tolist()
        acc_k = (correct / count.clamp(min=1)).tolist()
        rec = {
            "step": step,
            "epoch": epoch,
            "loss": sum(w * lk for w, lk in zip(self.step_w, loss_k, strict=True)),  # exact
            "loss_k": loss_k,
            "acc_k": [round(x, 5) for x in acc_k],
            "sim_accept_len": round(sim_sum / sim_n, 4) if sim_n else None,
            "tokens_per_s": round(tokens / max(elapsed_all / d.world, 1e-9), 1),
            "data_wait": round(wait_all / max(elapsed_all, 1e-9), 4),
            "lr": self.lr,
            "grad_norm": round(self.grad_norm, 5),
        }
        if self.skipped:
            rec["skipped_nonfinite"] = self.skipped
        if not self.n:  # every step of the window skipped (on every rank: the norm is global)
            rec.update(loss=None, loss_k=None, acc_k=None, grad_norm=None)
        rec.update(self.breakdown.emit(d, correct))
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            rec["peak_mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if d.main:
            emit("metrics", **rec)
        self.reset()
        return rec
