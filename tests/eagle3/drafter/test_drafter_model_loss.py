"""The drafter model (TTT unroll == the inference chain) and the chunked teacher / soft CE."""

from __future__ import annotations

import pytest
import torch

from remote_agent.eagle3.drafter.model.loss import soft_ce, soft_ce_reference, teacher
from remote_agent.eagle3.drafter.model.model import Eagle3Drafter, build_config
from remote_agent.eagle3.drafter.model.ttt_attention import TTTAttention, doc_ids_from_lengths
from remote_agent.eagle3.drafter.train.config import DrafterSection
from tests.support.drafters import tiny_drafter


def model_drafter(arch: str, draft_vocab: int = 100, **kw) -> Eagle3Drafter:
    """The model tests' drafter: GQA for llama, larger weights, the vocab mapping left open."""
    kv = 2 if arch == "llama" else None
    return tiny_drafter(
        arch, draft_vocab, std=0.2, seed=1, map_vocab=False, num_key_value_heads=kv, **kw
    )


@pytest.mark.parametrize("arch", ["llama", "mla"])
@pytest.mark.parametrize("norm_output", [False, True])
def test_ttt_unroll_equals_inference_chain(arch, norm_output):
    """TTT step k at position t == draft step k of SGLang's chain started at t (packed batch)."""
    torch.manual_seed(0)
    m = model_drafter(arch, norm_output=norm_output)
    steps, ctx, other = 4, 9, 6  # a 6-token document packed before the 9-token context
    aux = torch.randn(ctx, 96)
    ids = torch.randint(0, 100, (ctx + 1,))
    drafts = m.draft_chain(aux, ids, steps)

    lengths = [other, ctx + steps]
    n = sum(lengths) + 3  # trailing padding
    seq = torch.cat([torch.randint(0, 100, (other,)), ids, torch.tensor(drafts[:-1])])
    aux_p = torch.zeros(1, n, 96)
    aux_p[0, :other] = torch.randn(other, 96)
    aux_p[0, other : other + ctx] = aux
    step_ids = []
    for k in range(steps):
        x = torch.zeros(1, n, dtype=torch.long)
        shifted = seq[1 + k :]
        x[0, : shifted.numel()] = shifted
        step_ids.append(x)
    doc = doc_ids_from_lengths(lengths, n).unsqueeze(0)
    positions = torch.cat(
        [torch.arange(other), torch.arange(ctx + steps), torch.arange(3)]
    ).unsqueeze(0)
    t = other + ctx - 1  # the last context position
    for backend in ("dense", "chunked"):
        att = TTTAttention(doc, m.midlayer.self_attn.scale, backend, block=4)
        with torch.no_grad():
            outs = m.ttt(aux_p, step_ids, positions, att, steps)
        pred = [int(m.draft_ids()[m.logits(o)[0, t].argmax()]) for o in outs]
        assert pred == drafts, backend


@pytest.mark.parametrize("hidden", [None, 48], ids=["frozen-embedding", "trained-embedding"])
def test_one_embedding_lookup_per_unroll_equals_one_per_step(hidden):
    """model.StepInputs: every TTT step's input embeddings are views of one lookup of
    data.step_tokens (the ids, then token 0 past the end) instead of a lookup per step of
    step_targets' shifted ids: the same outputs and gradients (a trained embedding's gradient
    is summed over the steps before the lookup's backward instead of after: fp32 rounding)."""
    from remote_agent.eagle3.drafter.train.data import step_tokens

    torch.manual_seed(0)
    steps, n = 4, 21
    res = []
    for once in (False, True):
        m = model_drafter("llama", hidden_size=hidden)
        ids = torch.randint(0, 100, (1, n))
        step_ids = []
        for k in range(steps):
            x = torch.zeros_like(ids)
            x[:, : n - 1 - k] = ids[:, 1 + k :]
            step_ids.append(x)
        tokens = m.step_inputs(step_tokens(ids, steps)) if once else step_ids
        aux = torch.randn(1, n, 96)
        doc = doc_ids_from_lengths([9, 12], n).unsqueeze(0)
        att = TTTAttention(doc, m.midlayer.self_attn.scale, "dense")
        outs = m.ttt(aux, tokens, torch.arange(n).unsqueeze(0), att, steps)
        sum(o.pow(2).mean() * (k + 1) for k, o in enumerate(outs)).backward()
        grads = {k: p.grad for k, p in m.named_parameters() if p.grad is not None}
        res.append(([o.detach() for o in outs], grads))
        torch.manual_seed(0)
    (o_a, g_a), (o_b, g_b) = res
    for a, b in zip(o_a, o_b, strict=True):
        assert torch.equal(a, b)
    assert g_a.keys() == g_b.keys() and ("embed_tokens.weight" in g_a) == (hidden is not None)
    for name, g in g_a.items():
        if hidden is None:
            assert torch.equal(g_b[name], g), name
        else:
            torch.testing.assert_close(g_b[name], g, rtol=1e-5, atol=1e-7, msg=name)


