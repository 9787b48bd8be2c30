"""torch.compile'd functions made once per process: the flex attention, the TTT merge, the
in-place gradient add. One cache, one dynamo recompile limit (raised: a packed long-sample
batch brings more shapes than dynamo's default of 8 before it falls back to eager, which for
flex attention means the dense scores)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

RECOMPILE_LIMIT = 64
_CACHE: dict[tuple[Callable, bool | None], Callable] = {}


def compiled_once(fn: Callable, dynamic: bool | None) -> Callable[..., Any]:
    """torch.compile(fn, dynamic=dynamic), compiled lazily and kept for the process."""
    key = (fn, dynamic)
    if key not in _CACHE:
        cfg = torch._dynamo.config
        cfg.recompile_limit = max(cfg.recompile_limit, RECOMPILE_LIMIT)
        _CACHE[key] = torch.compile(fn, dynamic=dynamic)
    return _CACHE[key]
