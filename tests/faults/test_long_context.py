"""Attacks on issue 17's promises: the long-sequence memory options (per-TTT-step checkpointing,
recomputing soft CE) change nothing but memory, on random packed layouts; a bad long-context
setting is one located line and exit 2."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import torch

from remote_agent.eagle3.distributed import Dist
from remote_agent.eagle3.drafter.model.model import Eagle3Drafter, build_config
from remote_agent.eagle3.drafter.model.ttt_attention import doc_ids_from_lengths
from remote_agent.eagle3.drafter.train.config import DrafterSection, TrainSection
from remote_agent.eagle3.drafter.train.data import Batch
from remote_agent.eagle3.drafter.train.step import StepContext, TTTStep, forward_backward
from tests.support.paths import REPO


def _drafter(arch: str) -> Eagle3Drafter:
    ds = DrafterSection(
        arch=arch,
        num_attention_heads=4,
        num_key_value_heads=2 if arch == "llama" else None,
        intermediate_size=64,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=8,
    )
    c = build_config(
        ds, target_hidden=32, vocab_size=80, draft_vocab_size=50, aux_layer_ids=[2, 4, 5],
        target_context=2048,
    )  # fmt: skip
    m = Eagle3Drafter(c)
    m.init_weights(0.2, torch.Generator().manual_seed(1))
    ids = torch.randperm(80, generator=torch.Generator().manual_seed(2))[:50].sort().values
    t2d = torch.zeros(80, dtype=torch.bool)
    t2d[ids] = True
    m.set_vocab(ids - torch.arange(50), t2d)
    return m


def _batch(rng: random.Random) -> Batch:
    lengths = [rng.randint(3, 40) for _ in range(rng.randint(1, 4))]
    n = sum(lengths) + rng.randint(0, 8)
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    mask = torch.rand(n, generator=g) < rng.uniform(0.2, 1.0)
    pos = torch.cat([torch.arange(x) for x in lengths] + [torch.arange(n - sum(lengths))])
    return Batch(
        torch.randint(0, 80, (1, n), generator=g),
        torch.randn(1, n, 96, generator=g),
        torch.randn(1, n, 32, generator=g) * 3,
        mask[None],
        doc_ids_from_lengths(lengths, n).unsqueeze(0),
        pos[None],
        sum(lengths),
        [],
    )


def _step(arch, backend, skip, lean, b, lm_head):
    torch.manual_seed(0)
    d = _drafter(arch)
    tc = TrainSection(ttt_steps=3, skip_idle_rows=skip, device="cpu")
    w = [tc.step_weight**k for k in range(3)]
    module = TTTStep(d, 3, 5, checkpoint_steps=lean, cast_weights_once=lean)
    ctx = StepContext(
        module, lm_head, d.draft_ids(), d.t2d, 3, w, d.midlayer.self_attn.scale, backend,
        torch.autocast("cpu", enabled=False), False, Dist(), tc,
    )  # fmt: skip
    out = forward_backward(ctx, b, 0)
    return out, {k: p.grad.clone() for k, p in d.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("seed", range(8))
def test_lean_step_equals_the_plain_unroll_on_random_layouts(seed, tally):
    rng = random.Random(seed)
    arch, backend = rng.choice(["llama", "mla"]), rng.choice(["chunked", "dense"])
    skip = rng.random() < 0.5
    b = _batch(rng)
    lm_head = torch.randn(80, 32, generator=torch.Generator().manual_seed(seed))
    plain, g_plain = _step(arch, backend, skip, False, b, lm_head)
    lean, g_lean = _step(arch, backend, skip, True, b, lm_head)
    held = g_plain.keys() == g_lean.keys() and all(
        torch.allclose(a, c, rtol=1e-5, atol=1e-6)
        for a, c in zip(lean.losses, plain.losses, strict=True)
    )
    held = held and all(
        torch.allclose(g_lean[k], g, rtol=1e-4, atol=1e-6) for k, g in g_plain.items()
    )
    tally.trial("long context: lean step == plain unroll", held)
    assert held, (arch, backend, skip)


@pytest.mark.parametrize(
    "section,key,value",
    [
        ("data", "long_samples", "keep"),
        ("data", "long_samples", 1),
        ("train", "loss_recompute", "yes"),
        ("train", "checkpoint_ttt_steps", 2),
    ],
)
def test_bad_long_context_settings_are_one_located_line(tmp_path, tally, section, key, value):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({section: {key: value}}))
    p = subprocess.run(
        [sys.executable, "-m", "remote_agent.eagle3", "train", "--config", str(cfg)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    held = p.returncode == 2 and len(lines) == 1 and f"{section}.{key}" in lines[0]
    tally.trial("long context: bad setting is one located line, exit 2", held)
    assert held, (p.returncode, p.stderr)


@pytest.mark.parametrize("seed", range(10))
def test_long_samples_are_alone_whole_and_short_ones_packed(seed, tally):
    """Random length mixes: every sample in exactly one step; a sample over the budget is alone
    in a step long enough for all of it; the others share steps within the budget."""
    from remote_agent.eagle3.drafter.train.data import batch_length, first_fit

    rng = random.Random(seed)
    budget = rng.choice([64, 256, 4096])
    lengths = [
        rng.randint(3, budget) if rng.random() < 0.7 else rng.randint(budget + 1, budget * 9)
        for _ in range(rng.randint(1, 200))
    ]
    bins = first_fit(lengths, budget, window=rng.choice([1, 8, 64]))
    seen = sorted(i for b in bins for i in b)
    held = seen == list(range(len(lengths)))
    for b in bins:
        sizes = [lengths[i] for i in b]
        n = batch_length(budget, [(torch.zeros(s),) for s in sizes])
        held &= n >= sum(sizes)
        held &= (len(b) == 1) if max(sizes) > budget else (sum(sizes) <= budget and n == budget)
    tally.trial("long context: long samples alone and whole, short ones packed", held)
    assert held
