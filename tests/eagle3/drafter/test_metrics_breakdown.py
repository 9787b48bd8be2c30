"""acc_k's two denominators and the simulated acceptance per source (metrics_breakdown.py),
through the trainer's real log window (metrics.py): a hand-computed case, then a real tiny training run."""

from __future__ import annotations

import json

import torch

from remote_agent.eagle3.distributed import Dist
from remote_agent.eagle3.drafter.model.loss import Teacher
from remote_agent.eagle3.drafter.train import config as config_mod
from remote_agent.eagle3.drafter.train.data import packed_batch, step_targets
from remote_agent.eagle3.drafter.train.loop import StepOut, _Window, train


def _mask(n: int, on: list[int]) -> torch.Tensor:
    m = torch.zeros(n, dtype=torch.bool)
    m[on] = True
    return m


def test_hand_computed_window() -> None:
    """Doc A (source "a") = positions 0-4, doc B ("b") = 5-8, every token supervised; 2 TTT
    steps, chain depth 2. Draft vocab = target ids 0..3 (4 and 5 are out of vocabulary).

    Step k at position t predicts the teacher argmax at t+1+k, inside its document:
      step 0 at t = 0,1,2 (A), 5,6 (B): teacher 1, 2, 5(OOV), 0, 3; drafts 1, 0, 3, 0, 2
             -> hits t=0, t=5: acc_0 = 2/4 in vocab, acc_0_all = 2/5
      step 1 at t = 0,1 (A), 5 (B):     teacher 2, 5(OOV), 3;       drafts 2, 1, 3
             -> hits t=0, t=5: acc_1 = 2/2,          acc_1_all = 2/3
    Chains of depth 2 start at t = 0, 1 (A) and 5 (B): accepted 2, 0, 2 -> lengths 3, 1, 3:
      source a: (3 + 1) / 2 = 2.0, source b: 3.0, overall 7/3.
    """
    n, steps = 9, 2
    parts = []
    for length in (5, 4):
        parts.append(
            (
                torch.arange(length),
                torch.zeros(length, 4),
                torch.zeros(length, 2),
                torch.ones(length, dtype=torch.bool),
            )
        )
    b = packed_batch(parts, n, ["a1", "b1"])
    b.sources = ["a", "b"]
    argmax = torch.tensor([0, 1, 2, 5, 3, 1, 0, 3, 3])
    t2d = _mask(6, [0, 1, 2, 3])
    tch = Teacher(torch.zeros(n, 4), argmax, t2d[argmax])
    # the loss weights step.forward_backward builds: supervised, in the document, in vocab
    weights = [_mask(8, [0, 1, 5, 6]).float(), _mask(7, [0, 5]).float()]
    args = [
        torch.tensor([1, 0, 3, 0, 0, 0, 2, 0]),  # draft ids = target ids here
        torch.tensor([2, 1, 0, 0, 0, 3, 0]),
    ]
    out = StepOut(
        losses=[torch.tensor(1.0), torch.tensor(1.0)],
        args=args,
        weights=weights,
        counts=torch.stack([w.sum() for w in weights]),
        targets=step_targets(b, steps),
        teacher=tch,
        sim_valid=_mask(n, [0, 1, 5]),
        plan=None,
    )
    win = _Window([1.0, 1.0], depth=2)
    win.add(out, b, torch.arange(4), grad_norm=0.0, lr=0.0)
    rec = win.emit(Dist(rank=0, world=1, local_rank=0, device=None), 1, 0, 1.0, 0.0)
    assert rec["acc_k"] == [0.5, 1.0]
    assert rec["acc_k_all"] == [0.4, 0.66667]
    assert rec["sim_accept_len"] == round(7 / 3, 4)
    assert rec["sim_accept_len_by_source"] == {"a": 2.0, "b": 3.0}


def test_training_logs_both_denominators_and_sources(tiny_inputs, tmp_path, make_config):
    cfg = config_mod.load(make_config(tmp_path / "c.json", tiny_inputs, train={"max_steps": 2}))
    train(cfg)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(x) for x in lines]
    assert len(metrics) == 2
    for m in metrics:
        assert len(m["acc_k_all"]) == len(m["acc_k"]) == 3
        assert all(0 <= a <= b <= 1 for a, b in zip(m["acc_k_all"], m["acc_k"], strict=True))
        # one source: its simulated acceptance is the overall one, over the same positions
        assert m["sim_accept_len_by_source"] == {"stdlib": m["sim_accept_len"]}
