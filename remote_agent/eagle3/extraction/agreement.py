"""When two dumps of the same tokens agree: the per-token verdict shared by the GPU extraction
check (tests/gpu/test_extraction_gpu.py) and `compare-dumps` (bench/gpu_sglang_check.py).

A MoE router has near-ties that another kernel's rounding (another batch shape, another engine)
flips; a flipped token takes other experts, so its rows differ a lot while every other token
agrees to rounding. So the verdict is per token: the relative L2 error ||got - want|| / ||want||
of each token's row, and the dumps agree when at most MAX_FLIP_SHARE of the tokens exceed the
tolerance. bf16 kernels of two engines: 2e-2; fp32 compute stored as bf16: 4e-3 (one bf16
rounding step, 2^-8, per element).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

REL_TOL = {"fp32": 4e-3, "bf16": 2e-2}
MAX_FLIP_SHARE = 0.01


def token_rel_errs(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """[T] relative L2 error of each token's row (the last dimension)."""
    got, want = got.float(), want.float()
    return (got - want).norm(dim=-1) / want.norm(dim=-1).clamp(min=1e-12)


def flip_share(beyond: int, tokens: int) -> float | None:
    """The share of tokens beyond tolerance, rounded for reports (None: no tokens compared)."""
    return round(beyond / tokens, 6) if tokens else None


def dumps_agree(share: float | None, max_share: float = MAX_FLIP_SHARE) -> bool:
    return share is not None and share <= max_share
