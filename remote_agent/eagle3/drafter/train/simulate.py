"""Simulated acceptance length of chain drafting, from the TTT predictions of a training batch.

With topk 1 the server drafts a chain of `steps` tokens (`draft_tokens` = steps + 1 including
the verified root) and accepts the longest prefix that equals the target's greedy tokens, plus
one bonus token from the target. TTT step k at position t is exactly draft step k of a chain
started at t, so the simulated length at t is

    1 + number of leading steps k < depth whose draft argmax == teacher argmax

averaged over supervised positions where the whole chain stays inside the document (depth =
min(steps, draft_tokens - 1)). A teacher argmax outside the draft vocabulary is a miss. The
draft's inputs are the data's tokens (teacher forcing); they equal the drafts whenever all
earlier drafts were accepted, if the data is the target's own greedy output, so the estimate is
exact for regenerated greedy data and slightly optimistic otherwise. SGLang reports
completion_tokens / verify steps, the same quantity.
"""

from __future__ import annotations

import torch


def chain_depth(steps: int, topk: int, draft_tokens: int) -> int:
    if topk != 1:
        raise ValueError("simulated acceptance supports chain drafting (topk 1) only")
    return max(0, min(steps, draft_tokens - 1))


def chain_runs(match: list[torch.Tensor], depth: int) -> torch.Tensor:
    """[depth, N] long: 1 where steps 0..k all matched (draft k accepted at that position)."""
    return torch.stack([m.bool() for m in match[:depth]]).long().cumprod(0)


def chain_acceptance(match: list[torch.Tensor], valid: torch.Tensor, depth: int):
    """match[k] bool [N] (draft == target greedy at step k), valid bool [N].

    Returns (sum of accept lengths, number of positions, accepted-at-depth counts [depth]).
    Sums (not means) so ranks and log windows can be added up exactly.
    """
    if depth == 0 or not bool(valid.any()):
        return 0.0, 0, torch.zeros(depth)
    run = chain_runs(match, depth)[:, valid]
    accepted = run.sum(0)
    return float((1 + accepted).sum()), int(valid.sum()), run.sum(1).float().cpu()
