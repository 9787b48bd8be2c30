"""Long sequences in query shards (train.shard_tokens, drafter/train/shards.py) train exactly what the
one-pass step trains: the same losses, gradients and draft argmax (fp32: to rounding of the
order of sums; bf16: within bf16 rounding of the gradient sums over shards), for packed
documents crossing shard borders, a short last shard, both attention flavours and every
memory option; the flex block mask of a shard is create_block_mask's."""

from __future__ import annotations

import pytest
import torch
from test_drafter_model_loss import model_drafter
from test_drafter_skip_rows import chat_batch, vocab

from remote_agent.eagle3.distributed import Dist
from remote_agent.eagle3.drafter.train import shards
from remote_agent.eagle3.drafter.train.config import TrainSection
from remote_agent.eagle3.drafter.train.data import embed_rows
from remote_agent.eagle3.drafter.train.loop import compile_layer
from remote_agent.eagle3.drafter.train.step import StepContext, TTTStep, forward_backward


def run(
    arch: str, shard: int, bf16: bool = False, backend: str = "chunked", noise: float = 0.0,
    checkpoint: bool = False, cast: bool = False, elementwise: bool = False,
    host_embeds: bool = False, calls: list | None = None, compiled: bool = False,
    embed_once: bool = False, host_head: bool = False,
):  # fmt: skip
    """One trainer step on chat_batch (60 positions, 3 documents and padding); shard 0 = the
    one-pass step."""
    torch.manual_seed(0)
    drafter = model_drafter(arch, draft_vocab=60)
    lm_head, t2d = vocab()
    ids = t2d.nonzero().flatten()
    drafter.set_vocab(ids - torch.arange(60), t2d)
    tc = TrainSection(
        ttt_steps=4, skip_idle_rows=False, device="cpu", shard_tokens=shard, noise_std=noise,
        teacher_chunk=8,
    )  # fmt: skip
    module = TTTStep(
        drafter, tc.ttt_steps, 7, checkpoint_steps=checkpoint, cast_weights_once=cast,
        recompute_elementwise=elementwise, compile_loss=compiled, embed_once=embed_once,
    )  # fmt: skip
    if compiled:  # as the trainer compiles on CUDA (here Inductor's CPU backend)
        compile_layer(drafter, checkpointed=checkpoint)
    ctx = StepContext(
        module, lm_head.to(torch.bfloat16) if bf16 else lm_head, drafter.draft_ids(),
        drafter.t2d, tc.ttt_steps, [tc.step_weight**k for k in range(tc.ttt_steps)],
        drafter.midlayer.self_attn.scale, backend,
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16, cache_enabled=False),
        bf16, Dist(), tc,
    )  # fmt: skip
    if host_head:
        from remote_agent.eagle3.drafter.model.memory import HostWeight

        ctx.host_head, ctx.lm_head = HostWeight(ctx.lm_head, torch.device("cpu")), None
    b = chat_batch()
    if bf16:
        b.aux, b.final = b.aux.to(torch.bfloat16), b.final.to(torch.bfloat16)
    if host_embeds:
        table = drafter.embed_tokens.weight.detach().clone()
        b.embeds = embed_rows(table, b.input_ids, tc.ttt_steps)
        drafter.embed_tokens.weight = torch.nn.Parameter(table[:0], requires_grad=False)
    if calls is not None:  # count the shards' unrolls
        ttt = drafter.ttt

        def counted(*a, **kw):
            calls.append(
                a[3].rows.tolist() if hasattr(a[3], "rows") and a[3].rows is not None else None
            )
            return ttt(*a, **kw)

        drafter.ttt = counted  # type: ignore[method-assign]
    out = forward_backward(ctx, b, 3)
    grads = {k: p.grad.clone() for k, p in drafter.named_parameters() if p.grad is not None}
    return out, grads


