"""Acceptance length by context-position bucket: the buckets hold exactly the chains that start
there, and over all buckets it is the trainer's own simulated acceptance length."""

from __future__ import annotations

import random

import pytest
import torch
from test_drafter_skip_rows import chat_batch, run

from remote_agent.eagle3.drafter.eval.position_accept import PositionAccept, batch_chains


def test_buckets_match_a_brute_force_count():
    rng = random.Random(0)
    edges = (0, 4, 10, 32)
    acc = PositionAccept(3, edges)
    want: dict[int, list[int]] = {}
    for _ in range(3):  # several batches add up
        n = 50
        match = [torch.tensor([rng.random() < 0.7 for _ in range(n)]) for _ in range(3)]
        valid = torch.tensor([rng.random() < 0.8 for _ in range(n)])
        pos = torch.tensor([rng.randrange(0, 60) for _ in range(n)])
        acc.add(match, valid, pos)
        for i in range(n):
            if not valid[i]:
                continue
            a = 0
            while a < 3 and bool(match[a][i]):
                a += 1
            b = max(j for j, e in enumerate(edges) if int(pos[i]) >= e)
            want.setdefault(b, []).append(1 + a)
    rep = acc.report()
    assert [r["bucket"] for r in rep] == ["0-4", "4-10", "10-32", "32+"]
    for r, b in zip(rep, sorted(want), strict=True):
        assert r["chains"] == len(want[b])
        assert r["accept_length"] == pytest.approx(sum(want[b]) / len(want[b]), abs=1e-4)


def test_all_buckets_together_equal_the_trainers_simulated_acceptance():
    out, _, metrics, _ = run("llama", "chunked", skip=True)
    # the same drafter (forward_backward does not step the optimizer) on the same batch
    from test_drafter_model_loss import model_drafter
    from test_drafter_skip_rows import vocab

    torch.manual_seed(0)
    drafter = model_drafter("llama", draft_vocab=60)
    lm_head, t2d = vocab()
    ids = t2d.nonzero().flatten()
    drafter.set_vocab(ids - torch.arange(60), t2d)
    b = chat_batch()
    match, valid, pos = batch_chains(drafter, b, lm_head, depth=3)
    acc = PositionAccept(3, (0, 8, 16))
    acc.add(match, valid, pos)
    rep = acc.report()
    total = sum(r["accept_length"] * r["chains"] for r in rep) / sum(r["chains"] for r in rep)
    assert total == pytest.approx(metrics["sim_accept_len"], abs=1e-3)
    assert sum(r["chains"] for r in rep) == int(out.sim_valid.sum())
    assert all(1.0 <= r["accept_length"] <= 4.0 for r in rep)