def test_capture_ids_starting_at_one_are_refused():
    ds = DrafterSection()
    with pytest.raises(ValueError, match="start at layer 1"):
        build_config(
            ds,
            target_hidden=32,
            vocab_size=100,
            draft_vocab_size=100,
            aux_layer_ids=[1, 4, 5],
            target_context=2048,
        )
    c = build_config(
        ds,
        target_hidden=32,
        vocab_size=100,
        draft_vocab_size=50,
        aux_layer_ids=[2, 30, 58],
        target_context=2048,
    )
    assert c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 30, 58]


def test_embedding_is_frozen_and_only_trained_params_require_grad():
    m = model_drafter("llama")
    assert not m.embed_tokens.weight.requires_grad
    assert m.fc.weight.requires_grad and m.lm_head.weight.requires_grad


# -- loss ------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_soft_ce_matches_direct_formula_and_gradients(chunk):
    g = torch.Generator().manual_seed(0)
    n, h, vd = 17, 8, 11
    x = torch.randn(n, h, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(vd, h, generator=g, dtype=torch.float64, requires_grad=True)
    p = torch.softmax(torch.randn(n, vd, generator=g, dtype=torch.float64), -1)
    rw = (torch.rand(n, generator=g) > 0.3).double()
    got, arg = soft_ce(x, w, p, rw, chunk)
    ref = soft_ce_reference(x, w, p, rw)
    torch.testing.assert_close(got, ref.to(got.dtype), rtol=1e-10, atol=1e-10)
    assert torch.equal(arg, (x @ w.T).argmax(-1))
    gx, gw = torch.autograd.grad(2.5 * got, [x, w])
    rx, rw_ = torch.autograd.grad(2.5 * ref, [x, w])
    torch.testing.assert_close(gx, rx, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(gw, rw_, rtol=1e-9, atol=1e-9)


def test_soft_ce_bf16_close_to_fp32():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 16, generator=g)
    w = torch.randn(20, 16, generator=g)
    p = torch.softmax(torch.randn(32, 20, generator=g), -1)
    rw = torch.ones(32)
    lo, _ = soft_ce(x.bfloat16(), w, p, rw, 8)
    hi = soft_ce_reference(x, w, p, rw)
    assert abs(float(lo) - float(hi)) / float(hi) < 2e-2


@pytest.mark.parametrize("chunk", [1, 4, 100])
def test_teacher_restricted_renormalised_and_dropped(chunk):
    g = torch.Generator().manual_seed(0)
    n, h, v = 9, 6, 30
    final = torch.randn(n, h, generator=g)
    lm = torch.randn(v, h, generator=g)
    draft_ids = torch.tensor([0, 3, 4, 9, 17, 29])
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[draft_ids] = True
    t = teacher(final, lm, draft_ids, t2d, chunk)
    logits = final @ lm.T
    torch.testing.assert_close(t.p, torch.softmax(logits[:, draft_ids], -1))
    assert torch.equal(t.argmax, logits.argmax(-1))
    assert torch.equal(t.in_draft, t2d[logits.argmax(-1)])
    torch.testing.assert_close(t.p.sum(-1), torch.ones(n))
