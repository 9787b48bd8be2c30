"""Long samples trained, not dropped: with `data.long_samples: alone` a sample longer than the
token budget is one step of its own full length while short ones still pack to the budget;
the trainer reports progress (step / total, tokens, ETA) through the progress contract."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from remote_agent.eagle3.dense import DumpReader
from remote_agent.eagle3.drafter.train import config as config_mod
from remote_agent.eagle3.drafter.train.data import LONG_PAD, Loader, Plan, batch_length
from remote_agent.eagle3.drafter.train.loop import train


def _plans(inputs: dict, budget: int, **kw) -> tuple[Plan, Plan]:
    args = (Path(inputs["dump"]), Path(inputs["data"]), budget)
    return Plan(*args, **kw), Plan(*args, long_samples="alone", **kw)


def test_long_samples_alone_at_full_length_short_ones_packed(tiny_inputs):
    full = Plan(Path(tiny_inputs["dump"]), Path(tiny_inputs["data"]), 1 << 20)
    n_full = full.samples[0][1]  # the tiny data's samples all have one length
    budget = n_full - 1
    trunc, alone = _plans(tiny_inputs, budget, seed=1)
    assert max(n for _, n in trunc.samples) == budget  # the old behaviour: cut to the budget
    assert alone.samples == full.samples  # nothing cut
    assert alone.long_count == len(alone.samples)
    # make every third sample a short one (the loader reads the first n tokens of a sample)
    alone.samples = [(sid, n if i % 3 == 0 else n // 3) for i, (sid, n) in enumerate(full.samples)]
    lengths = sorted(n for _, n in alone.samples)
    batches = alone.epoch_batches(0)
    assert sorted(i for b in batches for i in b) == list(range(len(alone.samples)))
    for b in batches:
        sizes = [alone.samples[i][1] for i in b]
        assert (len(b) == 1) if max(sizes) > budget else (sum(sizes) <= budget)
    assert any(len(b) > 1 for b in batches)  # short samples still share a step
    reader = DumpReader(Path(tiny_inputs["dump"]))
    seen_long = 0
    for _, _, batch in Loader(alone, rank=0, start_epoch=0, start_step=0, epochs=1, prefetch=2):
        if batch.tokens > budget:
            seen_long += 1
            (sid,) = batch.sample_ids
            # its own length, padded to a multiple of LONG_PAD (a few compiled shapes)
            pad = min(LONG_PAD, budget)
            assert batch.input_ids.shape == (1, -(-batch.tokens // pad) * pad)
            assert int(batch.loss_mask[0, batch.tokens :].sum()) == 0
            got = batch.aux[0, : batch.tokens]
            torch.testing.assert_close(got, reader.get(sid)["aux"].to(torch.bfloat16))
        else:
            assert batch.input_ids.shape == (1, budget)
    assert seen_long == sum(n > budget for n in lengths) > 0


def test_long_batches_pad_to_few_shapes():
    one = lambda n: [(torch.zeros(n),)]  # noqa: E731
    assert batch_length(4096, one(100)) == 4096
    assert batch_length(4096, one(4097)) == LONG_PAD * (-(-4097 // LONG_PAD))
    assert batch_length(100, one(101)) == 200  # a small budget pads to its own multiple
    shapes = {batch_length(4096, one(n)) for n in range(4097, 65537, 97)}
    assert len(shapes) <= 65536 // LONG_PAD and all(s % LONG_PAD == 0 for s in shapes)


def test_trainer_takes_long_samples_and_reports_progress(
    tiny_inputs, tmp_path, capsys, make_config
):
    full = Plan(Path(tiny_inputs["dump"]), Path(tiny_inputs["data"]), 1 << 20)
    budget = full.samples[0][1] // 2  # every sample is twice the budget
    data = {"max_tokens": budget, "long_samples": "alone"}
    train_s = {"epochs": 1, "checkpoint_ttt_steps": True}
    cfg = config_mod.load(make_config(tmp_path / "c.json", tiny_inputs, data=data, train=train_s))
    result = train(cfg)
    lines = [
        json.loads(x[len("@@eagle3 ") :])
        for x in capsys.readouterr().err.splitlines()
        if x.startswith("@@eagle3 ")
    ]
    steps = Plan(
        Path(tiny_inputs["dump"]), Path(tiny_inputs["data"]), budget, long_samples="alone"
    ).steps_per_epoch(0)
    assert result["steps"] == steps
    prog = [r for r in lines if r["kind"] == "progress" and r["stage"] == "train"]
    assert prog, "no progress records"
    last = prog[-1]
    assert (last["done"], last["total"], last["unit"]) == (steps, steps, "step")
    assert last["eta_s"] == 0 and last["rate"] > 0
    assert last["tokens"] == sum(n for _, n in full.samples)  # every token, long ones whole
    assert [r["done"] for r in prog] == sorted(r["done"] for r in prog)
    metrics = [r for r in lines if r["kind"] == "metrics"]
    assert all(m["loss"] > 0 for m in metrics)
