"""Data plan, packing, the dump x dataset join (ids checked), TTT alignment and the vocab loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from remote_agent.eagle3.drafter.train.data import (
    Batch,
    Loader,
    Plan,
    load_vocab,
    step_targets,
    step_tokens,
)
from remote_agent.eagle3.errors import BadInput, Failed


def test_plan_packs_within_budget_and_covers_every_sample(tiny_inputs):
    plan = Plan(Path(tiny_inputs["dump"]), Path(tiny_inputs["data"]), max_tokens=256, seed=3)
    for epoch in (0, 1):
        batches = plan.epoch_batches(epoch)
        seen = sorted(i for b in batches for i in b)
        assert seen == list(range(len(plan.samples)))
        assert all(sum(plan.samples[i][1] for i in b) <= 256 for b in batches)
    assert plan.epoch_batches(0) == Plan(
        Path(tiny_inputs["dump"]), Path(tiny_inputs["data"]), max_tokens=256, seed=3
    ).epoch_batches(0)
    assert plan.epoch_batches(0) != plan.epoch_batches(1)


def test_loader_batches_are_packed_documents_and_resume_mid_epoch(tiny_inputs):
    plan = Plan(
        Path(tiny_inputs["dump"]), Path(tiny_inputs["data"]), max_tokens=256, seed=0, world=2
    )
    full = list(Loader(plan, rank=1, start_epoch=0, start_step=0, epochs=2, prefetch=2))
    resumed = list(Loader(plan, rank=1, start_epoch=0, start_step=2, epochs=2, prefetch=2))
    assert [(e, s) for e, s, _ in full][2:] == [(e, s) for e, s, _ in resumed]
    for (_, _, a), (_, _, b) in zip(full[2:], resumed, strict=True):
        assert a.sample_ids == b.sample_ids and torch.equal(a.aux, b.aux)
    _, _, batch = full[0]
    doc, pos = batch.doc[0], batch.positions[0]
    assert batch.input_ids.shape == (1, 256) and batch.tokens <= 256
    starts = [0] + [i for i in range(1, batch.tokens) if doc[i] != doc[i - 1]]
    assert all(int(pos[s]) == 0 for s in starts)  # positions restart per document
    assert len(starts) == len(batch.sample_ids)


def test_loader_gathers_the_host_embedding_rows_of_every_ttt_step(tiny_inputs):
    """train.embed_on_host: each batch carries the embedding rows of its ids plus `embed_pad`
    rows of token 0 (data.step_tokens), so step k at position t finds token t+1+k's row at
    1+k+t, exactly the row step_targets' ids look up; they travel with the batch."""
    plan = Plan(Path(tiny_inputs["dump"]), Path(tiny_inputs["data"]), max_tokens=256, seed=0)
    (_, _, plain), *_ = Loader(plan, 0, 0, 0, 1, prefetch=1)
    vocab = json.loads((Path(tiny_inputs["target"]) / "config.json").read_text())["vocab_size"]
    table = torch.randn(vocab, 8).to(torch.bfloat16)
    (_, _, b), *_ = Loader(plan, 0, 0, 0, 1, prefetch=1, embed=table, embed_pad=3)
    assert b.embeds is not None and b.embeds.shape == (1, 256 + 3, 8)
    st = step_targets(b, 3)
    for k in range(3):
        assert torch.equal(b.embeds[0, 1 + k : 1 + k + 256], table[st.ids[k][0]])
    assert torch.equal(step_tokens(b.input_ids, 3)[0, :256], b.input_ids[0])
    moved = b.to("cpu")
    assert moved.embeds is not None and torch.equal(moved.embeds, b.embeds)
    assert plain.embeds is None and torch.equal(plain.input_ids, b.input_ids)


def _batch(ids, mask, lengths, n):
    doc = torch.full((n,), len(lengths), dtype=torch.int32)
    pos = torch.zeros(n, dtype=torch.long)
    at = 0
    for d, ln in enumerate(lengths):
        doc[at : at + ln] = d
        pos[at : at + ln] = torch.arange(ln)
        at += ln
    z = torch.zeros(1, n, 1)
    return Batch(
        torch.tensor([ids]),
        z,
        z,
        torch.tensor([mask], dtype=torch.bool),
        doc.unsqueeze(0),
        pos.unsqueeze(0),
        at,
        [],
    )


def test_step_targets_alignment_matches_the_definition():
    lengths, n = [5, 4], 11  # two documents, two padding positions
    ids = [10, 11, 12, 13, 14, 20, 21, 22, 23, 0, 0]
    mask = [0, 0, 1, 1, 1, 0, 1, 1, 1, 0, 0]
    st = step_targets(_batch(ids, mask, lengths, n), steps=3)
    docs = [0] * 5 + [1] * 4 + [2] * 2
    for k in range(3):
        for t in range(n):
            same = t + 2 + k < 9 and docs[t + 2 + k] == docs[t] and t < 9
            assert bool(st.valid[k][0, t]) == same, (k, t)
            assert bool(st.weight[k][0, t]) == (same and mask[t + 2 + k] == 1), (k, t)
            if t + 1 + k < n:
                assert int(st.ids[k][0, t]) == ids[t + 1 + k]


def test_dump_ids_must_equal_dataset_ids(tiny_inputs, tmp_path):
    lines = Path(tiny_inputs["data"]).read_text().splitlines()
    rec = json.loads(lines[3])
    rec["input_ids"][5] = (rec["input_ids"][5] + 1) % 2048
    lines[3] = json.dumps(rec)
    bad = tmp_path / "tampered.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    plan = Plan(Path(tiny_inputs["dump"]), bad, max_tokens=4096, pack_window=1000)
    with pytest.raises(Failed, match=rf"{rec['id']}.*differ.*token 5"):
        list(Loader(plan, rank=0, start_epoch=0, start_step=0, epochs=1))


def test_dump_samples_missing_from_dataset_fail_up_front(tiny_inputs, tmp_path):
    lines = Path(tiny_inputs["data"]).read_text().splitlines()
    short = tmp_path / "short.jsonl"
    short.write_text("\n".join(lines[:-2]) + "\n")
    with pytest.raises(Failed, match="not in"):
        Plan(Path(tiny_inputs["dump"]), short, max_tokens=256)


def test_vocab_mapping_is_validated(tiny_inputs, tmp_path):
    from safetensors.torch import save_file

    d2t, t2d, meta = load_vocab(Path(tiny_inputs["vocab"]), 2048)
    assert d2t.numel() == 256 and int(t2d.sum()) == 256
    assert torch.equal((torch.arange(256) + d2t).sort().values, t2d.nonzero().flatten())
    save_file({"d2t": d2t, "t2d": t2d[:100].contiguous()}, str(tmp_path / "v.safetensors"))
    with pytest.raises(BadInput, match="t2d has 100"):
        load_vocab(tmp_path / "v.safetensors", 2048)
    t2 = t2d.clone()
    t2[int((~t2d).nonzero()[0])] = True
    save_file({"d2t": d2t, "t2d": t2}, str(tmp_path / "w.safetensors"))
    with pytest.raises(BadInput, match="disagree"):
        load_vocab(tmp_path / "w.safetensors", 2048)
