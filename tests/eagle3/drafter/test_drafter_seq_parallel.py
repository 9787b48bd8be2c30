"""Sequence parallelism: the TTT unroll of one packed sequence split across 2 and 3 gloo ranks
(uneven chunks) gives the single-rank outputs and, summed over ranks, the same gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from test_drafter_model_loss import model_drafter
from test_drafter_skip_rows import chat_batch

from remote_agent.eagle3.distributed import leave_now
from remote_agent.eagle3.drafter.model.ttt_attention import BLOCK, TTTAttention
from remote_agent.eagle3.drafter.parallel.seq_attention import SeqParallelAttention, split_offsets
from remote_agent.eagle3.drafter.train.data import step_targets

STEPS = 3
# documents ending mid-block, so flex's shards see partial blocks: 350 positions, 3 blocks
LONG = {"spans": ((60, 90), (40, 70), (30, 50)), "pad": 10}


def _batch(backend: str):
    return chat_batch(**LONG) if backend == "flex" else chat_batch()


def _offsets(backend: str, n: int, world: int) -> list[int]:
    return split_offsets(n, world, BLOCK if backend == "flex" else 1)


def _unroll(arch: str, attention, lo: int, hi: int, b, grad: bool = True):
    """(outputs of rows lo:hi per step, drafter) after the backward of a fixed random weighting
    of them (grad: flex has no backward on CPU, tests/gpu/test_seq_parallel_flex_gpu.py)."""
    torch.manual_seed(0)
    drafter = model_drafter(arch, draft_vocab=60)
    st = step_targets(b, STEPS)
    with torch.set_grad_enabled(grad):
        outs = drafter.ttt(
            b.aux[:, lo:hi], [x[:, lo:hi] for x in st.ids], b.positions[:, lo:hi], attention,
            STEPS,
        )  # fmt: skip
    if not grad:
        return outs, drafter
    g = torch.Generator().manual_seed(7)
    w = [torch.randn(1, b.input_ids.shape[1], o.shape[-1], generator=g) for o in outs]
    loss = sum((o * wk[:, lo:hi]).sum() for o, wk in zip(outs, w, strict=True))
    loss.backward()
    return outs, drafter


def _rank(rank: int, world: int, init: str, out: str, arch: str, backend: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        b = _batch(backend)
        offsets = _offsets(backend, b.input_ids.shape[1], world)
        lo, hi = offsets[rank], offsets[rank + 1]
        scale = model_drafter(arch, draft_vocab=60).midlayer.self_attn.scale
        att = SeqParallelAttention(b.doc, offsets, scale, backend, block=8)
        outs, drafter = _unroll(arch, att, lo, hi, b, grad=backend != "flex")
        grads = {}
        for name, p in drafter.named_parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                grads[name] = p.grad
        torch.save({"outs": [o.detach() for o in outs], "grads": grads}, f"{out}/rank{rank}.pt")
    finally:
        dist.barrier()  # gloo aborts a rank whose peer leaves mid-exchange
        dist.destroy_process_group()
    leave_now()  # a rank that finished: no interpreter teardown (gloo aborted it under load)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize(
    "arch,backend", [("llama", "chunked"), ("mla", "dense"), ("llama", "flex"), ("mla", "flex")]
)
def test_split_sequence_equals_one_rank(tmp_path: Path, world, arch, backend):
    """flex: the GPU's kernel, eager here (the same BlockMask and kernel call, not compiled),
    each rank's rows against all keys, borders on 128-position blocks; the reference is the
    one-rank chunked kernel. Forward only for flex (no backward on CPU): its gradients are
    tests/gpu/test_seq_parallel_flex_gpu.py's."""
    b = _batch(backend)
    n = b.input_ids.shape[1]
    scale = model_drafter(arch).midlayer.self_attn.scale
    ref_att = TTTAttention(b.doc, scale, "chunked" if backend == "flex" else backend)
    ref_outs, ref = _unroll(arch, ref_att, 0, n, b, grad=backend != "flex")
    init = f"file://{tmp_path}/init"
    mp.spawn(_rank, args=(world, init, str(tmp_path), arch, backend), nprocs=world, join=True)
    res = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    offsets = _offsets(backend, n, world)
    assert offsets[-1] == n and all(a < z for a, z in zip(offsets, offsets[1:], strict=False))
    for k in range(STEPS):
        got = torch.cat([r["outs"][k] for r in res], dim=1)
        torch.testing.assert_close(got, ref_outs[k].detach(), rtol=1e-5, atol=1e-5)
    grads = {name: p.grad for name, p in ref.named_parameters() if p.grad is not None}
    if backend == "flex":
        assert not grads and not res[0]["grads"]
        return
    assert res[0]["grads"].keys() == grads.keys() and len(grads) > 5
    for name, g in grads.items():
        tol = 1e-6 * float(g.abs().max())  # fp32 sums in another order: relative to the scale
        for r in res:  # every rank holds the same summed gradient
            torch.testing.assert_close(r["grads"][name], g, rtol=1e-4, atol=tol, msg=name)


