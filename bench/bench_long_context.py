"""Bench: long-context drafter training on one H200, ours vs SpecForge 0.2.0 in the same run.

Issue 17. The Kimi-K2.5-shaped drafter of bench_train / bench_specforge (Llama drafter, hidden
7168, 64 heads x 112, MLP 18,432, target vocab 163,840 -> draft vocab 32,000, 3 aux layers,
TTT 7), synthetic hidden states made on the GPU (one document, every position supervised, every
teacher argmax drafted), each trainer's full step (teacher, TTT unroll, loss, backward, clip,
optimizer). Each part runs in child processes, so compile caches and peak-memory counters do
not mix. Parts (run in the order equal, max_seq, accept; a time budget, `--budget-s`, bounds the whole
run and keeps `--accept-reserve-s` for the last part; a worker past its share is killed and its
finished trials kept; `--part` runs some parts and updates an existing result file):

  equal_work_4k       one 4,096-token sequence: tokens/s and peak memory of ours (defaults),
                      ours_lean (checkpoint_ttt_steps + loss_recompute) and SpecForge.
  accept_by_position  a tiny target (trained `--target-steps`), its greedy answers to short
                      prompts (32-200 tokens) and to long ones (1K-3.8K tokens); two drafters,
                      one trained on the short samples only (the long source dropped), one on
                      both (data.long_samples: alone); acceptance length by context-position
                      bucket (remote_agent/eagle3/drafter/position_accept.py) on held-out
                      prompts of every length.
  max_seq             per side a ladder of sequence lengths in one process (ours: lean options;
                      SpecForge: its recipe) until the first failure, then `--bisect` fresh-process
                      trials between the last success and the first failure; each failure
                      records its error and the frame of the repository (or SpecForge) code
                      where it happened.
  throughput_16k/32k  from our ladder (lean options): tokens/s and MFU.

FLOP model (bench_train.model_flops, matmuls only): per TTT step and token 2 x (projections +
3 H I + H Vd), attention 2 nh (d_qk + d_v) x visible keys, fc once, teacher 2 H V once;
x3 for forward + backward of the TTT matmuls and attention, x2 fc, x1 teacher. MFU = model
FLOPs / step time / 790 TFLOP/s (H200 bf16 dense); recomputation (checkpointing) is not counted.

SpecForge: its wheel on sys.path, nothing installed (bench_specforge.py). Stage it with
`bench/stage_long_context.sh` (git-ignored .whl/) and carry `.whl`.

Run:  bash bench/stage_long_context.sh                 (here, with PyPI: the SpecForge wheel)
      python3 bench/bench_long_context.py              (one H200, one call, <= 470 s + exit;
                                                        carry .whl; parts cut by the budget
                                                        are recorded as such)
      for the whole bisection, two calls into the same file:
      python3 bench/bench_long_context.py --part equal --part accept --budget-s 480
      python3 bench/bench_long_context.py --part maxseq --budget-s 540
      python3 bench/bench_long_context.py --tiny       (CPU rehearsal, tiny shapes, minutes)
Writes bench/results/long-context.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from machine_info import describe, save_result  # noqa: E402

H200_PEAK = 790e12
K = 1024
# doubling ladders (bisection refines between the last success and the first failure)
OURS_LADDER = [16 * K, 32 * K, 64 * K, 128 * K, 256 * K]
SF_LADDER = [16 * K, 32 * K, 64 * K, 128 * K]
TINY_OURS_LADDER = [512, 1024, 2048]
TINY_SF_LADDER = [256, 512, 1024]


# -- shapes and batches ----------------------------------------------------------------------


def shape_args(args) -> argparse.Namespace:
    """bench_train.build's arguments: the Kimi shape (tiny preset with --tiny)."""
    import bench_train

    dims = dict(bench_train.TINY if args.tiny else bench_train.KIMI)
    return argparse.Namespace(
        arch="llama",
        ttt=args.ttt,
        attention="auto",
        no_compile=args.tiny,
        **dims,
    )


