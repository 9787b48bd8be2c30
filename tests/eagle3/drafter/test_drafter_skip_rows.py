"""Skipping idle rows (prompts, padding, undraftable teacher tokens) in TTT steps >= 1 and in the
draft lm_head is exact: same losses, gradients and metrics as computing every position."""

from __future__ import annotations

import pytest
import torch
from test_drafter_model_loss import model_drafter

from remote_agent.eagle3.distributed import Dist
from remote_agent.eagle3.drafter.model.ttt_attention import doc_ids_from_lengths
from remote_agent.eagle3.drafter.train.config import TrainSection
from remote_agent.eagle3.drafter.train.data import Batch
from remote_agent.eagle3.drafter.train.loop import StepContext, TTTStep, _Window, forward_backward


def chat_batch(
    seed: int = 0, spans: tuple[tuple[int, int], ...] = ((9, 12), (14, 5), (4, 10)), pad: int = 6
) -> Batch:
    """Packed conversations ((prompt unsupervised, answer supervised) tokens each), then padding."""
    g = torch.Generator().manual_seed(seed)
    lengths = [p + a for p, a in spans]
    n = sum(lengths) + pad
    mask = torch.zeros(n, dtype=torch.bool)
    start = 0
    for p, a in spans:
        mask[start + p : start + p + a] = True
        start += p + a
    pos = torch.cat([torch.arange(x) for x in lengths] + [torch.arange(n - sum(lengths))])
    return Batch(
        torch.randint(0, 100, (1, n), generator=g),
        torch.randn(1, n, 96, generator=g),
        torch.randn(1, n, 32, generator=g),
        mask[None],
        doc_ids_from_lengths(lengths, n).unsqueeze(0),
        pos[None],
        sum(lengths),
        [],
    )


def vocab() -> tuple[torch.Tensor, torch.Tensor]:
    """Target lm_head [100, 32] and a 60-token draft vocabulary (some teacher tokens outside)."""
    ids = torch.randperm(100, generator=torch.Generator().manual_seed(3))[:60]
    t2d = torch.zeros(100, dtype=torch.bool)
    t2d[ids] = True
    return torch.randn(100, 32, generator=torch.Generator().manual_seed(4)), t2d


def run(arch: str, backend: str, skip: bool, only_supervised: int | None = None, depth_tokens=4):
    torch.manual_seed(0)
    drafter = model_drafter(arch, draft_vocab=60)
    lm_head, t2d = vocab()
    ids = t2d.nonzero().flatten()
    drafter.set_vocab(ids - torch.arange(60), t2d)
    tc = TrainSection(ttt_steps=4, skip_idle_rows=skip, device="cpu", sim_draft_tokens=depth_tokens)
    step_w = [tc.step_weight**k for k in range(tc.ttt_steps)]
    ctx = StepContext(
        TTTStep(drafter, tc.ttt_steps, 7),
        lm_head,
        drafter.draft_ids(),
        drafter.t2d,
        tc.ttt_steps,
        step_w,
        drafter.midlayer.self_attn.scale,
        backend,
        torch.autocast("cpu", enabled=False),
        False,
        Dist(),
        tc,
    )
    b = chat_batch()
    if only_supervised is not None:
        b.loss_mask.zero_()
        b.loss_mask[0, only_supervised] = True
    out = forward_backward(ctx, b, 0)
    grads = {k: p.grad.clone() for k, p in drafter.named_parameters() if p.grad is not None}
    window = _Window(step_w, 3)
    window.add(out, b, drafter.draft_ids(), torch.tensor(1.0), 1e-3)
    metrics = window.emit(Dist(), 1, 0, 1.0, 0.0)
    return out, grads, metrics, b.input_ids.shape[1]


