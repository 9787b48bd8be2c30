"""`eval`'s teacher-forced figures on its own greedy outputs, to set beside the measured ones.

Training logs a simulated acceptance (simulate.py) from the TTT unroll over the data's tokens.
Here the same simulation runs over prompt + the greedy output that `eval` just decoded: one
target forward gives the aux states and the teacher (target argmax) at every position, one
`Eagle3Drafter.ttt` unroll gives the drafts of every chain start. So the measured accept length
(speculative decoding) and the simulated one are computed on the same tokens: a gap between
them is the simulation's error (chains start at every position, not only where a round did),
not a difference in data.

Chains start at positions t whose first drafted token t+2 is an output token and whose `depth`
drafts stay inside the sequence, as in training (an output token is "supervised"). Both acc_k
denominators as in training (metrics_breakdown.py): `acc_k` over positions whose teacher argmax
is in the draft vocabulary, `acc_k_all` over all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from remote_agent.eagle3.drafter.model.ttt_attention import TTTAttention
from remote_agent.eagle3.drafter.train.simulate import chain_acceptance


@dataclass
class Forced:
    accept_sum: float = 0.0
    positions: int = 0
    hits: list[float] = field(default_factory=list)
    in_vocab: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)

    def add(self, other: Forced) -> None:
        self.accept_sum += other.accept_sum
        self.positions += other.positions
        for name in ("hits", "in_vocab", "total"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if not mine:
                mine.extend([0.0] * len(theirs))
            for k, x in enumerate(theirs):
                mine[k] += x

    def summary(self) -> dict:
        def ratio(a: list[float], b: list[float]) -> list[float | None]:
            return [round(x / y, 5) if y else None for x, y in zip(a, b, strict=True)]

        return {
            "sim_accept_length": round(self.accept_sum / self.positions, 4)
            if self.positions
            else None,
            "sim_positions": self.positions,
            "acc_k": ratio(self.hits, self.in_vocab),
            "acc_k_all": ratio(self.hits, self.total),
        }


@torch.no_grad()
def teacher_forced(target, drafter, prompt: list[int], output: list[int], depth: int) -> Forced:
    """target: evaluate.Target; drafter: Eagle3Drafter (eval mode); depth: chain length."""
    seq = list(prompt) + list(output)
    n, p = len(seq), len(prompt)
    if depth < 1 or n < depth + 2:
        return Forced(hits=[0.0] * depth, in_vocab=[0.0] * depth, total=[0.0] * depth)
    logits, aux = target(seq)
    dev, dtype = aux.device, drafter.fc.weight.dtype
    ids = torch.tensor([seq], device=dev)
    step_ids = []
    for k in range(depth):  # step k at position t reads token t+1+k (teacher forcing)
        x = torch.zeros_like(ids)
        x[:, : n - 1 - k] = ids[:, 1 + k :]
        step_ids.append(x)
    positions = torch.arange(n, device=dev).unsqueeze(0)
    doc = torch.zeros(1, n, dtype=torch.int32, device=dev)
    # chunked on every device: compiled flex has static shapes, so on a GPU each prompt's
    # length cost a compile (the 12-07 GPU demo's evaluate ran past 130 s on them); at eval's
    # lengths, without grad, the exact chunked kernel is cheap
    attention = TTTAttention(doc, drafter.midlayer.self_attn.scale, "chunked")
    outs = drafter.ttt(aux.to(dtype).unsqueeze(0), step_ids, positions, attention, depth)
    teacher = logits.argmax(-1)  # teacher of position i: the target's greedy token after i
    in_draft = drafter.t2d.to(dev)[teacher]
    draft_ids = drafter.draft_ids().to(dev)
    t = torch.arange(n, device=dev)
    forced = Forced()
    match = []
    for k in range(depth):
        m = n - 1 - k
        pred = draft_ids[drafter.logits(outs[k][0, :m]).argmax(-1)]
        hit = pred == teacher[1 + k : 1 + k + m]
        # the drafted token t+2+k is an output token (and exists)
        scored = (t[:m] + 2 + k >= p) & (t[:m] + 2 + k < n)
        forced.hits.append(float((hit & scored).sum()))
        forced.in_vocab.append(float((scored & in_draft[1 + k : 1 + k + m]).sum()))
        forced.total.append(float(scored.sum()))
        match.append(hit[: n - depth])
    start = t[: n - depth]
    valid = (start + 2 >= p) & (start + 1 + depth < n)  # all `depth` drafted tokens exist
    forced.accept_sum, forced.positions, _ = chain_acceptance(match, valid, depth)
    return forced