def device_batch(config, seq: int, device, lm_head, draft_ids, seed: int = 0):
    """One document of `seq` tokens, all supervised, made on the device (a 256K batch on the
    host would take minutes): aux of residual-stream size, final states whose target argmax is
    a drafted token (bench_train.teacher_states, on the device)."""
    import torch

    from remote_agent.eagle3.drafter.data import Batch

    g = torch.Generator(device=device).manual_seed(seed)
    h = config["hidden_size"]
    aux = (torch.randn(1, seq, 3 * h, generator=g, device=device) * 2.0).to(torch.bfloat16)
    pick = torch.randint(0, draft_ids.numel(), (seq,), generator=g, device=device)
    rows = lm_head.index_select(0, draft_ids[pick]).float()
    final = 0.5 * rows + 0.1 * torch.randn(rows.shape, generator=g, device=device)
    ids = torch.randint(0, config["vocab_size"], (1, seq), generator=g, device=device)
    pos = torch.arange(seq, device=device)[None]
    return Batch(
        ids,
        aux,
        final.to(torch.bfloat16)[None],
        torch.ones(1, seq, dtype=torch.bool, device=device),
        torch.zeros(1, seq, dtype=torch.int32, device=device),
        pos,
        seq,
        [],
    )


def where_failed(exc: BaseException) -> str:
    """The innermost frame in this repository or SpecForge: where a trial failed."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if str(REPO) in f.filename or "specforge" in f.filename]
    f = (mine or frames)[-1]
    return f"{Path(f.filename).name}:{f.lineno} {f.name}"


# -- the ladder worker: one side, several lengths in one process ----------------------------


def make_side(side: str, args, device: str):
    """(one_step(batch, i), config, ctx) for 'ours', 'ours_lean' or 'specforge'."""
    import bench_train
    import torch

    ns = shape_args(args)
    lean = side == "ours_lean"
    if lean:
        ns.no_compile = True  # compiled below as the trainer does under checkpointing
    drafter, ctx, params, opt, config, _backend = bench_train.build(ns, device)
    if side.startswith("ours"):
        from remote_agent.eagle3.drafter.train import compile_layer, forward_backward

        ctx.model.checkpoint_steps = ctx.model.loss_recompute = lean
        if lean and device == "cuda":
            compile_layer(drafter, checkpointed=True)

        def one(b, i):
            forward_backward(ctx, b, i)
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
            opt.zero_grad(set_to_none=True)

        return one, config, ctx
    from bench_specforge import SFStep, add_wheel, cpu_stubs, sf_draft_like

    add_wheel(Path(args.wheel))
    if device == "cpu":
        cpu_stubs()
    attention = "flex_attention" if device != "cpu" else "sdpa"
    draft = sf_draft_like(drafter, config, device, attention)
    lm_head, draft_ids = ctx.lm_head, ctx.draft_ids
    drafter = params = opt = None  # free our trainer before building SpecForge
    ctx.model = None
    if device == "cuda":
        torch.cuda.empty_cache()
    step = SFStep(draft, lm_head, args.ttt, attention, 1e-4, 1000, device)
    ctx.lm_head, ctx.draft_ids = lm_head, draft_ids

    def one(b, i):
        step(b.input_ids, b.aux, b.final, b.loss_mask.long())

    return one, config, ctx


def worker_ladder(args) -> dict:
    """Lengths in increasing order until the first failure; tokens/s, peak memory, MFU each."""
    import bench_train
    import torch

    device = args.device
    one, config, ctx = make_side(args.side, args, device)
    trials = []
    deadline = time.time() + args.worker_budget_s
    for i, seq in enumerate(args.seqs):
        if time.time() > deadline:
            trials.append({"seq": seq, "skipped": "time budget"})
            break
        rec: dict = {"seq": seq}
        t0 = time.perf_counter()
        try:
            b = device_batch(config, seq, device, ctx.lm_head, ctx.draft_ids, seed=i)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            for w in range(args.warmup):
                one(b, w)
            bench_train.sync(device)
            rec["warmup_s"] = round(time.perf_counter() - t0, 1)
            timed = args.timed if seq <= args.timed_max_seq else 0  # longer: does it train at all
            if device == "cuda":
                rec["peak_mem_gb_warmup"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
                if timed:
                    torch.cuda.reset_peak_memory_stats()
            times = []
            for s in range(timed):
                t = time.perf_counter()
                one(b, args.warmup + s)
                bench_train.sync(device)
                times.append(time.perf_counter() - t)
            rec["ok"] = True
            if times:
                step_s = sorted(times)[len(times) // 2]
                flops = bench_train.model_flops(config, [seq], args.ttt)["train_total"]
                rec.update(
                    step_s=round(step_s, 4),
                    tokens_per_s=round(seq / step_s, 1),
                    model_tflops_per_s=round(flops / step_s / 1e12, 2),
                    mfu=round(flops / step_s / H200_PEAK, 4),
                )
            if device == "cuda":
                rec["peak_mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        except Exception as exc:  # OOM or any other failure: where and why, then stop
            msg = str(exc).strip().splitlines()
            rec.update(
                ok=False,
                error=f"{type(exc).__name__}: {msg[0][:300] if msg else ''}",
                where=where_failed(exc),
                seconds=round(time.perf_counter() - t0, 1),
            )
            trials.append(rec)
            _write_partial(args, {"side": args.side, "trials": trials, "partial": True})
            break
        finally:
            b = None
            if device == "cuda":
                torch.cuda.empty_cache()
        trials.append(rec)
        _write_partial(args, {"side": args.side, "trials": trials, "partial": True})
    return {"side": args.side, "trials": trials}


def _write_partial(args, res: dict) -> None:
    """After every trial: a worker killed by the time budget still leaves what it measured."""
    out = Path(args.work) / f"{args.worker}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1, default=str))
    os.replace(tmp, out)


# -- acceptance by context position ----------------------------------------------------------


def combine(parts: list[dict], out: Path) -> dict:
    """One dataset + dump holding the samples of several build_inputs outputs."""
    from remote_agent.eagle3.data.records import DatasetIndex
    from remote_agent.eagle3.dense import DumpReader, ShardWriter

    out.mkdir(parents=True, exist_ok=True)
    data = out / "data.jsonl"
    data.write_text("".join(Path(p["data"]).read_text() for p in parts))
    DatasetIndex.open(data)
    readers = [DumpReader(Path(p["dump"])) for p in parts]
    with ShardWriter(out / "dump", readers[0].meta, shard_bytes=32 << 20) as w:
        for r in readers:
            for sid in sorted(r.ids()):
                got = r.get(sid)
                w.add(sid, got["input_ids"], got["aux"], got["final"])
    return {"data": str(data), "dump": str(out / "dump")}


def spread(n: int, lo: int, hi: int, seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randint(lo, hi) for _ in range(n)]


def tiny_target(args, work: Path) -> tuple[Path, dict]:
    from remote_agent.eagle3.tiny import ensure_tiny

    if args.tiny or args.target_steps == 0:
        return ensure_tiny("ci" if args.tiny else "gpu"), {"trained_steps": 0}
    build = work / "target"
    cmd = [
        sys.executable, "-m", "remote_agent.eagle3", "build-tiny", "--out", str(build),
        "--preset", "gpu", "--device", args.device, "--per-source", "300",
        "--train-steps", str(args.target_steps), "--batch", "16", "--seq-len", "1024",
    ]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, env=_env(), check=True, capture_output=True)
    return build / "model", {
        "trained_steps": args.target_steps,
        "seq_len": 1024,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def worker_accept(args) -> dict:
    import torch

    from remote_agent.eagle3.drafter import checkpoint as ckpt
    from remote_agent.eagle3.drafter import config as config_mod
    from remote_agent.eagle3.drafter.data import Loader, Plan
    from remote_agent.eagle3.drafter.loss import load_target_tensor
    from remote_agent.eagle3.drafter.model import Eagle3Drafter
    from remote_agent.eagle3.drafter.position_accept import PositionAccept, batch_chains
    from remote_agent.eagle3.drafter.synthetic import build_inputs
    from remote_agent.eagle3.drafter.train import train

    work, device = Path(args.work) / "accept", args.device
    work.mkdir(parents=True, exist_ok=True)
    target, target_info = tiny_target(args, work)
    if args.tiny:
        n_s, short, n_l, long, n_e, new, budget, vocab, ttt = (
            24,
            (16, 48),
            6,
            (256, 900),
            8,
            16,
            256,
            256,
            3,
        )
    else:
        n_s, short, n_l, long, n_e, new, budget, vocab, ttt = (
            160,
            (32, 200),
            32,
            (1024, 3800),
            24,
            96,
            2048,
            4096,
            7,
        )
    t0 = time.perf_counter()
    common = dict(new_tokens=new, draft_vocab=vocab, device=device)
    short_in = build_inputs(target, work / "short", n_s, spread(n_s, *short, 1), seed=1, **common)
    long_in = build_inputs(
        target, work / "long", n_l, spread(n_l, *long, 2), seed=2, gen_batch=8, **common
    )
    eval_in = build_inputs(
        target, work / "eval", n_e, spread(n_e, short[0], long[1], 3), seed=3, gen_batch=8, **common
    )
    both = combine([short_in, long_in], work / "both")
    data_s = round(time.perf_counter() - t0, 1)
    hidden = json.loads((target / "config.json").read_text())["hidden_size"]
    heads = 16 if hidden >= 512 else 4
    runs = {}
    for name, inputs in (("without_long", short_in), ("with_long", both)):
        cfg = {
            "target": {"path": str(target)},
            "data": {
                "dump": inputs["dump"],
                "dataset": inputs["data"],
                "vocab": short_in["vocab"],  # one draft vocabulary for both
                "max_tokens": budget,
                "long_samples": "alone",
            },
            "drafter": {"num_attention_heads": heads, "num_key_value_heads": heads},
            "train": {
                "out_dir": str(work / f"run-{name}"),
                "epochs": args.epochs,
                "lr": 1e-3,
                "ttt_steps": ttt,
                "log_every": 20,
                "save_every": 0,
                "device": device,
                "compile": False,
            },
        }
        t = time.perf_counter()
        res = train(config_mod.from_dict(cfg))
        runs[name] = {
            "steps": res["steps"],
            "loss": res["loss"],
            "seconds": round(time.perf_counter() - t, 1),
        }
        runs[name]["checkpoint"] = res["checkpoint"]
    lm_head = load_target_tensor(target, "lm_head.weight").float().to(device)
    embed = load_target_tensor(target, "model.embed_tokens.weight").float()
    eval_plan = Plan(Path(eval_in["dump"]), Path(eval_in["data"]), budget, long_samples="alone")
    report = {}
    depth = 3  # SGLang's chain: steps 3, draft tokens 4 (the trainer's sim_accept_len)
    for name, r in runs.items():
        state = ckpt.load(Path(r.pop("checkpoint")))
        drafter = Eagle3Drafter(state["model_config"])
        drafter.load_state_dict(state["model"], strict=False)
        drafter.set_vocab(state["vocab"]["d2t"], state["vocab"]["t2d"])
        with torch.no_grad():
            drafter.embed_tokens.weight.copy_(embed)
        drafter.to(device).eval()
        acc = PositionAccept(depth)
        for _, _, b in Loader(eval_plan, 0, 0, 0, 1, prefetch=2):
            acc.add(*batch_chains(drafter, b.to(device), lm_head, depth))
        report[name] = [
            {"bucket": x["bucket"], "accept_length": x["accept_length"], "chains": x["chains"]}
            for x in acc.report()
        ]
    return {
        "target": {"preset": "ci" if args.tiny else "gpu", **target_info},
        "data": {
            "short": {
                "samples": short_in["samples"],
                "tokens": short_in["tokens"],
                "prompt_tokens": short,
            },
            "long": {
                "samples": long_in["samples"],
                "tokens": long_in["tokens"],
                "prompt_tokens": long,
            },
            "eval": {"samples": eval_in["samples"], "tokens": eval_in["tokens"]},
            "answer_tokens": new,
            "seconds": data_s,
        },
        "train": {"epochs": args.epochs, "max_tokens": budget, "ttt": ttt, **runs},
        "chain_depth": depth,
        **report,
    }


# -- orchestration ----------------------------------------------------------------------------


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def run_worker(args, role: str, extra: list[str], timeout: float) -> dict:
    out = Path(args.work) / f"{role}.json"
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--worker", role, "--device", args.device,
        "--wheel", str(args.wheel), "--work", str(args.work), "--ttt", str(args.ttt),
        "--epochs", str(args.epochs), "--target-steps", str(args.target_steps), *extra,
    ]  # fmt: skip
    if args.tiny:
        cmd.append("--tiny")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=max(timeout, 30)
        )
    except subprocess.TimeoutExpired:
        killed = f"worker {role} killed after {timeout:.0f} s (time budget)"
        if out.exists():  # the trials it finished
            return {**json.loads(out.read_text()), "killed": killed}
        return {"error": killed}
    if proc.returncode or not out.exists():
        return {"error": (proc.stderr or "")[-3000:] or f"exit {proc.returncode}"}
    res = json.loads(out.read_text())
    res["worker_s"] = round(time.perf_counter() - t0, 1)
    return res


class Budget:
    """The run's wall clock; `reserve` seconds are kept for the acceptance part (run last)."""

    def __init__(self, seconds: float, reserve: float = 0) -> None:
        self.start = time.time()
        self.end = self.start + seconds
        self.reserve = reserve

    def left(self) -> float:
        return self.end - time.time() - self.reserve


