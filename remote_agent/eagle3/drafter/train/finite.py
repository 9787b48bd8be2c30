"""Stop a run whose gradients stopped being numbers, before anything non-finite is saved.

A NaN or inf gradient norm (a corrupt dump row, too high a learning rate, an fp overflow) turns
every weight into NaN at the next optimizer step, and such a drafter silently accepts nothing
once served. The watch counts those steps on the device, so training keeps its one host sync per
log window, and `check` runs where the loop syncs anyway: before a metrics line, a checkpoint
and the final save. A stopped run keeps its last good checkpoint; the error says what to try."""

from __future__ import annotations

import torch

from remote_agent.eagle3.errors import Failed


class FiniteWatch:
    def __init__(self, device: torch.device) -> None:
        self.bad = torch.zeros((), dtype=torch.int64, device=device)
        self.first = torch.full((), -1, dtype=torch.int64, device=device)

    def add(self, grad_norm: torch.Tensor, step: int) -> None:
        """`step`: the 1-based global step whose backward gave `grad_norm`."""
        full = getattr(grad_norm, "full_tensor", None)  # FSDP: the norm is a replicated DTensor
        norm = full() if full is not None else grad_norm
        nonfinite = ~torch.isfinite(norm.detach())
        self.first = torch.where(nonfinite & (self.bad == 0), step, self.first)
        self.bad += nonfinite.to(torch.int64)

    def check(self, step: int, last_checkpoint: str | None) -> None:
        bad = int(self.bad)  # the one sync, at a boundary that syncs anyway
        if not bad:
            return
        kept = f"the last checkpoint is {last_checkpoint}" if last_checkpoint else "no checkpoint"
        raise Failed(
            f"the gradient norm was not finite at step {int(self.first)} ({bad} of the steps up "
            f"to {step}): training stopped before saving, {kept}. Check the dumps "
            "(`eagle3 verify-dumps`), lower train.lr or train.noise_std, or train in fp32 "
            "(train.precision)"
        )
