"""Where the drafter's training memory goes: the tensors autograd keeps for backward, by part.

Runs the trainer's step (`step.forward_backward`) on CPU under bf16 autocast with a
saved-tensor hook that files every tensor autograd keeps (unique storages, bytes) under the
first part of the drafter on the Python stack when it was saved: fc, pre (norms, q/k/v, RoPE),
attention (causal part), merge (TTT diagonal, merge.merge_diagonal), post (o_proj,
MLP), loss (norm + chunked soft CE), teacher. Tensors saved during backward (checkpoint
recomputation) are counted apart.

The model is the Kimi-shaped drafter with every width divided by `--scale` (hidden 7168/s,
heads 64/s x 112, MLP 18432/s, vocabularies /s) at `--seq` tokens: every saved tensor is
[T, width] or [heads, T, ...], so its bytes times scale x (4096 / seq) are the Kimi shape's at
4K. The flex kernel (GPU) saves q, k, v (padded 112 -> 128), out and lse per TTT step where
the CPU's chunked kernel recomputes: that is added by arithmetic (`flex_saved_gb`).

Run:  PYTHONPATH=. python3 bench/memory_breakdown.py [--scale 16] [--seq 1024] [--options ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

# stack frames (function names) that name a part, innermost first wins
PARTS = {
    "teacher": "teacher",
    "forward": "loss",  # _SoftCE.forward
    "soft_ce": "loss",
    "merge_diagonal": "merge",
    "_merge_body": "merge",
    "causal": "attention",
    "post": "post",
    "pre": "pre",
    "project": "fc",
}


def part_of_stack() -> str:
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_name
        if name in PARTS and (name != "forward" or "loss.py" in f.f_code.co_filename):
            return PARTS[name]
        if name == "forward" and "train/step.py" in f.f_code.co_filename:
            return "loss"  # the norm before the soft CE
        f = f.f_back
    return "other"


def breakdown(args) -> dict:
    import bench_train
    import torch

    from remote_agent.eagle3.drafter.train.loop import forward_backward

    s = args.scale
    dims = dict(
        hidden=7168 // s,
        heads=64 // s,
        kv_heads=64 // s,
        inter=18432 // s,
        vocab=163840 // s,
        draft_vocab=32000 // s,
    )
    ns = argparse.Namespace(  # the plain unroll; --options adds to it
        arch="llama", ttt=args.ttt, attention="chunked", no_compile=True, plain=True, **dims
    )
    drafter, ctx, _params, _opt, config, _ = bench_train.build(ns, "cpu")
    assert config["head_dim"] == 112
    for name in args.options:
        assert hasattr(ctx.model, name), name
        setattr(ctx.model, name, True)
    if args.compile:  # inductor's own choice of saved tensors (the GPU compiles pre/post)
        from remote_agent.eagle3.drafter.train.loop import compile_layer

        compile_layer(drafter, checkpointed=ctx.model.checkpoint_steps)
    drafter.embed_tokens.to(torch.bfloat16)
    ctx.lm_head = ctx.lm_head.to(torch.bfloat16)
    ctx.autocast, ctx.bf16 = torch.autocast("cpu", dtype=torch.bfloat16), True
    b, _ = bench_train.synthetic_batch(
        config, args.seq, 1, "cpu", teacher=(ctx.lm_head, ctx.draft_ids)
    )
    b.aux = b.aux.to(torch.bfloat16)
    seen: dict[str, set] = defaultdict(set)
    sizes: dict[str, int] = defaultdict(int)
    # copies of weight matrices scale with width^2, activations with width x tokens
    matrices = {tuple(p.shape) for p in drafter.parameters() if p.ndim == 2}
    assert args.seq not in {d for m in matrices for d in m}, "pick a --seq unlike any width"

    def pack(t):
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return t
        key = t.untyped_storage().data_ptr()
        in_backward = torch._C._current_graph_task_id() != -1
        part = ("recompute:" if in_backward else "") + part_of_stack()
        if t.ndim == 2 and tuple(t.shape) in matrices and t.dtype != torch.float32:
            part = ("recompute:" if in_backward else "") + "weight copies"
        if key not in seen["*" + ("b" if in_backward else "f")]:
            seen["*" + ("b" if in_backward else "f")].add(key)
            sizes[part] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward_backward(ctx, b, 0)
    factor = s * (4096 / args.seq)
    kimi = {
        k: round(v * (s * s if k.endswith("weight copies") else factor) / 2**30, 2)
        for k, v in sorted(sizes.items())
    }
    fwd_total = sum(v for k, v in kimi.items() if not k.startswith("recompute:"))
    # flex at 4K: per TTT step q, k, v, out padded to 128 (bf16) + lse (fp32)
    t, h = 4096, 64
    flex = args.ttt * (4 * t * h * 128 * 2 + t * h * 4) / 2**30
    teacher_p = t * 32000 * 4 / 2**30
    return {
        "scale": s,
        "seq": args.seq,
        "options": args.options,
        "loss_sum": round(float(sum(x.detach() for x in out.losses)), 4),
        "saved_for_backward_gib_at_kimi_4k": kimi,
        "saved_total_gib": round(fwd_total, 2),
        "flex_saved_gib": round(flex, 2),
        "teacher_p_gib": round(teacher_p, 2),
        "note": "CPU eager under bf16 autocast; the GPU compiles pre/post (inductor may save less)",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--ttt", type=int, default=7)
    p.add_argument(
        "--options",
        nargs="*",
        default=[],
        help="TTTStep flags to set (checkpoint_steps, cast_weights_once, ...)",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile pre/post as on the GPU")
    args = p.parse_args(argv)
    import torch

    torch.manual_seed(0)
    print(json.dumps(breakdown(args), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