def test_offsets_are_checked():
    with pytest.raises(ValueError, match="offsets"):
        SeqParallelAttention(chat_batch().doc, [0, 3], 0.5)
    assert split_offsets(10, 3) == [0, 4, 7, 10]
    assert split_offsets(350, 2, BLOCK) == [0, 256, 350]
    assert split_offsets(350, 3, BLOCK) == [0, 128, 256, 350]
    with pytest.raises(ValueError, match="cannot be split"):
        split_offsets(200, 3, BLOCK)


def test_flex_shards_must_sit_on_its_block_borders():
    """flex's mask of rows lo..hi is built from whole query blocks: a border inside a block
    would be a silently wrong mask, so it is refused (world 1 stands in for the ranks)."""
    b = chat_batch(**LONG)
    n = b.input_ids.shape[1]
    with pytest.raises(ValueError, match="multiples of 128"):
        _shard_attention(b, [0, 175, n], 1)
    att = _shard_attention(b, [0, 256, n], 1)
    assert att.block_mask is not None and att.rows.tolist() == list(range(256, n))


def _shard_attention(b, offsets: list[int], rank: int) -> SeqParallelAttention:
    """SeqParallelAttention for `rank` of len(offsets) - 1 without a process group."""
    from unittest import mock

    world = len(offsets) - 1
    with (
        mock.patch("torch.distributed.is_initialized", return_value=True),
        mock.patch("torch.distributed.get_world_size", return_value=world),
        mock.patch("torch.distributed.get_rank", return_value=rank),
    ):
        return SeqParallelAttention(b.doc, offsets, 0.5, "flex")


def test_the_trainer_splits_for_flex_where_every_rank_gets_a_block():
    from remote_agent.eagle3.drafter.train.seq_parallel_step import sp_split

    assert sp_split("flex", 350, 2) == ("flex", [0, 256, 350])
    assert sp_split("flex", 350, 4) == ("chunked", [0, 88, 176, 263, 350])  # 3 blocks, 4 ranks
    assert sp_split("chunked", 350, 2) == ("chunked", [0, 175, 350])
    assert sp_split("dense", 10, 3) == ("dense", [0, 4, 7, 10])


def _drafter_and_head():
    from test_drafter_skip_rows import vocab

    torch.manual_seed(0)
    drafter = model_drafter("llama", draft_vocab=60)
    lm_head, t2d = vocab()
    ids = t2d.nonzero().flatten()
    drafter.set_vocab(ids - torch.arange(60), t2d)
    return drafter, lm_head


def _step_rank(rank: int, world: int, init: str, out: str, backend: str) -> None:
    import torch.distributed as dist

    from remote_agent.eagle3.drafter.train.seq_parallel_step import seq_parallel_step

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        drafter, lm_head = _drafter_and_head()
        w = [0.8**k for k in range(STEPS)]
        sums, counts = seq_parallel_step(
            drafter, _batch(backend), lm_head, STEPS, w, block=8, backend=backend
        )
        grads = {}
        for name, p in drafter.named_parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                grads[name] = p.grad
        torch.save({"sums": sums, "counts": counts, "grads": grads}, f"{out}/step{rank}.pt")
    finally:
        dist.barrier()  # gloo aborts a rank whose peer leaves mid-exchange
        dist.destroy_process_group()
    leave_now()  # a rank that finished: no interpreter teardown (gloo aborted it under load)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("backend", ["chunked"])  # flex: tests/gpu (no backward on CPU)
def test_split_training_step_equals_the_single_rank_step(tmp_path: Path, world, backend):
    from remote_agent.eagle3.distributed import Dist
    from remote_agent.eagle3.drafter.train.config import TrainSection
    from remote_agent.eagle3.drafter.train.step import StepContext, TTTStep, forward_backward

    drafter, lm_head = _drafter_and_head()
    tc = TrainSection(ttt_steps=STEPS, skip_idle_rows=False, device="cpu")
    w = [0.8**k for k in range(STEPS)]
    ctx = StepContext(
        TTTStep(drafter, STEPS, 2048), lm_head, drafter.draft_ids(), drafter.t2d, STEPS, w,
        drafter.midlayer.self_attn.scale, "chunked", torch.autocast("cpu", enabled=False),
        False, Dist(), tc,
    )  # fmt: skip
    ref = forward_backward(ctx, _batch(backend), 0)
    init = f"file://{tmp_path}/init"
    mp.spawn(_step_rank, args=(world, init, str(tmp_path), backend), nprocs=world, join=True)
    res = [torch.load(tmp_path / f"step{r}.pt") for r in range(world)]
    torch.testing.assert_close(res[0]["counts"], ref.counts, rtol=0, atol=0)
    torch.testing.assert_close(
        res[0]["sums"], torch.stack(ref.losses).detach(), rtol=1e-5, atol=1e-5
    )
    grads = {n: p.grad for n, p in drafter.named_parameters() if p.grad is not None}
    assert res[0]["grads"].keys() == grads.keys()
    for name, g in grads.items():
        tol = 1e-6 * float(g.abs().max())
        for r in res:
            torch.testing.assert_close(r["grads"][name], g, rtol=1e-4, atol=tol, msg=name)


