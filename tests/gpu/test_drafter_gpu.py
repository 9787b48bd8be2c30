"""GPU checks of the EAGLE-3 drafter trainer (device only, never CI).

Stages (all by default; each is a separate process, as in production):

  kernels  TTT attention: compiled flex (document block mask, gradients through its log-sum-exp)
           against the memory-efficient torch kernel, values and gradients, fp32 and bf16;
           the model's TTT unroll against its inference chain.
  train    inputs from a tiny target (its own greedy answers to stdlib-snippet prompts, dumped
           through ShardWriter, vocab mapping), then `eagle3 train` on 1 GPU (run A), export
           with the SGLang contract check, and `eagle3 eval` trained vs untrained (held-out
           prompts, torch reference decoder, lossless check).
  resume   run B stopped halfway (checkpoint, exit) and resumed; losses compared with run A.
  ddp      `torchrun --nproc-per-node 2 eagle3 train` on 2 GPUs (skipped with fewer).

Stages share inputs and run A through `--work DIR` (built when missing), so they can be run in
separate calls of about 3 minutes each.

Run (pytest may be absent on the device):
    python3 tests/gpu/test_drafter_gpu.py --quick --stage kernels
    python3 tests/gpu/test_drafter_gpu.py --quick --stage train --work /tmp/dgpu
    python3 tests/gpu/test_drafter_gpu.py --quick --stage resume --work /tmp/dgpu
    python3 tests/gpu/test_drafter_gpu.py --quick --stage ddp --work /tmp/dgpu   # 2 GPUs
    python3 tests/gpu/test_drafter_gpu.py --device cpu            # tiny CPU rehearsal
    python3 tests/gpu/test_drafter_gpu.py --target DIR            # a trained tiny target
    pytest -m gpu tests/gpu/test_drafter_gpu.py
Writes bench/results/drafter-gpu-check.json (merged per stage). Needs torch, transformers,
safetensors, numpy only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
REPORT = REPO / "bench" / "results" / "drafter-gpu-check.json"

try:
    import pytest

    pytestmark = pytest.mark.gpu
except ImportError:
    pytest = None

SIZES = {
    # samples, prompt tokens, answer tokens, draft vocab, steps, max_tokens, eval prompts, eval tokens
    "cpu": dict(
        samples=48, prompt=32, answer=48, vocab=256, steps=48, max_tokens=384, ev_n=4, ev_t=24
    ),
    "quick": dict(
        samples=192, prompt=64, answer=96, vocab=4096, steps=80, max_tokens=4096, ev_n=8, ev_t=64
    ),
    "full": dict(
        samples=512,
        prompt=96,
        answer=192,
        vocab=4096,
        steps=300,
        max_tokens=4096,
        ev_n=16,
        ev_t=128,
    ),
}


def eagle3(
    *args: str, torchrun: int = 0, timeout: int = 900
) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable]
    if torchrun:
        cmd += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(torchrun)]
    cmd += ["-m", "remote_agent.eagle3", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args[:1])} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    return proc, time.perf_counter() - t0


def lines(proc, kind: str) -> list[dict]:
    prefix = "@@eagle3 "
    out = []
    for x in proc.stderr.splitlines():
        if x.startswith(prefix):
            rec = json.loads(x[len(prefix) :])
            if rec.get("kind") == kind:
                out.append(rec)
    return out


def machine() -> dict:
    import platform

    import torch

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


# -- stage: kernels --------------------------------------------------------------------------


def _attention_case(device, dtype, heads, kv, d, dv, backend, rows=False) -> dict:
    """Values and gradients of `backend` vs the dense fp32 formula on the same inputs (with
    `rows`: steps >= 1 on a subset of query positions, the trainer's idle-row skipping)."""
    import torch

    from remote_agent.eagle3.drafter.model.ttt_attention import TTTAttention, doc_ids_from_lengths

    g = torch.Generator(device=device).manual_seed(0)
    n, steps = 512, 4

    def r(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=dtype).requires_grad_()

    q = r(1, heads, n, d)
    k0, v0 = r(1, kv, n, d), r(1, kv, n, dv)
    ks = [r(1, kv, n, d) for _ in range(steps - 1)]
    vs = [r(1, kv, n, dv) for _ in range(steps - 1)]
    leaves = [q, k0, v0, *ks, *vs]
    doc = doc_ids_from_lengths([100, 200, 150], n, device=device).unsqueeze(0)
    keep = None
    if rows:  # answer-like spans of each document; the rest idle
        keep = torch.cat([torch.arange(30, 100), torch.arange(160, 300), torch.arange(390, 450)])
        keep = keep.to(device)
    up = torch.randn(1, heads, n if keep is None else keep.numel(), dv, generator=g, device=device)

    def run(kind, xs):
        qq, a, b, *rest = xs
        if keep is not None:
            qq, rest = qq[:, :, keep], [x[:, :, keep] for x in rest]
        att = TTTAttention(doc, d**-0.5, kind, rows=keep)
        o = att(qq, a, b, rest[: steps - 1], rest[steps - 1 :])
        grads = torch.autograd.grad((o.float() * up).sum(), xs)
        return o.detach().float(), [x.float() for x in grads]

    ref_leaves = [x.detach().float().requires_grad_() for x in leaves]
    o_ref, g_ref = run("dense", ref_leaves)
    o, grads = run(backend, leaves)
    err = float((o - o_ref).norm() / o_ref.norm())
    gerr = max(float((a - b).norm() / b.norm()) for a, b in zip(grads, g_ref, strict=True))
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    return {
        "backend": backend,
        "rows": None if keep is None else keep.numel(),
        "out_rel_err": err,
        "grad_rel_err": gerr,
        "ok": err < tol and gerr < tol,
    }


def _chain_case(device, arch) -> dict:
    """The model's TTT unroll (flex on CUDA) predicts what its inference chain drafts."""
    import torch

    from remote_agent.eagle3.drafter.model.model import Eagle3Drafter, build_config
    from remote_agent.eagle3.drafter.model.ttt_attention import TTTAttention, doc_ids_from_lengths
    from remote_agent.eagle3.drafter.train.config import DrafterSection

    torch.manual_seed(0)
    ds = DrafterSection(
        arch=arch,
        num_attention_heads=8,
        num_key_value_heads=2 if arch == "llama" else None,
        intermediate_size=512,
        q_lora_rank=64,
        kv_lora_rank=32,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
    )
    m = Eagle3Drafter(
        build_config(
            ds,
            target_hidden=256,
            vocab_size=1000,
            draft_vocab_size=1000,
            aux_layer_ids=[2, 4, 5],
            target_context=2048,
        )
    )
    m.init_weights(0.2, torch.Generator().manual_seed(1))
    m = m.to(device)
    steps, ctx = 4, 200
    aux = torch.randn(ctx, 768, device=device)
    ids = torch.randint(0, 1000, (ctx + 1,), device=device)
    drafts = m.draft_chain(aux, ids, steps)
    n = 256
    seq = torch.cat([ids, torch.tensor(drafts[:-1], device=device)])
    aux_p = torch.zeros(1, n, 768, device=device)
    aux_p[0, :ctx] = aux
    step_ids = []
    for k in range(steps):
        x = torch.zeros(1, n, dtype=torch.long, device=device)
        x[0, : seq.numel() - 1 - k] = seq[1 + k :]
        step_ids.append(x)
    doc = doc_ids_from_lengths([ctx + steps], n, device=device).unsqueeze(0)
    pos = torch.arange(n, device=device).unsqueeze(0)
    backend = "flex" if device == "cuda" else "chunked"
    with torch.no_grad():
        outs = m.ttt(
            aux_p, step_ids, pos, TTTAttention(doc, m.midlayer.self_attn.scale, backend), steps
        )
    pred = [int(m.draft_ids()[m.logits(o)[0, ctx - 1].argmax()]) for o in outs]
    return {"arch": arch, "backend": backend, "chain": drafts, "ttt": pred, "ok": pred == drafts}


def stage_kernels(device: str) -> dict:
    import torch

    backend = "flex" if device == "cuda" else "chunked"
    out = {
        # Kimi-like Llama GQA head width 112 in fp32; MLA widths 192/128 in bf16
        "fp32_gqa_d112": _attention_case(device, torch.float32, 8, 2, 112, 112, backend),
        "bf16_mla_d192_dv128": _attention_case(device, torch.bfloat16, 8, 8, 192, 128, backend),
        "fp32_gqa_d112_rows": _attention_case(device, torch.float32, 8, 2, 112, 112, backend, True),
        "bf16_mla_rows": _attention_case(device, torch.bfloat16, 8, 8, 192, 128, backend, True),
        "chain_llama": _chain_case(device, "llama"),
        "chain_mla": _chain_case(device, "mla"),
    }
    out["ok"] = all(v["ok"] for v in out.values())
    return out


# -- stage: train (1 rank) + resume + export + eval ------------------------------------------


def build_target(device: str, target: str | None) -> Path:
    if target:
        return Path(target)
    from remote_agent.eagle3.tiny.cache import ensure_tiny

    return ensure_tiny("gpu" if device == "cuda" else "ci")


def write_config(
    path: Path, inputs: dict, target: Path, device: str, size: dict, out: Path
) -> Path:
    import json as _json

    hidden = _json.loads((target / "config.json").read_text())
    hidden = (hidden.get("text_config") or hidden)["hidden_size"]
    heads = 16 if hidden >= 512 else 4
    cfg = {
        "target": {"path": str(target)},
        "data": {
            "dump": inputs["dump"],
            "dataset": inputs["data"],
            "vocab": inputs["vocab"],
            "max_tokens": size["max_tokens"],
            "holdout_fraction": 0.1,
        },
        "drafter": {"num_attention_heads": heads, "num_key_value_heads": heads // 4 or 1},
        "train": {
            "out_dir": str(out),
            "epochs": 1000,
            "max_steps": size["steps"],
            "lr": 3e-3 if device == "cpu" else 1e-3,
            "warmup_steps": 10,
            "log_every": 5 if device == "cuda" else 2,
            "save_every": 0,
            "device": device,
        },
    }
    path.write_text(json.dumps(cfg, indent=1))
    return path


def ensure_inputs(device: str, size: dict, work: Path, target: str | None) -> tuple[Path, dict]:
    """Tiny target + data/dump/vocab + train.json under `work` (reused when already there)."""
    import torch

    from remote_agent.eagle3.drafter.eval.synthetic import build_inputs

    cfg = work / "train.json"
    info = work / "inputs.json"
    if cfg.exists() and info.exists():
        return cfg, json.loads(info.read_text())
    tgt = build_target(device, target)
    t0 = time.perf_counter()
    inputs = build_inputs(
        tgt,
        work / "inputs",
        n_samples=size["samples"],
        prompt_tokens=size["prompt"],
        new_tokens=size["answer"],
        draft_vocab=size["vocab"],
        device=device,
        gen_batch=64 if device == "cuda" else 16,
    )
    dump_bytes = sum(p.stat().st_size for p in Path(inputs["dump"]).rglob("*.safetensors"))
    inputs.update(
        target=str(tgt),
        seconds=round(time.perf_counter() - t0, 1),
        dump_bytes_per_token=round(dump_bytes / inputs["tokens"], 1),
    )
    if device == "cuda":
        torch.cuda.empty_cache()
    write_config(cfg, inputs, tgt, device, size, work / "runA")
    info.write_text(json.dumps(inputs))
    return cfg, inputs


def train_run_a(cfg: Path, size: dict, work: Path) -> dict:
    """The uninterrupted 1-rank run (reused by the resume stage when already done)."""
    done = work / "runA.json"
    if done.exists():
        return json.loads(done.read_text())
    proc, secs = eagle3("train", "--config", str(cfg))
    ma = lines(proc, "metrics")
    steady = [m["tokens_per_s"] for m in ma[1:]] or [m["tokens_per_s"] for m in ma]
    run = {
        "seconds": round(secs, 1),
        "steps": size["steps"],
        "tokens_per_s_median": sorted(steady)[len(steady) // 2],
        "first": ma[0],
        "last": ma[-1],
        "peak_mem_gb": max((m.get("peak_mem_gb") or 0) for m in ma),
        "metrics": ma,
    }
    done.write_text(json.dumps(run))
    return run


def stage_train(device: str, size: dict, work: Path, target: str | None) -> dict:
    """1 GPU: train, export with the contract check, evaluate trained vs untrained."""
    cfg, inputs = ensure_inputs(device, size, work, target)
    run = train_run_a(cfg, size, work)
    rep: dict = {"inputs": inputs, "train_1rank": {k: v for k, v in run.items() if k != "metrics"}}
    export = work / "export"
    proc_e, _ = eagle3("export", str(work / "runA"), "--out", str(export), "--force")
    rep["export"] = lines(proc_e, "result")[0]
    ev_out = work / "eval.json"
    _, ev_secs = eagle3(
        "eval",
        "--target",
        inputs["target"],
        "--drafter",
        str(export),
        "--data",
        inputs["data"],
        "--split",
        "holdout",
        "--holdout-fraction",
        "0.1",
        "--num-prompts",
        str(size["ev_n"]),
        "--max-new-tokens",
        str(size["ev_t"]),
        "--compare-untrained",
        "--device",
        device,
        "--out",
        str(ev_out),
    )
    ev = json.loads(ev_out.read_text())
    keys = ("accept_length", "accepted_at_position", "lossless", "tokens_per_s")
    improved = ev["trained"]["accept_length"] > ev["untrained"]["accept_length"]
    rep["eval"] = {
        "seconds": round(ev_secs, 1),
        "trained": {k: ev["trained"][k] for k in keys},
        "untrained": {k: ev["untrained"][k] for k in keys},
        "simulated_at_end": run["last"]["sim_accept_len"],
        "improved": improved,
    }
    rep["ok"] = (
        ev["trained"]["lossless"]
        and ev["untrained"]["lossless"]
        and (improved or device == "cpu")  # the CPU rehearsal is too small to compare
    )
    return rep


def stage_resume(device: str, size: dict, work: Path, target: str | None) -> dict:
    """Run B stops halfway (checkpoint, exit) and resumes; its losses are compared with run A."""
    cfg, _ = ensure_inputs(device, size, work, target)
    ma = train_run_a(cfg, size, work)["metrics"]
    half = size["steps"] // 2
    half -= half % int(json.loads(cfg.read_text())["train"]["log_every"])  # a logged step
    out_b = ["--out", str(work / "runB")]
    shutil.rmtree(work / "runB", ignore_errors=True)
    eagle3("train", "--config", str(cfg), *out_b, "--stop-after-step", str(half))
    proc_b, secs = eagle3("train", "--config", str(cfg), *out_b)
    mb = lines(proc_b, "metrics")
    a_by, b_by = {m["step"]: m for m in ma}, {m["step"]: m for m in mb}
    common = sorted(set(a_by) & set(b_by))
    diffs = [abs(a_by[s]["loss"] - b_by[s]["loss"]) / abs(a_by[s]["loss"]) for s in common]
    return {
        "stopped_at": half,
        "resumed_seconds": round(secs, 1),
        "compared_steps": common,
        "exact": bool(common) and all(a_by[s]["loss"] == b_by[s]["loss"] for s in common),
        "max_rel_loss_diff": max(diffs) if diffs else None,
        # bit-for-bit on CPU; on CUDA, atomics in attention backward allow tiny differences
        "ok": bool(common) and max(diffs) < (1e-12 if device == "cpu" else 2e-2),
    }


# -- stage: ddp -------------------------------------------------------------------------------


def stage_ddp(device: str, size: dict, work: Path, target: str | None) -> dict:
    import torch

    if device == "cuda" and torch.cuda.device_count() < 2:
        return {"skipped": f"{torch.cuda.device_count()} GPU(s)"}
    cfg, _ = ensure_inputs(device, size, work, target)
    shutil.rmtree(work / "runC", ignore_errors=True)
    proc, secs = eagle3("train", "--config", str(cfg), "--out", str(work / "runC"), torchrun=2)
    m = lines(proc, "metrics")
    steady = [x["tokens_per_s"] for x in m[1:]] or [x["tokens_per_s"] for x in m]
    res = lines(proc, "result")
    return {
        "seconds": round(secs, 1),
        "world": res[0]["world"] if res else None,
        "tokens_per_s_median": sorted(steady)[len(steady) // 2],
        "first": m[0],
        "last": m[-1],
        "ok": bool(res) and res[0]["world"] == 2 and m[-1]["loss"] < m[0]["loss"],
    }


def run_checks(
    device: str,
    quick: bool,
    stages: list[str],
    target: str | None,
    steps: int | None,
    report_path: Path = REPORT,
    work: Path | None = None,
) -> dict:
    size = dict(SIZES["cpu" if device == "cpu" else ("quick" if quick else "full")])
    if steps:
        size["steps"] = steps
    keep = work is not None
    work = work or Path(tempfile.mkdtemp(prefix="drafter-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    report.update({"machine": machine(), "device": device, "size": size, "updated": time.time()})
    try:
        if "kernels" in stages:
            report["kernels"] = stage_kernels(device)
            print("kernels:", json.dumps(report["kernels"], indent=1), flush=True)
        if "train" in stages:
            report["train"] = stage_train(device, size, work, target)
            print("train:", json.dumps(report["train"], indent=1, default=str), flush=True)
        if "resume" in stages:
            report["resume"] = stage_resume(device, size, work, target)
            print("resume:", json.dumps(report["resume"], indent=1, default=str), flush=True)
        if "ddp" in stages:
            report["ddp"] = stage_ddp(device, size, work, target)
            print("ddp:", json.dumps(report["ddp"], indent=1, default=str), flush=True)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return report


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def test_kernels_on_gpu():
    report = run_checks(_device(), True, ["kernels"], None, None)
    assert report["kernels"]["ok"], report["kernels"]


def test_train_export_eval_and_resume_on_gpu():
    target = os.environ.get("EAGLE3_GPU_TARGET")
    report = run_checks(_device(), True, ["train", "resume"], target, None)
    assert report["train"]["ok"], report["train"]
    assert report["resume"]["ok"], report["resume"]


def test_two_ranks():
    report = run_checks(_device(), True, ["ddp"], os.environ.get("EAGLE3_GPU_TARGET"), None)
    if "skipped" in report["ddp"] and pytest is not None:
        pytest.skip(report["ddp"]["skipped"])
    assert report["ddp"]["ok"], report["ddp"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="GPU checks of the EAGLE-3 drafter trainer")
    parser.add_argument("--device", default=None, help="cuda (default when available) | cpu")
    parser.add_argument(
        "--quick", action="store_true", help="smaller data and fewer steps (~3 min)"
    )
    parser.add_argument("--stage", action="append", choices=("kernels", "train", "resume", "ddp"))
    parser.add_argument("--target", help="target model dir (default: tiny gpu preset, random)")
    parser.add_argument("--steps", type=int, help="override the training steps")
    parser.add_argument("--work", type=Path, help="keep the work directory here")
    parser.add_argument("--report", type=Path, default=REPORT)
    args = parser.parse_args(argv)
    stages = args.stage or ["kernels", "train", "resume", "ddp"]
    report = run_checks(
        args.device or _device(),
        args.quick,
        stages,
        args.target,
        args.steps,
        args.report,
        args.work,
    )
    ok = all(report[s].get("ok", True) for s in stages if isinstance(report.get(s), dict))
    for s in stages:
        r = report[s]
        if s == "train":
            ev = r["eval"]
            print(
                f"train: {r['train_1rank']['tokens_per_s_median']} tok/s 1 rank, peak "
                f"{r['train_1rank']['peak_mem_gb']} GB; accept length untrained "
                f"{ev['untrained']['accept_length']} -> trained {ev['trained']['accept_length']} "
                f"(simulated {ev['simulated_at_end']}); lossless {ev['trained']['lossless']}"
            )
        elif s == "resume":
            print(f"resume: exact={r['exact']} (max rel loss diff {r['max_rel_loss_diff']})")
        elif s == "ddp" and "tokens_per_s_median" in r:
            print(f"ddp: {r['tokens_per_s_median']} tok/s on 2 ranks")
    print("GPU drafter checks:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