@pytest.mark.parametrize("arch", ["llama", "mla"])
@pytest.mark.parametrize("backend", ["dense", "chunked"])
def test_skipping_idle_rows_is_exact(arch, backend):
    full, g_full, m_full, n = run(arch, backend, skip=False)
    part, g_part, m_part, _ = run(arch, backend, skip=True)
    rows = part.plan.rows
    assert rows is not None and 0 < rows.numel() < n * 0.7  # prompts and padding were skipped
    assert full.plan.rows is None
    torch.testing.assert_close(part.counts, full.counts, rtol=0, atol=0)
    for a, b in zip(part.losses, full.losses, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert g_part.keys() == g_full.keys()
    for name, g in g_full.items():
        torch.testing.assert_close(g_part[name], g, rtol=1e-4, atol=1e-6, msg=name)
    # argmax agrees wherever it was computed; every weighted row was computed
    for k, (a, b) in enumerate(zip(part.args, full.args, strict=True)):
        done = a >= 0
        assert bool(done[full.weights[k] > 0].all())
        assert torch.equal(a[done], b[done])
    for key in ("loss", "loss_k", "acc_k", "sim_accept_len"):
        assert m_part[key] == pytest.approx(m_full[key], rel=1e-5), key
    assert m_full["sim_accept_len"] is not None


def test_a_batch_without_any_later_loss_keeps_one_row():
    """Loss only at step 0 (one supervised token, no simulated chains): steps >= 1 run on one row,
    and every trained parameter still gets a gradient (DDP needs them all)."""
    b, (lm_head, t2d) = chat_batch(), vocab()
    in_draft = t2d[(b.final[0] @ lm_head.T).argmax(-1)]
    # weight[k][t-2-k] = mask[t] inside the document: the third token of a document has loss at
    # step 0 only (teacher t-1 drafted)
    third = [int(x) + 2 for x in (b.positions[0] == 0).nonzero().flatten()[:3]]
    t = next(t for t in third if in_draft[t - 1])
    out, grads, _, _ = run("llama", "chunked", skip=True, only_supervised=t, depth_tokens=1)
    assert out.plan.rows.tolist() == [0]
    assert [int(c) for c in out.counts] == [1, 0, 0, 0]
    assert grads["midlayer.mlp.up_proj.weight"].abs().sum() > 0
    assert grads["lm_head.weight"].abs().sum() > 0


def test_row_plan_runs_a_subset_only_when_it_saves_enough():
    from remote_agent.eagle3.drafter.train.loop import RowPlan

    n, steps = 100, 3
    ones = [torch.ones(n - 1 - k) for k in range(steps)]
    plan = RowPlan.build(ones, torch.zeros(n, dtype=torch.bool), 0, skip=True)
    assert plan.rows is None and plan.loss_rows == [None] * steps  # plain slices, no copies

    few_idle = [w.clone() for w in ones]
    for w in few_idle[1:]:
        w[:5] = 0  # 5 idle positions: not worth a subset
    plan = RowPlan.build(few_idle, torch.zeros(n, dtype=torch.bool), 0, skip=True)
    # nearly every row needed: plain slices (the 5 idle rows carry zero weight), no copies
    assert plan.rows is None and plan.loss_rows == [None] * steps

    fifth_idle = [w.clone() for w in ones]
    fifth_idle[0][:5] = 0
    fifth_idle[2][:20] = 0  # 20 idle rows: that step's loss takes a subset copy
    plan = RowPlan.build(fifth_idle, torch.zeros(n, dtype=torch.bool), 0, skip=True)
    assert plan.rows is None and plan.loss_rows[:2] == [None, None]
    assert plan.loss_rows[2].tolist() == list(range(20, n - 3))

    prompt = [w.clone() for w in ones]
    for w in prompt:
        w[:40] = 0  # a 40-token prompt
    plan = RowPlan.build(prompt, torch.zeros(n, dtype=torch.bool), 0, skip=True)
    assert plan.rows.tolist() == list(range(40, n - 2))
    assert plan.out_index[2].tolist() == list(range(0, n - 3 - 40))