def ladder(
    args, budget: Budget, side: str, seqs: list[int], timed: int, warmup: int, share: float,
    cap: float = 1e9,
):  # fmt: skip
    """A ladder worker with a share of the remaining time; killed (recorded) if it overruns."""
    allowed = min(budget.left() * share, cap)
    extra = [
        "--side", side, "--seqs", ",".join(map(str, seqs)), "--timed", str(timed),
        "--warmup", str(warmup), "--worker-budget-s", str(max(allowed - 45, 10)),
        "--timed-max-seq", str(1024 if args.tiny else 32 * K),
    ]  # fmt: skip
    return run_worker(args, f"ladder-{side}-{seqs[0]}", extra, allowed)


def max_seq(args, budget: Budget, side: str, seqs: list[int], share: float, timed: int) -> dict:
    """Ladder until the first failure, then bisection (fresh processes, bounded)."""
    lad = ladder(args, budget, side, seqs, timed, 1, share)
    trials = list(lad.get("trials", []))
    out = {"ladder": lad}
    ok = [t["seq"] for t in trials if t.get("ok")]
    bad = [t["seq"] for t in trials if t.get("ok") is False]
    lo, hi = (max(ok) if ok else 0), (min(bad) if bad else None)
    step = 4096 if not args.tiny else 128
    for _ in range(args.bisect):
        if hi is None or hi - lo <= step or budget.left() < 60:
            break
        mid = (lo + hi) // 2 // step * step
        r = ladder(args, budget, side, [mid], 0, 1, 0.5)
        t = (r.get("trials") or [{"seq": mid, "ok": False, "error": r.get("error", "?")[-300:]}])[0]
        trials.append(t)
        if t.get("ok"):
            lo = mid
        else:
            hi = mid
    out.update(
        max_ok=lo or None,
        first_fail=hi,
        failure=next((t for t in trials if t.get("ok") is False and t["seq"] == hi), None),
        bounded_by=None if hi is not None else "ladder top or time budget (no failure seen)",
        trials=sorted(trials, key=lambda t: t["seq"]),
    )
    return out


