"""Sequence parallelism's flex kernel on a GPU (device only, never CI).

Each rank's query rows attend to the gathered step-0 keys through compiled flex with the mask of
its rows (flex_block_mask_range, borders on 128-position blocks), then merge its TTT diagonal
keys: `SeqParallelAttention(..., "flex")`. Checked here: values and gradients of every rank's
share, concatenated (queries, diagonal keys) or summed over ranks (the gathered keys, as the
reduce-scatter sums them), against the one-rank dense fp32 formula; llama (GQA) and MLA widths,
fp32 and bf16, 2 and 3 ranks, documents ending mid-block.

One process stands in for the ranks: the gather is replaced by what it returns (the full K/V),
so this checks the kernel and mask; the collectives are checked on CPU with gloo ranks
(tests/eagle3/drafter/test_drafter_seq_parallel.py). No two-GPU machine was lent to run NCCL.

Run (pytest may be absent on the device):
    python3 tests/gpu/test_seq_parallel_flex_gpu.py [--out FILE]
    pytest -m gpu tests/gpu/test_seq_parallel_flex_gpu.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from unittest import mock

import pytest

STEPS = 4
N = 1024  # 8 blocks of 128: 2 ranks hold 4 each, 3 ranks 3, 3 and 2
LENGTHS = [300, 420, 230]  # documents end mid-block; the last 74 positions are padding


def _case(
    dtype, heads: int, kv: int, d: int, dv: int, world: int, dev="cuda", kernel="flex"
) -> dict:
    """One shape; dev="cpu", kernel="chunked" rehearses this harness on CPU."""
    import torch

    from remote_agent.eagle3.drafter.model.ttt_attention import (
        BLOCK,
        TTTAttention,
        doc_ids_from_lengths,
    )
    from remote_agent.eagle3.drafter.parallel.seq_attention import (
        SeqParallelAttention,
        split_offsets,
    )

    g = torch.Generator(device=dev).manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g, device=dev, dtype=dtype).requires_grad_()

    q, k0, v0 = r(1, heads, N, d), r(1, kv, N, d), r(1, kv, N, dv)
    ks = [r(1, kv, N, d) for _ in range(STEPS - 1)]
    vs = [r(1, kv, N, dv) for _ in range(STEPS - 1)]
    leaves = [q, k0, v0, *ks, *vs]
    doc = doc_ids_from_lengths(LENGTHS, N, device=dev).unsqueeze(0)
    up = torch.randn(1, heads, N, dv, generator=g, device=dev)
    scale = d**-0.5

    ref_leaves = [x.detach().float().requires_grad_() for x in leaves]
    rq, rk, rv, *rest = ref_leaves
    o_ref = TTTAttention(doc, scale, "dense")(rq, rk, rv, rest[: STEPS - 1], rest[STEPS - 1 :])
    g_ref = torch.autograd.grad((o_ref * up).sum(), ref_leaves)

    offsets = split_offsets(N, world, BLOCK)
    outs = []
    grads = [torch.zeros_like(x, dtype=torch.float32) for x in leaves]
    for rank in range(world):
        lo, hi = offsets[rank], offsets[rank + 1]
        with (
            mock.patch("torch.distributed.is_initialized", return_value=True),
            mock.patch("torch.distributed.get_world_size", return_value=world),
            mock.patch("torch.distributed.get_rank", return_value=rank),
        ):
            att = SeqParallelAttention(doc, offsets, scale, kernel)
        assert kernel != "flex" or (att.compiled and att.block_mask is not None)
        att._gathered = lambda k, v: (k0, v0)  # what the all-gather returns: every rank's K/V
        mine = [x[:, :, lo:hi] for x in (q, *ks, *vs)]
        o = att(mine[0], k0[:, :, lo:hi], v0[:, :, lo:hi], mine[1:STEPS], mine[STEPS:])
        gr = torch.autograd.grad((o.float() * up[:, :, lo:hi]).sum(), leaves)
        for acc, x in zip(grads, gr, strict=True):
            acc += x.float()  # zero outside this rank's rows, except the gathered K/V: summed
        outs.append(o.detach().float())
    o = torch.cat(outs, dim=2)
    o_ref = o_ref.detach()
    err = float((o - o_ref).norm() / o_ref.norm())
    gerr = max(float((a - b).norm() / b.norm()) for a, b in zip(grads, g_ref, strict=True))
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "heads": heads,
        "kv_heads": kv,
        "head_dim": [d, dv],
        "world": world,
        "offsets": offsets,
        "out_rel_err": err,
        "grad_rel_err": gerr,
        "ok": err < tol and gerr < tol,
    }


def run_all() -> dict:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    llama, mla = (8, 2, 112, 112), (8, 8, 192, 128)  # GQA; MLA's 192 / 128 widths
    # each rank's row count is a compile of its own (static shapes): four compiles in all
    plan = [(torch.float32, llama, 2), (torch.bfloat16, llama, 3), (torch.bfloat16, mla, 2)]
    cases = [_case(dtype, *shape, world) for dtype, shape, world in plan]
    return {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cases": cases,
        "ok": all(c["ok"] for c in cases),
    }


@pytest.mark.gpu
def test_seq_parallel_flex_equals_one_rank():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (device machine)")
    report = run_all()
    assert report["ok"], json.dumps(report["cases"], indent=1)


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench/results/seq-parallel-flex-gpu.json"))
    args = p.parse_args()
    report = run_all()
    for c in report["cases"]:
        print(json.dumps(c))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(("ok" if report["ok"] else "FAILED") + f": {args.out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main())
