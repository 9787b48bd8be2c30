"""`eval`'s teacher-forced simulation on its own greedy outputs (teacher_forced.py): equal to a
brute force over draft_chain, and reported next to the measured accept length."""

from __future__ import annotations

import json

import pytest
import torch

from remote_agent.eagle3.cli import main
from remote_agent.eagle3.drafter.eval.evaluate import Target, load_prompts, speculative_decode
from remote_agent.eagle3.drafter.eval.synthetic import load_target
from remote_agent.eagle3.drafter.eval.teacher_forced import teacher_forced
from remote_agent.eagle3.drafter.export.export import load_export
from tests.eagle3.drafter.conftest import write_config


@pytest.fixture(scope="module")
def exported(tiny_inputs, tmp_path_factory):
    root = tmp_path_factory.mktemp("forced")
    cfg = write_config(
        root / "c.json",
        tiny_inputs,
        train={"epochs": 6, "max_steps": 96, "lr": 5e-3, "log_every": 32},
    )
    assert main(["train", "--config", str(cfg)]) == 0
    assert main(["export", str(root / "run"), "--out", str(root / "export")]) == 0
    return root / "export"


def test_teacher_forced_equals_a_brute_force_over_draft_chain(tiny_inputs, exported):
    """On the target's own greedy output a teacher-forced chain at t drafts exactly what
    draft_chain drafts from the context up to t+1 until its first miss: count both ways."""
    model, _ = load_target(tiny_inputs["target"])
    drafter, _ = load_export(exported)
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
    drafter.eval()
    target = Target(model, [2, 4, 5])
    depth = 3
    total_sum, total_n, hits0 = 0.0, 0, 0
    for prompt in load_prompts(tiny_inputs["data"], 2):
        out = speculative_decode(target, drafter, prompt, 20, depth, frozenset()).tokens
        forced = teacher_forced(target, drafter, prompt, out, depth)
        seq = prompt + out
        _, aux = target(seq)
        want_sum, want_n = 0.0, 0
        for t in range(len(prompt) - 2, len(seq) - 1 - depth):
            drafts = drafter.draft_chain(aux[: t + 1], torch.tensor(seq[: t + 2]), depth)
            a = 0
            while a < depth and drafts[a] == seq[t + 2 + a]:
                a += 1
            want_sum += 1 + a
            want_n += 1
            hits0 += drafts[0] == seq[t + 2]
        assert forced.positions == want_n
        assert forced.accept_sum == pytest.approx(want_sum)
        total_sum, total_n = total_sum + want_sum, total_n + want_n
    assert total_n > 0 and hits0 > 0  # trained long enough that chains do get accepted
    print(f"teacher-forced accept length {total_sum / total_n:.3f}, step-0 hits {hits0}")


def test_eval_reports_the_simulation_on_the_same_tokens(tiny_inputs, exported, tmp_path):
    out = tmp_path / "eval.json"
    args = ["eval", "--target", tiny_inputs["target"], "--drafter", str(exported)]
    args += ["--data", tiny_inputs["data"], "--num-prompts", "2", "--max-new-tokens", "16"]
    assert main([*args, "--device", "cpu", "--out", str(out)]) == 0
    r = json.loads(out.read_text())["trained"]
    tf = r["teacher_forced"]
    assert 1.0 <= tf["sim_accept_length"] <= 4.0 and tf["sim_positions"] > 0
    assert len(tf["acc_k"]) == len(tf["acc_k_all"]) == 3
    assert all(b is None or a <= b for a, b in zip(tf["acc_k_all"], tf["acc_k"], strict=True))
    assert r["accept_length"] is not None  # the measured figure, same prompts and tokens
    print(f"measured accept length {r['accept_length']}, teacher-forced {tf}")


def _forced_chain(d, aux, seq: list[int], t: int, depth: int) -> list[int]:
    """draft_chain's plain-attention math, but step k+1 embeds the TRUE token t+2+k (teacher
    forcing): an independent restatement of one TTT column at position t."""
    from remote_agent.eagle3.drafter.model.model import _attend

    layer, attn = d.midlayer, d.midlayer.self_attn
    n = t + 1
    hidden = d.project(aux[:n].unsqueeze(0))
    q, k0, v0, res = layer.pre(
        hidden, d.embed_tokens(torch.tensor([seq[1 : n + 1]])), torch.arange(n).unsqueeze(0)
    )
    out = layer.post(_attend(q, k0, v0, attn.scale, torch.ones(n, n).bool().tril()), res)[:, -1:]
    keys, values, preds = [k0], [v0], []
    for k in range(depth):
        preds.append(int(d.draft_ids()[d.logits(out)[0, -1].argmax()]))
        if k == depth - 1 or t + 2 + k >= len(seq):
            break
        emb = d.embed_tokens(torch.tensor([[seq[t + 2 + k]]]))
        q, kk, vv, res = layer.pre(d.next_hidden(out), emb, torch.tensor([[t + 1 + k]]))
        keys.append(kk)
        values.append(vv)
        o = _attend(q, torch.cat(keys, dim=2), torch.cat(values, dim=2), attn.scale, None)
        out = layer.post(o, res)
    return preds


@torch.no_grad()
def test_per_step_hits_equal_an_independent_teacher_forced_chain(tiny_inputs, exported):
    model, _ = load_target(tiny_inputs["target"])
    drafter, _ = load_export(exported)
    drafter.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
    drafter.eval()
    target, depth = Target(model, [2, 4, 5]), 3
    for prompt in load_prompts(tiny_inputs["data"], 2):
        out = speculative_decode(target, drafter, prompt, 12, depth, frozenset()).tokens
        forced = teacher_forced(target, drafter, prompt, out, depth)
        seq = prompt + out
        logits, aux = target(seq)
        teach = logits.argmax(-1)
        hits, total = [0] * depth, [0] * depth
        for t in range(len(prompt) - 1 - depth, len(seq) - 2):
            preds = _forced_chain(drafter, aux, seq, t, depth)
            for k in range(depth):  # step k drafts token t+2+k: scored when it is an output
                if len(prompt) <= t + 2 + k < len(seq):
                    hits[k] += preds[k] == int(teach[t + 1 + k])
                    total[k] += 1
        assert forced.hits == hits and forced.total == total


def test_teacher_forced_never_reaches_the_compiled_flex_kernel(tiny_inputs, exported, monkeypatch):
    """Compiled flex has static shapes: on a GPU every prompt length compiled anew (the evaluate
    step of the 12-07 GPU demo ran past 130 s). With the device's pick saying flex, as it does on
    CUDA, the teacher-forced pass must still never call the flex kernel."""
    from remote_agent.eagle3.drafter.eval import teacher_forced as tf_mod
    from remote_agent.eagle3.drafter.model import ttt_attention

    def no_flex(*_a, **_k):
        raise AssertionError("teacher_forced reached the compiled flex kernel")

    monkeypatch.setattr(ttt_attention, "pick_backend", lambda *_a: "flex")
    monkeypatch.setattr(tf_mod, "pick_backend", lambda *_a: "flex", raising=False)
    monkeypatch.setattr(ttt_attention, "_flex_fn", no_flex)
    model, _ = load_target(tiny_inputs["target"])
    drafter, _ = load_export(exported)
    drafter.eval()
    target = Target(model, [2, 4, 5])
    prompt = load_prompts(tiny_inputs["data"], 1)[0]
    out = speculative_decode(target, drafter, prompt, 12, 3, frozenset()).tokens
    forced = teacher_forced(target, drafter, prompt, out, 3)
    assert forced.positions > 0
