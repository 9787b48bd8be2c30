"""TTT attention: the split kernel (causal part + closed-form diagonal) against a naive reference
that builds SpecForge's layout literally: K/V of all steps concatenated, one dense mask."""

from __future__ import annotations

import pytest
import torch

from remote_agent.eagle3.drafter.model.ttt_attention import TTTAttention, doc_ids_from_lengths


def naive_ttt(q, k0, v0, ks, vs, doc, scale):
    """Step-k query at t sees step-0 keys j<=t of its document and key t of steps 1..k."""
    b, h, n, _ = q.shape
    rep = h // k0.shape[1]
    keys = torch.cat([k0, *ks], dim=2).repeat_interleave(rep, dim=1)
    values = torch.cat([v0, *vs], dim=2).repeat_interleave(rep, dim=1)
    mask = torch.zeros(b, n, n * (1 + len(ks)), dtype=torch.bool)
    for bi in range(b):
        for t in range(n):
            for j in range(t + 1):
                mask[bi, t, j] = bool(doc[bi, t] == doc[bi, j])
            for s in range(len(ks)):
                mask[bi, t, n * (s + 1) + t] = True
    s = (q @ keys.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask.unsqueeze(1), float("-inf"))
    return s.softmax(-1) @ values


def assert_same_grads(got, ref, leaves):
    """Gradients of the leaves through `got` equal those through `ref` (same upstream)."""
    upstream = torch.randn_like(ref)
    g_ref = torch.autograd.grad((ref * upstream).sum(), leaves)
    g_got = torch.autograd.grad((got * upstream).sum(), leaves)
    for a, b in zip(g_got, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def _inputs(heads=4, kv_heads=2, n=24, d=8, dv=8, steps=3, seed=0, lengths=(7, 10, 4)):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()

    q = r(1, heads, n, d)
    k0, v0 = r(1, kv_heads, n, d), r(1, kv_heads, n, dv)
    ks = [r(1, kv_heads, n, d) for _ in range(steps - 1)]
    vs = [r(1, kv_heads, n, dv) for _ in range(steps - 1)]
    doc = doc_ids_from_lengths(list(lengths), n).unsqueeze(0)
    return q, k0, v0, ks, vs, doc


@pytest.mark.parametrize("backend", ["dense", "chunked"])
@pytest.mark.parametrize(
    "shape",
    [
        dict(heads=4, kv_heads=4, dv=8, steps=1),  # step 0 only: causal + document mask
        dict(heads=4, kv_heads=2, dv=8, steps=3),  # GQA, packed documents, diagonal keys
        dict(heads=2, kv_heads=2, dv=6, steps=4, lengths=(24,)),  # MLA-like value width
        dict(heads=2, kv_heads=1, dv=8, steps=2, lengths=(1, 1, 5, 9)),  # one-token documents
    ],
)
def test_matches_naive_reference_values_and_grads(backend, shape):
    q, k0, v0, ks, vs, doc = _inputs(**shape)
    scale = 0.3
    ref = naive_ttt(q, k0, v0, ks, vs, doc, scale)
    got = TTTAttention(doc, scale, backend, block=5)(q, k0, v0, ks, vs)
    assert got.shape == (1, q.shape[1], q.shape[2], v0.shape[-1])
    torch.testing.assert_close(got, ref.to(got.dtype), rtol=1e-10, atol=1e-10)
    assert_same_grads(got, ref, [q, k0, v0, *ks, *vs])


def test_documents_do_not_see_each_other():
    q, k0, v0, ks, vs, doc = _inputs(steps=2, lengths=(12, 12))
    att = TTTAttention(doc, 0.5, "chunked", block=8)
    base = att(q, k0, v0, ks, vs)
    k0b, v0b = k0.detach().clone(), v0.detach().clone()
    k0b[:, :, :12] += 5.0  # change only the first document's keys/values
    v0b[:, :, :12] -= 3.0
    moved = att(q, k0b, v0b, ks, vs)
    torch.testing.assert_close(moved[:, :, 12:], base[:, :, 12:])
    assert not torch.allclose(moved[:, :, :12], base[:, :, :12])


@pytest.mark.parametrize(
    ("d", "dv", "kv_heads"), [(16, 16, 2), (12, 8, 1), (24, 16, 2), (112, 112, 2)]
)
def test_flex_forward_matches_reference_on_cpu(d, dv, kv_heads):
    pytest.importorskip("torch.nn.attention.flex_attention")
    q, k0, v0, ks, vs, doc = _inputs(
        heads=2, kv_heads=kv_heads, n=32, d=d, dv=dv, steps=3, lengths=(10, 22)
    )
    with torch.no_grad():
        args = [t.detach().float() for t in (q, k0, v0)]
        kk = [t.detach().float() for t in ks]
        vv = [t.detach().float() for t in vs]
        ref = naive_ttt(*args, kk, vv, doc, 0.25)
        # eager flex on CPU (compiled CPU flex has no return_lse); same block mask and mask_mod
        got = TTTAttention(doc, 0.25, "flex", compiled=False)(*args, kk, vv)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_flex_gets_equal_head_widths_unpadded(monkeypatch):
    """Llama's 112-wide heads reach flex as they are (flex rounds the width up inside its
    kernels): no padded copy of q, k0 and v0 per TTT step kept for backward. Unequal widths
    (MLA's 192 / 128) are padded to one power of two, as measured."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from remote_agent.eagle3.drafter.model import ttt_attention

    seen = []
    flex = ttt_attention._flex_fn(False)

    def spy(compiled=True):
        def call(q, k, v, **kw):
            seen.append((q.shape[-1], k.shape[-1], v.shape[-1]))
            return flex(q, k, v, **kw)

        return call

    monkeypatch.setattr(ttt_attention, "_flex_fn", spy)
    for d, dv in ((112, 112), (24, 16)):
        q, k0, v0, _, _, doc = _inputs(heads=2, kv_heads=2, n=16, d=d, dv=dv, lengths=(16,))
        q, k0, v0 = (t.detach() for t in (q, k0, v0))  # CPU flex has no backward
        out = TTTAttention(doc, 0.25, "flex", compiled=False)(q, k0, v0, [], [])
        assert out.shape[-1] == dv
    assert seen == [(112, 112, 112), (32, 32, 32)]


@pytest.mark.parametrize("backend", ["dense", "chunked"])
def test_query_rows_equal_the_same_rows_of_the_full_attention(backend):
    """Steps >= 1 on a subset of positions: values and gradients of those rows are unchanged."""
    q, k0, v0, ks, vs, doc = _inputs(heads=4, kv_heads=2, n=24, steps=3, lengths=(7, 10, 4))
    rows = torch.tensor([0, 3, 6, 7, 8, 15, 16, 17, 22])  # both sides of document borders
    full = TTTAttention(doc, 0.3, backend, block=5)(q, k0, v0, ks, vs)[:, :, rows]
    sub = TTTAttention(doc, 0.3, backend, block=4, rows=rows)
    qs, kss, vss = q[:, :, rows], [k[:, :, rows] for k in ks], [v[:, :, rows] for v in vs]
    got = sub(qs, k0, v0, kss, vss)
    torch.testing.assert_close(got, full, rtol=1e-10, atol=1e-10)
    assert_same_grads(got, full, [q, k0, v0, *ks, *vs])


def test_flex_query_rows_match_reference_on_cpu():
    pytest.importorskip("torch.nn.attention.flex_attention")
    q, k0, v0, ks, vs, doc = _inputs(heads=2, kv_heads=2, n=32, d=16, dv=16, lengths=(10, 22))
    rows = torch.tensor([1, 2, 9, 10, 11, 30])
    with torch.no_grad():
        q, k0, v0 = (t.detach().float() for t in (q, k0, v0))
        kk = [t.detach().float()[:, :, rows] for t in ks]
        vv = [t.detach().float()[:, :, rows] for t in vs]
        ref = naive_ttt(
            q, k0, v0, [t.detach().float() for t in ks], [t.detach().float() for t in vs], doc, 0.25
        )[:, :, rows]
        att = TTTAttention(doc, 0.25, "flex", compiled=False, rows=rows)
        got = att(q[:, :, rows], k0, v0, kk, vv)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_query_rows_are_checked():
    q, k0, v0, ks, vs, doc = _inputs(n=24)
    with pytest.raises(ValueError, match="strictly increasing"):
        TTTAttention(doc, 0.3, "dense", rows=torch.tensor([3, 2]))
    att = TTTAttention(doc, 0.3, "dense", rows=torch.tensor([2, 3]))
    with pytest.raises(ValueError, match="expected 24 or 2"):
        att(q[:, :, :5], k0, v0, [], [])


@pytest.mark.parametrize("recompute", [False, True], ids=["kept", "recomputed"])
def test_compiled_merge_matches_eager_values_and_grads(recompute, monkeypatch):
    """compile_merge (the trainer's compile on CUDA) runs merge_diagonal as torch.compile'd
    kernels, here through Inductor's CPU backend: the eager merge's values and gradients (fp64,
    GQA, up to three earlier steps, blocks of the recomputed merge), and the reference's."""
    from remote_agent.eagle3.drafter.model import merge

    monkeypatch.setattr(merge, "MERGE_ROWS", 10)  # three blocks, a short last one
    for steps in (2, 4):
        q, k0, v0, ks, vs, doc = _inputs(steps=steps)
        kw = dict(block=5, recompute_merge=recompute)
        eager = TTTAttention(doc, 0.3, "chunked", **kw)(q, k0, v0, ks, vs)
        compiled = TTTAttention(doc, 0.3, "chunked", compile_merge=True, **kw)
        assert compiled.merge is not eager_merge()
        got = compiled(q, k0, v0, ks, vs)
        torch.testing.assert_close(got, eager, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got, naive_ttt(q, k0, v0, ks, vs, doc, 0.3))
        assert_same_grads(got, eager, [q, k0, v0, *ks, *vs])


def eager_merge():
    from remote_agent.eagle3.drafter.model.merge import merge_diagonal

    return merge_diagonal
