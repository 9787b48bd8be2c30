"""Steps whose gradients are not numbers change nothing, and a run that keeps making them stops
before anything non-finite or blown up is saved.

A NaN or inf gradient norm (a corrupt dump row, too high a learning rate, an fp overflow in one
batch) turns every weight into NaN at the optimizer step, and such a drafter silently accepts
nothing once served. So that step is skipped whole: no weight, moment or step count moves (the
fused AdamW kernel reads `found_inf` on the device, as GradScaler uses it, so no host sync; an
unfused optimizer checks on the host). On the H100 of 12-07 one such step at step 52 of a
tiny-Kimi Llama drafter made every later step NaN and ended the run; now it costs one batch.

The watch counts the skipped steps on the device, and `check` runs where the loop syncs anyway
(before a metrics line, a checkpoint and the final save): more than `tolerance` skipped steps
(train.max_nonfinite_steps) stops the run with a message saying what to try. A save due right
after a skipped step waits for the next finite one, so a blown-up run (every step NaN after
one huge update) never writes a checkpoint."""

from __future__ import annotations

import torch

from remote_agent.eagle3.errors import Failed


class FiniteWatch:
    def __init__(self, device: torch.device, tolerance: int = 0) -> None:
        self.tolerance = max(0, tolerance)
        self.bad = torch.zeros((), dtype=torch.int64, device=device)
        self.first = torch.full((), -1, dtype=torch.int64, device=device)
        self.last = torch.zeros((), dtype=torch.bool, device=device)  # the latest step skipped

    def step(self, opt: torch.optim.Optimizer, grad_norm: torch.Tensor, step: int) -> None:
        """`opt.step()` unless `grad_norm` (of the 1-based global step `step`) is not finite."""
        full = getattr(grad_norm, "full_tensor", None)  # FSDP: the norm is a replicated DTensor
        norm = full() if full is not None else grad_norm
        nonfinite = ~torch.isfinite(norm.detach())
        self.first = torch.where(nonfinite & (self.bad == 0), step, self.first)
        self.bad += nonfinite.to(torch.int64)
        self.last = nonfinite
        if _skips_on_device(opt):
            opt.found_inf = nonfinite.to(torch.float32)  # type: ignore[attr-defined]
            try:
                opt.step()
            finally:
                del opt.found_inf  # type: ignore[attr-defined]
        elif not bool(nonfinite):
            opt.step()

    def last_skipped(self) -> bool:
        """Whether the latest step was skipped: weights that just gave a NaN gradient are not
        checkpointed (the loop saves after the next finite step instead)."""
        return bool(self.last)

    def check(self, step: int, last_checkpoint: str | None) -> None:
        bad = int(self.bad)  # the one sync, at a boundary that syncs anyway
        if bad <= self.tolerance:
            return
        kept = f"the last checkpoint is {last_checkpoint}" if last_checkpoint else "no checkpoint"
        raise Failed(
            f"the gradient norm was not finite at step {int(self.first)} ({bad} of the steps up "
            f"to {step}, each skipped; train.max_nonfinite_steps allows {self.tolerance}): "
            f"training stopped before saving, {kept}. Check the dumps (`eagle3 verify-dumps`), "
            "lower train.lr or train.noise_std, or train in fp32 (train.precision)"
        )


def _skips_on_device(opt: torch.optim.Optimizer) -> bool:
    """Fused Adam/AdamW over plain tensors: its kernel skips the whole update when `found_inf`
    is set (DTensor parameters, FSDP's, would mix with a plain found_inf: host check there)."""
    if not (opt.defaults.get("fused") and getattr(opt, "_step_supports_amp_scaling", False)):
        return False
    return not any(
        type(p).__name__ == "DTensor" for group in opt.param_groups for p in group["params"]
    )
