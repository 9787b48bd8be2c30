"""Training metrics beyond the log window's core sums (metrics.py's Window calls this).

Two denominators for the per-step draft accuracy, both in each metrics line:
  acc_k      hits / positions whose teacher argmax is in the draft vocabulary (ours: the loss
             positions; a token the draft cannot propose is not counted);
  acc_k_all  hits / all supervised positions inside the document, an out-of-vocabulary teacher
             argmax counted as a miss (SpecForge's denominator). acc_k_all <= acc_k.
The numerator is the same: a draft never proposes an out-of-vocabulary token.

sim_accept_len_by_source: the simulated acceptance length (simulate.py) of each data source,
so a source the drafter fails on is visible while training. Sources are gathered across ranks
once per emitted line.
"""

from __future__ import annotations

from typing import Any

import torch

from remote_agent.eagle3.drafter.train.simulate import chain_runs


class Breakdown:
    def __init__(self, steps: int, depth: int) -> None:
        self.steps, self.depth = steps, depth
        self._acc: list[torch.Tensor] = []  # per batch: [steps] all-position counts (on device)
        self._src: list[tuple[torch.Tensor, list[str]]] = []  # per batch: [2, docs], sources

    def add(self, out, b, preds: list[torch.Tensor], sources: list[str] | None = None) -> None:
        """out: step.StepOut; b: its Batch; preds[k]: step k's draft argmax (target ids)."""
        n = b.input_ids.shape[1]
        weight = out.targets.weight  # supervised and in the document, before the vocab drop
        self._acc.append(torch.stack([weight[k][0, : n - 1 - k].sum() for k in range(self.steps)]))
        if not self.depth or sources is None:
            return
        rows = n - self.depth
        tch = out.teacher.argmax
        match = [preds[k][:rows] == tch[1 + k : 1 + k + rows] for k in range(self.depth)]
        valid = out.sim_valid[:rows]
        length = (1 + chain_runs(match, self.depth).sum(0)).double() * valid
        docs = len(sources) + 1  # the padding is one more document
        doc = b.doc[0, :rows].long()
        per_doc = torch.stack(
            [
                torch.zeros(docs, dtype=torch.float64, device=doc.device).index_add(0, doc, length),
                torch.zeros(docs, dtype=torch.float64, device=doc.device).index_add(
                    0, doc, valid.double()
                ),
            ]
        )
        self._src.append((per_doc, list(sources)))

    def emit(self, d, correct: torch.Tensor) -> dict[str, Any]:
        """correct: [steps] global hit counts (already reduced). Collective: every rank calls."""
        rec: dict[str, Any] = {}
        if self._acc:
            total = d.all_reduce_sum(torch.stack(self._acc).sum(0).double()).cpu()
            rec["acc_k_all"] = [
                round(float(c) / float(t), 5) if t else 0.0
                for c, t in zip(correct.tolist(), total.tolist(), strict=True)
            ]
        if self.depth:
            local: dict[str, list[float]] = {}
            for per_doc, sources in self._src:
                sums, counts = per_doc.cpu().tolist()
                for i, src in enumerate(sources):
                    acc = local.setdefault(src, [0.0, 0.0])
                    acc[0] += sums[i]
                    acc[1] += counts[i]
            merged = _gather_sum(d, local)
            rec["sim_accept_len_by_source"] = {
                s: round(v[0] / v[1], 4) for s, v in sorted(merged.items()) if v[1]
            }
        self._acc, self._src = [], []
        return rec


def _gather_sum(d, local: dict[str, list[float]]) -> dict[str, list[float]]:
    """Sum {source: [sum, count]} over ranks (ranks may have seen different sources)."""
    if not d.enabled:
        return local
    import torch.distributed as dist

    parts: list[Any] = [None] * d.world
    dist.all_gather_object(parts, local)
    out: dict[str, list[float]] = {}
    for part in parts:
        for s, (a, c) in part.items():
            acc = out.setdefault(s, [0.0, 0.0])
            acc[0] += a
            acc[1] += c
    return out