def summary_side(tr: dict) -> dict:
    t = (tr.get("trials") or [{}])[0]
    if not t.get("ok"):
        return {
            "error": t.get("error") or tr.get("error", "no result")[-500:],
            "where": t.get("where"),
        }
    return {
        "tokens_per_s": t.get("tokens_per_s"),
        "peak_mem_gb": t.get("peak_mem_gb"),
        "step_s": t.get("step_s"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="tiny shapes and lengths (CPU rehearsal)")
    p.add_argument("--budget-s", type=float, default=470, help="wall-clock budget of the run")
    p.add_argument(
        "--accept-reserve-s", type=float, default=150, help="of it, kept for the acceptance part"
    )
    p.add_argument("--part", action="append", choices=("equal", "accept", "maxseq"))
    p.add_argument("--wheel", type=Path, default=REPO / ".whl" / "specforge-0.2.0-py3-none-any.whl")
    p.add_argument("--ttt", type=int, default=7)
    p.add_argument("--epochs", type=int, default=2, help="acceptance part: drafter epochs")
    p.add_argument("--target-steps", type=int, default=120, help="acceptance part: tiny target")
    p.add_argument(
        "--bisect", type=int, default=2, help="bisection trials per side after the ladder"
    )
    p.add_argument("--work", type=Path)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "long-context.json")
    # worker-only
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--side", help=argparse.SUPPRESS)
    p.add_argument("--seqs", type=lambda s: [int(x) for x in s.split(",")], help=argparse.SUPPRESS)
    p.add_argument("--timed", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--worker-budget-s", type=float, default=600, help=argparse.SUPPRESS)
    p.add_argument("--timed-max-seq", type=int, default=32 * K, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.tiny:
        args.ttt = min(args.ttt, 3)
    if args.worker:
        if args.device == "cpu":
            torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        if args.device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
        res = worker_accept(args) if args.worker == "accept" else worker_ladder(args)
        (Path(args.work) / f"{args.worker}.json").write_text(json.dumps(res, indent=1, default=str))
        return 0

    parts = args.part or ["equal", "maxseq", "accept"]
    args.work = args.work or Path(tempfile.mkdtemp(prefix="bench-long-context-"))
    args.work.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s, args.accept_reserve_s if "accept" in parts else 0)
    import transformers

    sf_ok = Path(args.wheel).exists()
    report: dict = {
        "bench": "long-context",
        "machine": describe(device=args.device, transformers=transformers.__version__),
        "shape": "tiny (CPU rehearsal)"
        if args.tiny
        else "Kimi-K2.5 drafter: hidden 7168, 64x112 heads, MLP 18432, vocab 163840 -> 32000, TTT 7",
        "specforge_wheel": str(args.wheel)
        if sf_ok
        else f"missing: {args.wheel} (run bench/stage_long_context.sh)",
        "flop_model": "bench_train.model_flops (matmuls; x3 train for TTT steps + attention, x2 fc, x1 teacher); MFU vs 790 TFLOP/s",
        "budget_s": args.budget_s,
    }
    seq4 = 256 if args.tiny else 4096
    timed4 = 3
    if "equal" in parts:
        eq = {}
        for side in ("ours", "ours_lean") + (("specforge",) if sf_ok else ()):
            eq[side] = ladder(args, budget, side, [seq4], timed4, 2, 1.0, cap=150)
        report["equal_work_4k"] = {side: summary_side(tr) for side, tr in eq.items()}
        if not sf_ok:
            report["equal_work_4k"]["specforge"] = {"error": report["specforge_wheel"]}
        e = report["equal_work_4k"]
        for side in ("ours", "ours_lean"):
            a, b = e.get(side, {}), e.get("specforge", {})
            if a.get("tokens_per_s") and b.get("tokens_per_s"):
                e[f"{side}_vs_specforge"] = {
                    "throughput_ratio": round(a["tokens_per_s"] / b["tokens_per_s"], 3),
                    "memory_ratio": round(a["peak_mem_gb"] / b["peak_mem_gb"], 3)
                    if a.get("peak_mem_gb") and b.get("peak_mem_gb")
                    else None,
                }
        report["equal_work_4k"]["seq"] = seq4
    if "maxseq" in parts:
        ours_l = TINY_OURS_LADDER if args.tiny else OURS_LADDER
        sf_l = TINY_SF_LADDER if args.tiny else SF_LADDER
        ms = {"ours": max_seq(args, budget, "ours_lean", ours_l, 0.55, 2)}
        if sf_ok:
            ms["specforge"] = max_seq(args, budget, "specforge", sf_l, 0.9, 0)
        report["max_seq_detail"] = ms
        report["max_seq"] = {side: d["max_ok"] for side, d in ms.items()}
        if not sf_ok:
            report["max_seq"]["specforge"] = None
        if report["max_seq"].get("ours") and report["max_seq"].get("specforge"):
            report["max_seq"]["ratio"] = round(
                report["max_seq"]["ours"] / report["max_seq"]["specforge"], 2
            )
        by_seq = {t["seq"]: t for t in ms["ours"]["trials"]}
        for label, seq in (("throughput_16k", 16 * K), ("throughput_32k", 32 * K)):
            seq = seq if not args.tiny else {16 * K: 512, 32 * K: 1024}[seq]
            t = by_seq.get(seq, {})
            report[label] = (
                {
                    k: t.get(k)
                    for k in (
                        "seq",
                        "tokens_per_s",
                        "mfu",
                        "model_tflops_per_s",
                        "peak_mem_gb",
                        "step_s",
                    )
                }
                | {"options": "checkpoint_ttt_steps + loss_recompute"}
                if t.get("ok")
                else {"seq": seq, "error": t.get("error", "not reached")}
            )
    if "accept" in parts:
        budget.reserve = 0
        report["accept_by_position"] = run_worker(args, "accept", [], budget.left())
    report["elapsed_s"] = round(time.time() - budget.start, 1)
    if args.part and args.out.exists():  # a run of some parts updates the others' result
        old = json.loads(args.out.read_text())
        report = {**old, **report}
    save_result(args.out, report)
    print(json.dumps(report, indent=1, default=str)[:5000])
    print_summary(report)
    return 0


def print_summary(r: dict) -> None:
    e = r.get("equal_work_4k", {})
    sf = e.get("specforge", {})
    for side in ("ours", "ours_lean") if e else ():
        o = e.get(side, {})
        ratio = e.get(f"{side}_vs_specforge", {})
        print(
            f"long-context [4K equal work] {side}: {o.get('tokens_per_s')} tok/s, "
            f"{o.get('peak_mem_gb')} GB vs SpecForge {sf.get('tokens_per_s')} tok/s, "
            f"{sf.get('peak_mem_gb')} GB: throughput {ratio.get('throughput_ratio')}x, "
            f"memory {ratio.get('memory_ratio')}x"
        )
    if "max_seq" in r:
        m = r["max_seq"]
        print(
            f"long-context [max seq] ours {m.get('ours')} vs SpecForge {m.get('specforge')} tokens "
            f"(ratio {m.get('ratio')}; goal >= 65536 and >= 2x)"
        )
    for label in ("throughput_16k", "throughput_32k"):
        if label in r:
            t = r[label]
            print(f"long-context [{label}] {t.get('tokens_per_s')} tok/s, MFU {t.get('mfu')}")
    acc = r.get("accept_by_position", {})
    for name in ("without_long", "with_long"):
        if name in acc:
            cells = ", ".join(f"{x['bucket']}: {x['accept_length']}" for x in acc[name])
            print(f"long-context [accept by position] {name}: {cells}")
    if "error" in acc:
        print(f"long-context [accept by position] error: {acc['error'][-400:]}")


if __name__ == "__main__":
    sys.exit(main())