def compare(got, g_got, ref, g_ref, rtol, atol):
    for a, b in zip(got.losses, ref.losses, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=rtol, atol=atol)
    assert g_got.keys() == g_ref.keys() and len(g_ref) > 5
    for name, g in g_ref.items():
        assert g.abs().sum() > 0 or name.endswith("bias"), name
        torch.testing.assert_close(g_got[name], g, rtol=rtol, atol=atol * g.abs().max(), msg=name)
    for a, b in zip(got.args, ref.args, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(got.counts, ref.counts)


@pytest.mark.parametrize("arch", ["llama", "mla"])
@pytest.mark.parametrize("shard", [16, 23, 59])
@pytest.mark.parametrize("backend", ["chunked", "dense"])
def test_shards_equal_the_one_pass_step_in_fp32(arch, shard, backend):
    """fp32: documents crossing shard borders, a short last shard (60 = 3 x 16 + 12, 2 x 23 +
    14, 59 + 1), noise on the aux states: the one-pass step's values to fp32 rounding."""
    calls: list = []
    got, g_got = run(arch, shard, backend=backend, noise=0.05, calls=calls)
    ref, g_ref = run(arch, 0, backend=backend, noise=0.05)
    assert len(calls) == -(-60 // shard)  # one unroll per shard
    compare(got, g_got, ref, g_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("embed_once", [False, True])
@pytest.mark.parametrize("arch", ["llama", "mla"])
def test_shards_with_the_embedding_half_once_equal_the_one_pass_step(arch, embed_once):
    """The defaults' embed_once inside shards (each shard's embedding half over its rows plus
    the TTT pad, open-ended column sums): the one-pass step's values in fp32."""
    got, g_got = run(arch, 16, cast=True, elementwise=True, embed_once=embed_once)
    ref, g_ref = run(arch, 0, cast=True, elementwise=True, embed_once=embed_once)
    compare(got, g_got, ref, g_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opts", ["plain", "mid", "lean", "defaults"])
def test_shards_equal_the_one_pass_step_in_bf16(opts):
    """bf16 autocast with the memory options (shared casts summed open-ended, recomputed
    merge and norm, per-step checkpointing inside a shard) and the host embedding: within
    bf16 rounding of the one-pass step (the gradients of the step-0 keys and values are summed
    over shards in bf16, as over the TTT steps; here 5.7e-3 of the largest gradient), and as
    close to the fp32 step as the one-pass bf16 step is (4.0e-2 vs 4.2e-2 here)."""
    cast = elementwise = opts != "plain"
    checkpoint = opts == "lean"
    got, g_got = run(
        "llama", 16, bf16=True, checkpoint=checkpoint, cast=cast, elementwise=elementwise,
        host_embeds=True,
    )  # fmt: skip
    ref, g_ref = run(
        "llama", 0, bf16=True, checkpoint=checkpoint, cast=cast, elementwise=elementwise
    )
    compare(got, g_got, ref, g_ref, rtol=1e-2, atol=1e-2)
    _, g32 = run("llama", 0)

    def err(grads):
        return max(
            float((grads[k].float() - g).abs().max() / g.abs().max()) for k, g in g32.items()
        )

    assert err(g_got) <= 1.1 * err(g_ref), (err(g_got), err(g_ref))


@pytest.mark.parametrize("opts", ["mid", "lean"])
def test_compiled_shards_equal_the_eager_ones(opts, monkeypatch):
    """What runs on CUDA, compiled here by Inductor's CPU backend: the layer halves (step 0's
    projections without a graph in phase 1, with it in the shards and in phase 3; a short last
    shard), the norm, the TTT merge and the soft CE: the eager sharded step's values."""
    from remote_agent.eagle3.drafter.model import ttt_attention

    merge_fn = ttt_attention._merge_fn
    checkpoint = opts == "lean"
    eager, g_eager = run(
        "llama", 16, checkpoint=checkpoint, cast=True, elementwise=True, embed_once=True
    )
    monkeypatch.setattr(ttt_attention, "_merge_fn", lambda compiled: merge_fn(True))
    comp, g_comp = run(
        "llama", 16, checkpoint=checkpoint, cast=True, elementwise=True, compiled=True,
        embed_once=True,
    )  # fmt: skip
    compare(comp, g_comp, eager, g_eager, rtol=1e-4, atol=1e-5)


def test_shards_apply_to_long_batches_of_one_process_only():
    class C:
        tc = TrainSection(shard_tokens=128)
        dist = Dist()

    assert shards.applies(C, 129) and not shards.applies(C, 128)
    C.dist = Dist(0, 2)
    assert not shards.applies(C, 4096)
    C.dist, C.tc = Dist(), TrainSection(shard_tokens=0)
    assert not shards.applies(C, 1 << 20)
    assert shards.shard_bounds(300, 128) == [(0, 128), (128, 256), (256, 300)]


@pytest.mark.parametrize("n", [256, 300, 1000])
def test_shard_block_mask_equals_create_block_mask(n):
    """flex over a shard's query rows against every key: the block mask built from per-block
    document ranges equals create_block_mask's with the shard offset in its mask_mod."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from torch.nn.attention.flex_attention import create_block_mask

    from remote_agent.eagle3.drafter.model.ttt_attention import (
        doc_ids_from_lengths,
        flex_block_mask_range,
    )

    names = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
             "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")  # fmt: skip
    for lengths in ([n], [1, 127, 129, 3, 200, 64, 500]):
        cut, left = [], n
        for length in lengths:  # the rest after the documents is padding (one more doc)
            if left:
                cut.append(min(length, left))
                left -= cut[-1]
        doc = doc_ids_from_lengths(cut, n).unsqueeze(0)
        for lo, hi in ((0, 128), (128, 256), (0, n), (256 if n > 256 else 128, n)):
            got = flex_block_mask_range(doc, lo, hi)
            want = create_block_mask(
                lambda b, h, q, k, lo=lo, doc=doc: (k <= q + lo) & (doc[b, q + lo] == doc[b, k]),
                1, None, hi - lo, n, "cpu",
            )  # fmt: skip
            for name in names:
                assert torch.equal(getattr(got, name), getattr(want, name)), (cut, lo, hi, name)
            assert got.seq_lengths == want.seq_lengths == (hi - lo, n)
    with pytest.raises(ValueError, match="multiples of 128"):
        flex_block_mask_range(doc, 64, 192)


def test_flex_shard_rows_equal_the_full_attention_rows_on_cpu():
    """Eager flex on CPU (no backward there): a shard's query rows against every key give the
    full causal attention's rows (112-wide heads, documents crossing the shard border)."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from remote_agent.eagle3.drafter.model.ttt_attention import TTTAttention, doc_ids_from_lengths

    g = torch.Generator().manual_seed(0)
    n = 384
    doc = doc_ids_from_lengths([100, 200, 50], n).unsqueeze(0)
    q, k, v = (torch.randn(1, 2, n, 112, generator=g) for _ in range(3))
    full, lse = TTTAttention(doc, 0.1, "flex", compiled=False).causal(q, k, v)
    for lo, hi in ((0, 128), (128, 384), (256, 384)):
        att = shards.ShardAttention(doc, lo, hi, k, v, 0.1, "flex", compiled=False)
        o, l_ = att.causal(q[:, :, lo:hi], None, None)
        torch.testing.assert_close(o, full[:, :, lo:hi], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(l_, lse[:, :, lo:hi], rtol=1e-5, atol=1e-5)