COLLECTIVES = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "all_gather")


def _count_collectives(monkeypatch_like: dict) -> dict[str, int]:
    """Wraps torch.distributed's collectives with counters (the real ones still run)."""
    import torch.distributed as dist

    counts = dict.fromkeys(COLLECTIVES, 0)
    for name in COLLECTIVES:
        real = getattr(dist, name)
        monkeypatch_like[name] = real

        def counted(*a, _real=real, _name=name, **kw):
            counts[_name] += 1
            return _real(*a, **kw)

        setattr(dist, name, counted)
    return counts


def _counted_rank(
    rank: int, world: int, init: str, out: str, checkpoint: bool, backend: str
) -> None:
    import torch.distributed as dist

    from remote_agent.eagle3.drafter.train.seq_parallel_step import (
        all_reduce_grads,
        seq_parallel_step,
    )

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        drafter, lm_head = _drafter_and_head()
        w = [0.8**k for k in range(STEPS)]
        saved: dict = {}
        counts = _count_collectives(saved)
        seq_parallel_step(
            drafter, _batch(backend), lm_head, STEPS, w, block=8, checkpoint=checkpoint,
            backend=backend,
        )  # fmt: skip
        step_counts = dict(counts)
        params = [p for p in drafter.parameters() if p.requires_grad]
        all_reduce_grads(params)
        for name, real in saved.items():
            setattr(dist, name, real)
        grads = {n: p.grad for n, p in drafter.named_parameters() if p.grad is not None}
        torch.save(
            {"step": step_counts, "after": dict(counts), "params": len(params), "grads": grads},
            f"{out}/counted{rank}.pt",
        )
    finally:
        dist.barrier()
        dist.destroy_process_group()
    leave_now()  # a rank that finished: no interpreter teardown (gloo aborted it under load)


@pytest.mark.parametrize("checkpoint", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("backend", ["chunked"])  # flex: tests/gpu (no backward on CPU)
def test_one_gather_and_one_reduce_scatter_per_step(tmp_path: Path, checkpoint, backend):
    """Per step: one all-gather of the step-0 K/V (also when per-step checkpointing recomputes
    step 0 in backward), one reduce-scatter of its gradient, two small all-reduces (valid
    counts; the loss sums of seq_parallel_step), no all-reduce of the gathered gradient; then
    one in-place all-reduce per parameter gradient (no flat copy). The gradients equal the
    single-rank step's (2 gloo ranks; no multi-GPU machine was lent to measure NCCL)."""
    from remote_agent.eagle3.distributed import Dist
    from remote_agent.eagle3.drafter.train.config import TrainSection
    from remote_agent.eagle3.drafter.train.step import StepContext, TTTStep, forward_backward

    world = 2
    drafter, lm_head = _drafter_and_head()
    tc = TrainSection(ttt_steps=STEPS, skip_idle_rows=False, device="cpu")
    w = [0.8**k for k in range(STEPS)]
    ctx = StepContext(
        TTTStep(drafter, STEPS, 2048), lm_head, drafter.draft_ids(), drafter.t2d, STEPS, w,
        drafter.midlayer.self_attn.scale, "chunked", torch.autocast("cpu", enabled=False),
        False, Dist(), tc,
    )  # fmt: skip
    forward_backward(ctx, _batch(backend), 0)
    init = f"file://{tmp_path}/init"
    mp.spawn(_counted_rank, args=(world, init, str(tmp_path), checkpoint, backend), nprocs=world)
    res = [torch.load(tmp_path / f"counted{r}.pt") for r in range(world)]
    for r in res:
        assert r["step"] == {
            "all_gather_into_tensor": 1, "reduce_scatter_tensor": 1, "all_reduce": 2,
            "all_gather": 0,
        }, r["step"]  # fmt: skip
        assert r["after"]["all_reduce"] == 2 + r["params"]
    grads = {n: p.grad for n, p in drafter.named_parameters() if p.grad is not None}
    for name, g in grads.items():
        tol = 1e-6 * float(g.abs().max())
        for r in res:
            torch.testing.assert_close(r["grads"][name], g, rtol=1e-4, atol=tol, msg=name)
