"""The HF reference extractor on the tiny random DeepseekV3 (CPU): dumped states equal an
independent `output_hidden_states` forward layer by layer (bitwise), the final state is post-norm,
padding and MoE routing leave real tokens alone, resume after an interruption, and 2 ranks under
torchrun (gloo) dump every sample exactly once with the same states as 1 rank."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.support.procs import run_tree

torch = pytest.importorskip("torch")

from eagle3_standins import write_dataset  # noqa: E402

from remote_agent.eagle3 import dense  # noqa: E402
from remote_agent.eagle3.cli import main  # noqa: E402
from remote_agent.eagle3.dense import DumpReader  # noqa: E402
from remote_agent.eagle3.extraction.capture import (  # noqa: E402
    AuxCapture,
    capture_batch,
    decoder_of,
    pad_batch,
    plan_batches,
    resolve_layer_ids,
)
from tests.support.paths import REPO  # noqa: E402

LENGTHS = [17, 5, 33, 9, 24, 41, 12]


@pytest.fixture(scope="module")
def model(tiny_target):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_target), dtype=torch.float32).eval()


def extract(model_dir, data, out, *extra) -> int:
    args = [
        "extract",
        "--backend",
        "hf",
        "--model",
        str(model_dir),
        "--dataset",
        str(data),
        "--out",
        str(out),
        "--disk-margin-gb",
        "0",
        "--min-free-gb",
        "0",
        *map(str, extra),
    ]
    return main(args)


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_layer_ids_and_batch_plan():
    assert resolve_layer_ids(61) == [2, 30, 58]
    assert resolve_layer_ids(61, [1, 29, 57]) == [2, 30, 58]  # SGLang's +1 rule
    assert resolve_layer_ids(8, [5, 2, 4]) == [2, 4, 5]
    for bad in ([0, 2, 4], [2, 2, 4], [2, 4, 8]):
        with pytest.raises(ValueError):
            resolve_layer_ids(8, bad)
    lengths = [("a", 10), ("b", 50), ("c", 30), ("d", 30), ("e", 200), ("f", 5)]
    batches = plan_batches(lengths, token_budget=100)
    assert sorted(s for b in batches for s in b) == list("abcdef")
    assert batches[0] == ["e"]  # longer than the budget: alone
    n = dict(lengths)
    for b in batches[1:]:
        assert len(b) * max(n[s] for s in b) <= 100
    assert [n[b[0]] for b in batches] == sorted((n[b[0]] for b in batches), reverse=True)


def test_dump_equals_output_hidden_states_bitwise(model, tiny_target, tmp_path, capsys):
    data = write_dataset(tmp_path / "d.jsonl", LENGTHS)
    out = tmp_path / "dump"
    # budget 1: every sample alone, so the forward is exactly the independent one's
    assert extract(tiny_target, data, out, "--token-budget", 1, "--dtype", "fp32") == 0
    result = [
        json.loads(x[9:])
        for x in capsys.readouterr().err.splitlines()
        if x.startswith("@@eagle3 ") and '"result"' in x
    ]
    assert result[-1]["samples"] == len(LENGTHS) and result[-1]["layer_ids"] == [2, 4, 5]
    reader = DumpReader(out)
    assert reader.meta.producer == "hf-reference" and reader.meta.aux_layer_ids == [2, 4, 5]
    assert (reader.meta.hidden_size, reader.meta.num_layers) == (64, 8)
    decoder, layers = decoder_of(model)
    pre_norm = {}
    handle = layers[-1].register_forward_hook(lambda m, a, o: pre_norm.__setitem__("h", o))
    try:
        for rec in records(data):
            ids = torch.tensor([rec["input_ids"]])
            with torch.no_grad():
                ref = model.model(ids, output_hidden_states=True)
            got = reader.get(rec["id"])
            assert got["input_ids"].tolist() == rec["input_ids"]
            for k, layer in enumerate([2, 4, 5]):  # aux block k == HF hidden_states[layer]
                block = got["aux"][:, k * 64 : (k + 1) * 64]
                assert torch.equal(block, ref.hidden_states[layer][0].to(torch.bfloat16)), layer
            assert torch.equal(got["final"], ref.last_hidden_state[0].to(torch.bfloat16))
            # "final" is after the final norm: norm(output of the last layer), the lm_head input
            with torch.no_grad():
                assert torch.equal(model.model.norm(pre_norm["h"][0]), ref.last_hidden_state[0])
            assert not torch.equal(pre_norm["h"][0], ref.last_hidden_state[0])
    finally:
        handle.remove()


def test_batched_bf16_dump_matches_single_forwards(tiny_target, tmp_path):
    from transformers import AutoModelForCausalLM

    m16 = AutoModelForCausalLM.from_pretrained(str(tiny_target), dtype=torch.bfloat16).eval()
    data = write_dataset(tmp_path / "d.jsonl", LENGTHS, seed=3)
    out = tmp_path / "dump"
    assert extract(tiny_target, data, out, "--token-budget", 256, "--dtype", "bf16") == 0
    reader = DumpReader(out)
    assert len(reader.shards) == 1
    for rec in records(data):
        with torch.no_grad():
            ref = m16.model(torch.tensor([rec["input_ids"]]), output_hidden_states=True)
        got = reader.get(rec["id"])
        want = torch.cat([ref.hidden_states[i][0] for i in (2, 4, 5)], dim=-1)
        torch.testing.assert_close(got["aux"], want)  # bf16 tolerance: batch shapes differ
        torch.testing.assert_close(got["final"], ref.last_hidden_state[0])


def test_padding_and_moe_routing_do_not_touch_real_tokens(model):
    decoder, layers = decoder_of(model)
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(11, 2000, (n,), generator=gen).tolist() for n in (37, 20, 5, 29)]
    moe_layer = next(i for i, layer in enumerate(layers) if hasattr(layer.mlp, "gate"))
    routes = []
    handle = layers[moe_layer].mlp.gate.register_forward_hook(lambda m, a, o: routes.append(o[2]))
    try:
        with AuxCapture(layers, [2, 4, 5]) as cap, torch.no_grad():
            ids, mask = pad_batch(seqs, 2)
            _, aux_b, fin_b = capture_batch(decoder, cap, ids, mask)
            route_b = routes.pop().reshape(len(seqs), ids.shape[1], -1)
            # different pad tokens must not change real tokens (attention mask + per-token routing)
            ids2 = ids.clone()
            ids2[mask == 0] = torch.randint(11, 2000, (int((mask == 0).sum()),), generator=gen)
            _, aux_p, fin_p = capture_batch(decoder, cap, ids2, mask)
            route_p = routes.pop().reshape(len(seqs), ids.shape[1], -1)
            singles = []
            for s in seqs:
                i1, m1 = pad_batch([s], 2)
                singles.append((*capture_batch(decoder, cap, i1, m1)[1:], routes.pop()))
    finally:
        handle.remove()
    off = 0
    for row, (s, (aux_1, fin_1, route_1)) in enumerate(zip(seqs, singles, strict=True)):
        n = len(s)
        # fp32 rounding only (GEMM shapes differ with the batch): a leak would be O(1)
        assert (aux_b[off : off + n] - aux_1).abs().max() < 1e-4
        assert (fin_b[off : off + n] - fin_1).abs().max() < 1e-4
        assert (aux_p[off : off + n] - aux_b[off : off + n]).abs().max() < 1e-5
        assert (fin_p[off : off + n] - fin_b[off : off + n]).abs().max() < 1e-5
        # the same experts for every real token, alone or batched, whatever the pads are
        same = route_b[row, :n].sort(-1).values
        assert torch.equal(same, route_1.reshape(n, -1).sort(-1).values)
        assert torch.equal(same, route_p[row, :n].sort(-1).values)
        off += n
    assert off == aux_b.shape[0]  # no padded row was kept


def test_resume_after_an_interrupted_run(tiny_target, tmp_path, monkeypatch, capsys):
    data = write_dataset(tmp_path / "d.jsonl", LENGTHS, seed=5)
    out = tmp_path / "dump"
    real_write = dense.ShardWriter._write
    writes = []

    def write_then_die(self, *args):
        if len(writes) == 2:
            raise KeyboardInterrupt  # the box went away mid-run
        writes.append(1)
        return real_write(self, *args)

    monkeypatch.setattr(dense.ShardWriter, "_write", write_then_die)
    args = ("--token-budget", 1, "--shard-mb", 0.001)  # a shard per sample
    assert extract(tiny_target, data, out, *args) == 130
    first = DumpReader(out)
    assert len(first) == 2 and not list((out / "shards").glob("*.tmp.*"))
    monkeypatch.setattr(dense.ShardWriter, "_write", real_write)
    capsys.readouterr()
    assert extract(tiny_target, data, out, *args) == 0
    result = json.loads(capsys.readouterr().err.strip().splitlines()[-1][9:])
    assert result["skipped_existing"] == 2 and result["samples"] == len(LENGTHS) - 2
    assert main(["verify-dumps", str(out), "--dataset", str(data)]) == 0


def test_torchrun_two_ranks_match_one_rank(tiny_target, tmp_path):
    data = write_dataset(tmp_path / "d.jsonl", LENGTHS + [3, 50, 19], seed=7)
    common = [
        "--backend",
        "hf",
        "--model",
        str(tiny_target),
        "--dataset",
        str(data),
        "--disk-margin-gb",
        "0",
        "--min-free-gb",
        "0",
        "--token-budget",
        "64",
        "--dtype",
        "fp32",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "remote_agent.eagle3",
        "extract",
        *common,
        "--out",
        str(tmp_path / "dp2"),
    ]
    proc = run_tree(cmd, timeout=300, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert main(["extract", *common, "--out", str(tmp_path / "dp1")]) == 0
    two, one = DumpReader(tmp_path / "dp2"), DumpReader(tmp_path / "dp1")
    assert not two.duplicates and sorted(two.ids()) == sorted(one.ids()) == sorted(
        r["id"] for r in records(data)
    )
    by_rank = {}
    for sid, ref in two.index.items():
        by_rank.setdefault(ref.shard.name[:4], set()).add(sid)
    assert set(by_rank) == {"r000", "r001"} and not (by_rank["r000"] & by_rank["r001"])
    for sid in one.ids():
        a, b = two.get(sid), one.get(sid)
        assert torch.equal(a["input_ids"], b["input_ids"])
        torch.testing.assert_close(a["aux"], b["aux"])  # bf16 tolerance: batch shapes differ
        torch.testing.assert_close(a["final"], b["final"])
    assert main(["verify-dumps", str(tmp_path / "dp2"), "--dataset", str(data)]) == 0
