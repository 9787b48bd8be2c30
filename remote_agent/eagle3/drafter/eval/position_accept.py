"""Acceptance length by context position: does the drafter stay good deep into long contexts?

A chain started at packed position t (context = the document's tokens up to t+1) has the
simulated acceptance length of simulate.py: 1 + the leading TTT steps whose draft argmax equals
the target's greedy token. Here those lengths are grouped by t's position inside its document
(`edges`: bucket [lo, hi)), so a drafter trained without long samples shows where it falls off.
On the target's own greedy data the figure is exact (see simulate.py). Sums are kept, so any
number of batches add up exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from remote_agent.eagle3.drafter.model.loss import teacher
from remote_agent.eagle3.drafter.model.ttt_attention import TTTAttention
from remote_agent.eagle3.drafter.train.data import Batch, step_targets
from remote_agent.eagle3.drafter.train.step import chain_starts

EDGES = (0, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)


class PositionAccept:
    """Accumulates chain acceptance lengths per context-position bucket."""

    def __init__(self, depth: int, edges: tuple[int, ...] = EDGES) -> None:
        if depth < 1 or list(edges) != sorted(set(edges)) or edges[0] != 0:
            raise ValueError("need depth >= 1 and increasing bucket edges starting at 0")
        self.depth, self.edges = depth, tuple(edges)
        self.sums = [0.0] * len(edges)  # the last bucket is open: [edges[-1], inf)
        self.counts = [0] * len(edges)

    def add(self, match: list[torch.Tensor], valid: torch.Tensor, positions: torch.Tensor) -> None:
        """match[k] bool [N] (step-k draft == target greedy); valid bool [N]; positions [N]."""
        run = torch.stack([m.bool() for m in match[: self.depth]]).long().cumprod(0)
        length = (1 + run.sum(0))[valid].double().cpu()
        pos = positions[valid].cpu()
        edges = torch.tensor(self.edges, dtype=pos.dtype)
        bucket = torch.bucketize(pos, edges, right=True) - 1
        n = len(self.edges)
        self.sums = [
            a + b
            for a, b in zip(
                self.sums,
                torch.zeros(n).double().index_add(0, bucket, length).tolist(),
                strict=True,
            )
        ]
        counts = torch.bincount(bucket, minlength=n).tolist()
        self.counts = [a + b for a, b in zip(self.counts, counts, strict=True)]

    def report(self) -> list[dict[str, Any]]:
        """[{bucket "lo-hi", lo, hi, accept_length, chains}] for the buckets that saw chains."""
        out = []
        for i, (s, c) in enumerate(zip(self.sums, self.counts, strict=True)):
            if not c:
                continue
            lo = self.edges[i]
            hi = self.edges[i + 1] if i + 1 < len(self.edges) else None
            out.append(
                {
                    "bucket": f"{lo}-{hi}" if hi is not None else f"{lo}+",
                    "lo": lo,
                    "hi": hi,
                    "accept_length": round(s / c, 4),
                    "chains": c,
                }
            )
        return out


@torch.no_grad()
def batch_chains(drafter, b: Batch, lm_head, depth: int, backend: str = "chunked", chunk=1024):
    """(match per step, valid chain starts, position in document) of one packed batch: the TTT
    unroll of `depth` steps, the teacher argmax from the stored final states."""
    draft_ids = drafter.draft_ids()
    st = step_targets(b, depth)
    tch = teacher(b.final[0], lm_head, draft_ids, drafter.t2d, chunk)
    n = b.input_ids.shape[1]
    dtype = drafter.fc.weight.dtype
    attention = TTTAttention(b.doc, drafter.midlayer.self_attn.scale, backend)
    outs = drafter.ttt(b.aux.to(dtype), st.ids, b.positions, attention, depth)
    rows = n - depth
    match = []
    for k in range(depth):
        pred = draft_ids[drafter.logits(outs[k][0, :rows]).argmax(-1)]
        match.append(pred == tch.argmax[1 + k : 1 + k + rows])
    valid = chain_starts(st, b.loss_mask, depth)[:rows]
    return match, valid, b.positions[0, :rows]
