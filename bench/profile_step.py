"""Where a 4K equal-work step's time goes: ours vs SpecForge 0.2.0, kernel by kernel (one H200).

Diagnostic for issue 17's last percent of equal-work throughput. Each side runs in a child
process of its own (bench_long_context's sides: long_context_trials.make_side, device_batch):
warm-up steps (compile), timed steps (median), then steps under torch.profiler. Per side it
prints and records: step time, GPU busy time per step (kernels and copies; wall minus busy is the
GPU idle while the host prepares work), the busy time by kernel class (GEMM, attention,
optimizer, Triton-fused, elementwise, reductions, copies) and the top kernels.

Variants beyond bench_long_context's sides (A/B of one change each, same process layout):
  ours_mid_widen        ours_mid with each TTT step's weight gradient widened to a new fp32
                        tensor and summed by autograd (the behaviour before memory.GradSum)
  ours_mid_eager_merge  ours_mid with the TTT merge eager (before merge._merge_fn)
  ours_mid_eager_add    ours_mid with GradSum's in-place add eager (before memory.add_into)

Run:  python3 bench/profile_step.py --sides ours_mid,ours_mid_eager_merge,specforge  (carry .whl)
Writes bench/results/profile-4k/profile.json (or --out). Recorded runs (one H200, 2026-12-02):
  2026-12-02a-gradsum.json          ours_mid 0.4134 s vs ours_mid_widen 0.4288 s, SpecForge 0.4125 s
  2026-12-02b-compiled-merge.json   ours_mid (merge compiled per step count, since folded into one
                                    stacked graph) 0.3767 s vs ours_mid_eager_merge 0.4021 s;
                                    ours_mid_compiled_add (the add as memory.add_into now does)
                                    0.3690 s; ours_lean did not start (a bench bug, fixed)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from machine_info import describe, portable, save_result  # noqa: E402

CLASSES = [  # first match wins
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("attention", r"flex|flash|attention|fmha|triton_tem"),
    ("gemm", r"gemm|cutlass|nvjet|cublas|sm90_|xmma|s16816|matmul"),
    ("triton_fused", r"^triton_"),
    ("reduction", r"reduce|norm|softmax|logsumexp|argmax|sum"),
    ("copy", r"memcpy|memset|copy|cat|index|gather|scatter"),
    ("elementwise", r"elementwise|vectorized|unrolled|kernel"),
]
VARIANTS = {
    "ours_mid_widen": "ours_mid",
    "ours_mid_eager_merge": "ours_mid",
    "ours_mid_eager_add": "ours_mid",
}


def classify(name: str) -> str:
    low = name.lower()
    for cls, pattern in CLASSES:
        if re.search(pattern, low):
            return cls
    return "other"


def widen_each_use() -> None:
    """The pre-GradSum behaviour: every use's gradient widened to a new fp32 tensor, summed by
    autograd out of place (GradSum then never counts, so no hand-over check fires)."""
    from remote_agent.eagle3.drafter.model import memory

    memory.GradSum.add = lambda self, grad, dtype: grad.to(dtype)  # type: ignore[method-assign]


def eager_merge() -> None:
    from remote_agent.eagle3.drafter.model import merge, ttt_attention

    ttt_attention._merge_fn = lambda compiled: merge.merge_diagonal  # type: ignore[assignment]


def eager_add() -> None:
    from remote_agent.eagle3.drafter.model import memory

    memory.add_into = lambda total, grad: total.add_(grad)  # type: ignore[assignment]


PATCHES = {
    "ours_mid_widen": widen_each_use,
    "ours_mid_eager_merge": eager_merge,
    "ours_mid_eager_add": eager_add,
}


def worker(args) -> dict:
    import bench_train
    import torch
    from long_context_trials import device_batch, make_side
    from torch.profiler import ProfilerActivity, profile

    side = VARIANTS.get(args.worker, args.worker)
    if args.worker in PATCHES:
        PATCHES[args.worker]()
    ns = argparse.Namespace(tiny=args.device == "cpu", ttt=7, wheel=args.wheel, device=args.device)
    one, config, ctx = make_side(side, ns, args.device)
    from remote_agent.eagle3.drafter.train.step import teacher_head

    b = device_batch(config, args.seq, args.device, teacher_head(ctx), ctx.draft_ids, seed=args.seq)
    bench_train.attach_embeds(b, ctx, args.device)  # the host embedding's rows (defaults)
    rec: dict = {"side": args.worker, "seq": args.seq}
    t = time.perf_counter()
    for i in range(args.warmup):
        one(b, i)
    bench_train.sync(args.device)
    rec["warmup_s"] = round(time.perf_counter() - t, 1)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(args.timed):
        t = time.perf_counter()
        one(b, args.warmup + i)
        bench_train.sync(args.device)
        times.append(time.perf_counter() - t)
    step_s = sorted(times)[len(times) // 2]
    rec.update(step_s=round(step_s, 4), tokens_per_s=round(args.seq / step_s, 1))
    if args.device == "cuda":
        rec["peak_mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    t = time.perf_counter()
    with profile(activities=acts) as prof:
        for i in range(args.profiled):
            one(b, args.warmup + args.timed + i)
        bench_train.sync(args.device)
    rec["profiled_wall_ms_per_step"] = round((time.perf_counter() - t) * 1e3 / args.profiled, 2)
    kernels: dict[str, float] = {}
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
        if us > 0 and getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type):
            kernels[e.key] = kernels.get(e.key, 0.0) + us / 1e3 / args.profiled
    by_class: dict[str, float] = {}
    for name, ms in kernels.items():
        by_class[classify(name)] = by_class.get(classify(name), 0.0) + ms
    busy = sum(kernels.values())
    rec.update(
        gpu_busy_ms_per_step=round(busy, 2),
        gpu_idle_ms_per_step=round(rec["profiled_wall_ms_per_step"] - busy, 2),
        by_class_ms={k: round(v, 2) for k, v in sorted(by_class.items(), key=lambda x: -x[1])},
        top_kernels=[
            {"ms": round(ms, 3), "class": classify(n), "name": n[:160]}
            for n, ms in sorted(kernels.items(), key=lambda x: -x[1])[: args.top]
        ],
    )
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sides", default="ours_mid,ours_mid_eager_merge,ours_mid_eager_add,specforge")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timed", type=int, default=5)
    p.add_argument("--profiled", type=int, default=2)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--device", default="cuda")
    p.add_argument("--wheel", default=str(REPO / ".whl/specforge-0.2.0-py3-none-any.whl"))
    p.add_argument("--child-timeout-s", type=float, default=240)
    p.add_argument("--out", default=str(REPO / "bench/results/profile-4k/profile.json"))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--record", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        Path(args.record).write_text(json.dumps(worker(args)))
        return 0
    out: dict = {"bench": "profile-step", "machine": describe(device=args.device), "sides": {}}
    work = Path(tempfile.mkdtemp(prefix="profile-step-"))
    for side in args.sides.split(","):
        rec_path = work / f"{side}.json"
        cmd = [sys.executable, __file__, "--worker", side, "--record", str(rec_path)]
        for key in ("seq", "warmup", "timed", "profiled", "top", "device", "wheel"):
            cmd += [f"--{key}", str(getattr(args, key))]
        t = time.time()
        try:
            proc = subprocess.run(
                cmd, cwd=REPO, capture_output=True, text=True, timeout=args.child_timeout_s
            )
            rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-1500:]
        except subprocess.TimeoutExpired as exc:
            rc, tail = "timeout", str(exc.stderr or "")[-1500:]
        rec = json.loads(rec_path.read_text()) if rec_path.exists() else {"rc": rc, "tail": tail}
        rec["child_s"] = round(time.time() - t, 1)
        out["sides"][side] = rec
        print(json.dumps(portable({side: rec}), indent=1), flush=True)
    save_result(Path(args.out), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
