"""Bench (b): this trainer side by side with SpecForge 0.2.0's EAGLE-3 trainer, same inputs, same run.

SpecForge is not installed as a package: its PyPI wheel (`specforge==0.2.0`, pure Python, pins
torch 2.11 like the GPU machine) is put on `sys.path` as a zip. Only the EAGLE-3 pieces are
imported: `specforge.modeling.draft.llama3_eagle.LlamaForCausalLMEagle3` (draft model, flex
attention), `specforge.algorithms.eagle3.model.OnlineEagle3Model` (TTT loop, Triton
`LogSoftmaxLoss`), `specforge.optimizer.BF16Optimizer` (AdamW over fp32 masters, clip 0.5,
warmup + cosine); the offline teacher is SpecForge's `TargetHead` computation (shift by one,
then the target lm_head in bf16: `_prepare_eagle_target`), and the step loss is
`Eagle3TrainStrategy`'s `sum(0.8**i * ploss_i)`. Their own imports need torch, transformers,
safetensors, huggingface_hub (comes with transformers) and triton (comes with CUDA torch);
nothing is stubbed on the GPU. SpecForge code is never committed: fetch the wheel into the
git-ignored `.whl/` (`pip download --no-deps -d .whl specforge==0.2.0`) and carry it along.

Parts (each side runs in its own process, so compile caches, dynamo settings and peak-memory
counters do not mix):

  throughput   Kimi-K2.5-shaped drafter (bench_train's shape: hidden 7168, 64 heads, vocab
               163,840 -> 32,000, seq 4,096, TTT 7), identical synthetic hidden states, target
               lm_head, embedding and vocab mapping (every teacher argmax drafted): tokens/s,
               peak memory, ratio, on two workloads (`--workload`):
                 full  one 4,096-token sequence, every position supervised: equal work.
                 chat  conversations (bench_train.CHAT_LENGTHS, prompt share PROMPT_SHARE,
                       unsupervised), each trainer as its recipe runs them: ours (the
                       trainer's defaults) packs them into 4,096-token batches and skips idle
                       rows (also run without, to separate the two; --no-noskip leaves that
                       out); SpecForge takes one conversation per step (batch 1). In the same
                       child, `ours_equal_tokens`: ours packed into bins of the longest
                       conversation (SpecForge's largest step), memory at equal tokens.
                 tokens/s counts every token of the data, supervised or not.
  acceptance   the same tiny target (trained `--target-steps` first, so that its answers
               have structure to learn) and data (its own greedy answers, dumped through
               ShardWriter), both trainers for the same epochs and about the same steps
               (SpecForge: batch 1 as in its recipes; ours: a 256-token budget, about one
               sample per step), exported to the SGLang layout and measured with the same
               torch reference decoder on held-out prompts. With no acceptance at all the
               length is new_tokens / (new_tokens - 1): the prefill makes the first token.

CPU rehearsal (`--device cpu`): SpecForge's Triton loss cannot run on a CPU and flex attention
has no CPU backward, so the rehearsal swaps in a torch formula for `LogSoftmaxLoss` and
SpecForge's own `sdpa` attention backend; this is recorded in the result (`cpu_stubs`) and
never happens on CUDA.

Run:  python3 bench/bench_specforge.py [--quick] [--part throughput|acceptance] [--wheel W]
Writes bench/results/specforge.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from machine_info import describe, save_result  # noqa: E402

DEFAULT_WHEEL = REPO / ".whl" / "specforge-0.2.0-py3-none-any.whl"
SF_MODULES = [
    "specforge.modeling.draft.llama3_eagle",
    "specforge.algorithms.eagle3.model",
    "specforge.optimizer",
    "specforge.utils",
]


# -- SpecForge import ----------------------------------------------------------------------


def drafter_heads(target: Path) -> int:
    """Attention heads of the tiny drafters the accept benches train for `target`."""
    hidden = json.loads((target / "config.json").read_text())["hidden_size"]
    return 16 if hidden >= 512 else 4


def add_wheel(wheel: Path) -> None:
    if str(wheel) not in sys.path:
        sys.path.insert(0, str(wheel))


def import_sf(wheel: Path, device: str) -> list[str]:
    """The wheel on sys.path, the CPU stubs (CPU only) and SpecForge's EAGLE-3 modules imported,
    before any trainer is built, as SpecForge's own scripts import them (at the top).

    Why first: llama3_eagle.py keeps the ImportError of its optional flash_attn import in a
    module global (`_std_flash_attn_import_error`); its traceback holds the frames of whoever
    imported the module first, and through their f_back every caller's locals. Imported
    inside sf_draft_like (commit c805050, 2026-12-02), whose frame holds `drafter`, that kept
    our whole Kimi-shaped drafter (4.25 GiB fp32 trainables + 2.19 GiB bf16 embedding =
    6.43 GiB) alive on the GPU beside SpecForge's: the 41.54 GB of the SpecForge 4K trial in
    bench/results/long-context.json against 35.05 GB in specforge-full.json (2026-11-30: the
    import ran inside sf_draft, whose caller deleted the drafter). Found on CPU with gc:
    tests/eagle3/drafter/test_bench_long_context.py checks that no drafter of ours survives.
    """
    import importlib

    add_wheel(wheel)
    stubs = cpu_stubs() if device == "cpu" else []
    for name in SF_MODULES:
        importlib.import_module(name)
    return stubs


def cpu_stubs() -> list[str]:
    """CPU rehearsal only: SpecForge's Triton loss module is replaced by the same formula in torch
    (sys.modules entry for `specforge.core.loss`), so the rest of its code runs unchanged."""
    import importlib
    import types

    try:
        import triton  # noqa: F401

        return []
    except ImportError:
        pass
    importlib.import_module("specforge.core")
    stub = types.ModuleType("specforge.core.loss")
    stub.LogSoftmaxLoss = torch_log_softmax_loss()
    sys.modules["specforge.core.loss"] = stub
    return ["specforge.core.loss.LogSoftmaxLoss -> torch formula (no triton)", "attention sdpa"]


def torch_log_softmax_loss():
    import torch

    class LogSoftmaxLoss(torch.autograd.Function):  # SpecForge's formula, in torch
        @staticmethod
        def forward(ctx, logits, target, position_mask):
            with torch.enable_grad():
                x = logits.detach().float().requires_grad_()
                loss = -(position_mask * target * torch.log_softmax(x, -1)).sum(-1).mean()
                (g,) = torch.autograd.grad(loss, x)
            ctx.save_for_backward(g.to(logits.dtype))
            return loss.detach()

        @staticmethod
        def backward(ctx, grad):
            (g,) = ctx.saved_tensors
            return g * grad, None, None

    return LogSoftmaxLoss


def probe(wheel: Path, device: str) -> dict:
    """Which SpecForge modules import here, and why not (exact errors)."""
    import importlib

    out = {"wheel": str(wheel), "exists": wheel.exists(), "modules": {}}
    if not wheel.exists():
        out["error"] = (
            f"{wheel} missing: run `pip download --no-deps -d .whl specforge==0.2.0` on a machine "
            "with network and carry .whl/ to the GPU box"
        )
        return out
    out["sha256"] = hashlib.sha256(wheel.read_bytes()).hexdigest()
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    out["requires_dist"] = [
        ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Requires-Dist:")
    ]
    out["installed_with"] = "no dependencies installed: the wheel zip is put on sys.path"
    add_wheel(wheel)
    out["stubs"] = cpu_stubs() if device == "cpu" else []
    for name in SF_MODULES:
        try:
            importlib.import_module(name)
            out["modules"][name] = "ok"
        except Exception as exc:  # record exactly what failed
            out["modules"][name] = f"{type(exc).__name__}: {exc}"
    out["ok"] = all(v == "ok" for v in out["modules"].values())
    return out


def sf_draft_like(drafter, config: dict, device: str, attention: str):
    """SpecForge's draft for our drafter: same shapes, our (frozen) embedding and vocab maps."""
    import torch

    draft = sf_draft(config, device, attention)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(
            drafter.embed_tokens.weight.to(draft.embed_tokens.weight.dtype)
        )
        draft.freeze_embedding()
        draft.t2d.copy_(drafter.t2d)
        draft.d2t.copy_(drafter.d2t)
    return draft


def sf_draft(config: dict, device: str, attention: str):
    """SpecForge's draft model for our drafter config (same shapes), bf16 on `device`."""
    import torch
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"],
        num_hidden_layers=1,
        hidden_act="silu",
        rms_norm_eps=config["rms_norm_eps"],
        rope_theta=config["rope_theta"],
        max_position_embeddings=config["max_position_embeddings"],
        vocab_size=config["vocab_size"],
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    cfg.draft_vocab_size = config["draft_vocab_size"]
    cfg.target_hidden_size = config["target_hidden_size"]
    model = LlamaForCausalLMEagle3(cfg, attention_backend=attention)
    return model.to(device=device, dtype=torch.bfloat16 if device != "cpu" else torch.float32)


class SFStep:
    """One SpecForge training step (offline teacher from the stored final hidden state)."""

    def __init__(
        self, draft, lm_head, ttt: int, attention: str, lr: float, total_steps: int, device: str
    ):
        from specforge.algorithms.eagle3.model import OnlineEagle3Model
        from specforge.optimizer import BF16Optimizer

        self.draft, self.lm_head, self.ttt = draft, lm_head, ttt
        self.model = OnlineEagle3Model(draft, length=ttt, attention_backend=attention)
        self.opt = BF16Optimizer(
            self.model, lr=lr, max_grad_norm=0.5, total_steps=total_steps, warmup_ratio=0.015
        )

    def __call__(self, input_ids, aux, final, loss_mask):
        import torch
        from specforge.utils import padding

        # TargetHead.preprocess + forward (SpecForge's offline path, `_prepare_eagle_target`)
        target = padding(final, left=False)
        ids = padding(input_ids, left=False)
        mask = loss_mask[..., None]
        with torch.no_grad():
            logits = target.to(self.lm_head.dtype) @ self.lm_head.T
        plosses, _, acces, *_ = self.model(
            input_ids=ids,
            attention_mask=torch.ones_like(input_ids),
            loss_mask=mask,
            target=logits,
            hidden_states=aux.to(self.draft.fc.weight.dtype),
        )
        loss = sum(0.8**i * p for i, p in enumerate(plosses))  # Eagle3TrainStrategy
        loss.backward()
        self.opt.step()
        return float(loss), [float(a) for a in acces]


# -- throughput worker ------------------------------------------------------------------------


def worker_throughput(side: str, args) -> dict:
    """One side on one workload: `full` = one 4,096-token sequence, every position supervised
    (equal work); `chat` = conversations with unsupervised prompts, each side as its recipe
    runs them (ours: packed into 4,096-token batches; SpecForge: one conversation per step)."""
    import bench_train
    import torch

    device = args.device
    ns = argparse.Namespace(
        arch="llama",
        seq=None,
        docs=1,
        ttt=7,
        steps=None,
        attention="auto",
        no_compile=False,
        peak=None,
        quick=args.quick,
        device=device,
        **{k: getattr(args, k, None) for k in bench_train.KIMI},
    )
    stubs: list[str] = []
    if not side.startswith("ours"):  # before our trainer exists (see import_sf)
        stubs = import_sf(Path(args.wheel), device)
    # the trainer's defaults for ours; SpecForge's draft copies our device embedding and its
    # step gets the lm_head tensor
    ns.host_embed = side.startswith("ours")
    ns.host_head = side.startswith("ours") and device != "cpu"
    drafter, ctx, params, opt, config, backend = bench_train.build(ns, device)
    seq = 4096 if device != "cpu" else 256
    from remote_agent.eagle3.drafter.train.step import teacher_head

    teacher = (teacher_head(ctx), ctx.draft_ids)
    if args.workload == "full":
        batch, _ = bench_train.synthetic_batch(config, seq, 1, device, teacher=teacher)
        units = [bench_train.attach_embeds(batch, ctx, device)]
        docs = None
    else:
        tokens = seq * (3 if args.quick else 6)
        if device == "cpu":
            lengths = tuple(max(16, n // 16) for n in bench_train.CHAT_LENGTHS)
            docs = bench_train.chat_docs(config, teacher, tokens, lengths=lengths)
        else:
            docs = bench_train.chat_docs(config, teacher, tokens)
        ours = side.startswith("ours")
        units = bench_train.pack_docs(docs, seq, device, ctx) if ours else None
    if side.startswith("ours"):
        from remote_agent.eagle3.drafter.train.loop import forward_backward

        ctx.tc.skip_idle_rows = side != "ours-noskip"

        def one(b, i):
            out = forward_backward(ctx, b, i)
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return float(
                sum(
                    0.8**k * loss / c
                    for k, (loss, c) in enumerate(zip(out.losses, out.counts, strict=True))
                )
            )

    else:
        attention = "flex_attention" if device != "cpu" else "sdpa"
        draft = sf_draft_like(drafter, config, device, attention)
        lm_head = ctx.lm_head
        del drafter, ctx, params, opt
        if device == "cuda":
            torch.cuda.empty_cache()
        step = SFStep(draft, lm_head, 7, attention, 1e-4, 1000, device)

        def one(b, i):
            loss, _ = step(b.input_ids, b.aux, b.final, b.loss_mask.long())
            return loss

        if docs is not None:  # its recipe: batch size 1, one conversation per step
            from types import SimpleNamespace

            units = [
                SimpleNamespace(
                    input_ids=d["ids"][None].to(device),
                    aux=d["aux"][None].to(device),
                    final=d["final"][None].to(device),
                    loss_mask=d["mask"][None].to(device),
                    tokens=d["ids"].numel(),
                )
                for d in docs
            ]

    res = {"side": side, "workload": args.workload, **timed_passes(one, units, args, device)}
    res["seq"] = seq
    if side == "ours" and docs is not None:  # the same process (compile cache), same docs
        # equal tokens per step: bins of SpecForge's longest step (its longest conversation)
        eq_seq = max(d["ids"].numel() for d in docs)
        eq_units = bench_train.pack_docs(docs, eq_seq, device, ctx)
        units = None
        res["equal_tokens"] = {
            "side": "ours_equal_tokens", "workload": args.workload, "seq": eq_seq,
            **timed_passes(one, eq_units, args, device),
        }  # fmt: skip
    if docs is not None:
        supervised = sum(int(d["mask"].sum()) for d in docs)
        res["conversations"] = len(docs)
        res["supervised_fraction"] = round(supervised / sum(d["ids"].numel() for d in docs), 4)
    if side == "specforge":
        res["attention"] = attention
        res["cpu_stubs"] = stubs
    else:
        res["attention"] = backend
        res["skip_idle_rows"] = side != "ours-noskip"
    return res


def timed_passes(one, units, args, device) -> dict:
    """Warmup over every unit once (every shape the timed pass meets compiles), then timed
    passes (with the GPU to this worker alone under --side-by-side: gpu_gate); peak memory
    from the timed passes (counters reset after the warmup)."""
    import bench_train
    import gpu_gate
    import torch

    tokens_per_pass = sum(int(u.tokens) for u in units)
    t0 = time.perf_counter()
    warm_units = units if args.workload == "chat" else units * 2
    for i, u in enumerate(warm_units):
        one(u, i)
    bench_train.sync(device)
    warm = time.perf_counter() - t0
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    passes = 1 if args.workload == "chat" else (4 if args.quick else 10)
    times, losses = [], []
    gate: dict = {}
    with gpu_gate.exclusive(Path(args.work) if args.side_by_side else None, gate):
        for r in range(passes):
            t = time.perf_counter()
            for i, u in enumerate(units):
                losses.append(one(u, len(warm_units) + r * len(units) + i))
            bench_train.sync(device)
            times.append(time.perf_counter() - t)
    pass_s = sorted(times)[len(times) // 2]
    return {
        "steps_per_pass": len(units),
        "tokens_per_pass": tokens_per_pass,
        "warmup_s": round(warm, 1),
        "pass_s_median": round(pass_s, 4),
        "tokens_per_s": round(tokens_per_pass / pass_s, 1),
        "peak_mem_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if device == "cuda"
        else None,
        "losses": [round(x, 5) for x in losses[:12]],
        **gate,
    }


# -- acceptance workers ----------------------------------------------------------------------


def worker_sf_train(args) -> dict:
    """Train SpecForge's draft on the tiny target's dump for `--epochs`, export it for our eval."""
    import random

    import torch

    from remote_agent.eagle3.drafter.model.loss import load_target_tensor
    from remote_agent.eagle3.drafter.train.data import Plan, load_vocab

    add_wheel(Path(args.wheel))
    stubs = cpu_stubs() if args.device == "cpu" else []
    work = Path(args.work)
    ours_cfg = json.loads((work / "ours" / "model_config.json").read_text())
    device = args.device
    attention = "flex_attention" if device != "cpu" else "sdpa"
    target = Path(args.target)
    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    lm_head = load_target_tensor(target, "lm_head.weight", device, dtype)
    embed = load_target_tensor(target, "model.embed_tokens.weight", device, dtype)
    d2t, t2d, _ = load_vocab(work / "inputs" / "vocab.safetensors", lm_head.shape[0])
    plan = Plan(
        work / "inputs" / "dump",
        work / "inputs" / "data.jsonl",
        max_tokens=100_000,
        holdout_fraction=args.holdout,
    )
    draft = sf_draft(ours_cfg, device, attention)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(embed.to(draft.embed_tokens.weight.dtype))
        draft.freeze_embedding()
        draft.t2d.copy_(t2d)
        draft.d2t.copy_(d2t)
    steps = len(plan.samples) * args.epochs
    step = SFStep(draft, lm_head, args.ttt, attention, args.lr, steps, device)
    from remote_agent.eagle3.data.records import DatasetIndex
    from remote_agent.eagle3.dense import DumpReader

    reader, index = DumpReader(plan.dump_dir), DatasetIndex.open(plan.dataset)
    t0 = time.perf_counter()
    tokens, losses = 0, []
    for epoch in range(args.epochs):
        order = list(range(len(plan.samples)))
        random.Random(epoch).shuffle(order)
        for i in order:
            sid, n = plan.samples[i]
            got, rec = reader.get(sid), index.read(sid)
            ids = got["input_ids"].long()[None, :n].to(device)
            mask = torch.tensor(rec.loss_mask[:n])[None].to(device)
            mask[:, -1] = 0  # SpecForge offline: loss_mask[-1] = 0
            loss, _ = step(
                ids, got["aux"][None, :n].to(device), got["final"][None, :n].to(device), mask
            )
            losses.append(loss)
            tokens += n
    secs = time.perf_counter() - t0
    # SpecForge's names equal ours (fc, midlayer.*, norm, lm_head, d2t, t2d): export via our checker
    from remote_agent.eagle3.drafter.export.export import export_checkpoint
    from remote_agent.eagle3.drafter.train import checkpoint as ckpt

    state = {
        k: v.float().cpu() if v.is_floating_point() else v.cpu()
        for k, v in draft.state_dict().items()
    }
    state.pop("embed_tokens.weight")
    ck = ckpt.save(
        work / "sf-ckpt",
        steps,
        {
            "model": state,
            "vocab": {"d2t": d2t, "t2d": t2d},
            "model_config": ours_cfg,
            "capture_layer_ids": ours_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
            "global_step": steps,
        },
        {"step": steps},
    )
    export_checkpoint(ck, work / "sf-export", force=True)
    return {
        "steps": steps,
        "seconds": round(secs, 1),
        "tokens_per_s": round(tokens / secs, 1),
        "loss_first": losses[0],
        "loss_last": sum(losses[-20:]) / len(losses[-20:]),
        "attention": attention,
        "cpu_stubs": stubs,
    }


def run_acceptance(args) -> dict:
    """Tiny target -> data/dump/vocab -> both trainers (same epochs) -> our evaluator on both."""
    import torch

    from remote_agent.eagle3.drafter.eval.synthetic import build_inputs
    from remote_agent.eagle3.tiny.cache import ensure_tiny

    work = Path(args.work)
    device = args.device
    if args.target:
        target = Path(args.target)
    elif args.target_steps > 0:  # a tiny target with structure: its answers can be learned
        build = work / "target"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "remote_agent.eagle3",
                "build-tiny",
                "--out",
                str(build),
                "--preset",
                "gpu" if device == "cuda" else "ci",
                "--device",
                device,
                "--per-source",
                "300",
                "--train-steps",
                str(args.target_steps),
                "--batch",
                "16",
                "--seq-len",
                "512" if device == "cuda" else "128",
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            check=True,
            capture_output=True,
        )
        target = build / "model"
    else:
        target = ensure_tiny("gpu" if device == "cuda" else "ci")
    n, ans = (128, 96) if args.quick else (256, 128)
    if device == "cpu":
        n, ans = 32, 32
    vocab = 4096 if device == "cuda" else 256
    inputs = build_inputs(
        target, work / "inputs", n_samples=n, new_tokens=ans, draft_vocab=vocab, device=device
    )
    if device == "cuda":
        torch.cuda.empty_cache()
    heads = drafter_heads(target)
    cfg = {
        "target": {"path": str(target)},
        "data": {
            "dump": inputs["dump"],
            "dataset": inputs["data"],
            "vocab": inputs["vocab"],
            # about one sample per step, as SpecForge's batch 1: equal steps, equal epochs
            "max_tokens": args.acc_max_tokens,
            "holdout_fraction": args.holdout,
        },
        "drafter": {"num_attention_heads": heads, "num_key_value_heads": heads},
        "train": {
            "out_dir": str(work / "ours"),
            "epochs": args.epochs,
            "lr": args.lr,
            "ttt_steps": args.ttt,
            "log_every": 5,
            "save_every": 0,
            "device": device,
        },
    }
    (work / "train.json").write_text(json.dumps(cfg))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "remote_agent.eagle3",
            "train",
            "--config",
            str(work / "train.json"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    ours_s = time.perf_counter() - t0
    result_line = [
        json.loads(x[9:])
        for x in proc.stderr.splitlines()
        if x.startswith("@@eagle3 ") and '"result"' in x
    ]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "remote_agent.eagle3",
            "export",
            str(work / "ours"),
            "--out",
            str(work / "ours-export"),
            "--force",
        ],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
    )
    sf = run_worker(args, "sf-train", ["--target", str(target)])
    report = {
        # scratch paths (the work dir) name nothing a reader can open: say what was built
        "target": args.target or f"tiny {'gpu' if device == 'cuda' else 'ci'} preset",
        "samples": inputs["samples"],
        "tokens": inputs["tokens"],
        "epochs": args.epochs,
        "target_train_steps": 0 if args.target else args.target_steps,
        "ours_max_tokens": args.acc_max_tokens,
        "ours_train": {
            "seconds": round(ours_s, 1),
            **{k: v for k, v in result_line[-1].items() if k not in ("checkpoint", "out_dir")},
        },
        "specforge_train": sf,
    }
    if "error" in sf:
        return report
    from remote_agent.eagle3.drafter.eval.evaluate import run_eval

    n_ev, t_ev = (8, 64) if device == "cuda" else (3, 24)
    for name, export in (("ours", work / "ours-export"), ("specforge", work / "sf-export")):
        ev = run_eval(
            target,
            export,
            Path(inputs["data"]),
            n_ev,
            t_ev,
            device=device,
            split="holdout",
            holdout_fraction=args.holdout,
            compare_untrained=(name == "ours"),
        )
        report[f"eval_{name}"] = {
            k: ev["trained"][k] for k in ("accept_length", "accepted_at_position", "lossless")
        }
        if "untrained" in ev:
            report["eval_untrained"] = {"accept_length": ev["untrained"]["accept_length"]}
    return report


# -- orchestration ----------------------------------------------------------------------------


def throughput_summary(tp: dict, workload: str) -> dict:
    """The sides' records (ours, specforge, ...) with ours_equal_tokens split out and the
    ratios of ours and of ours_equal_tokens to SpecForge (tokens/s, peak memory)."""
    ours = tp.get("ours", {})
    if "equal_tokens" in ours:  # measured in the same child (chat)
        tp["ours_equal_tokens"] = ours.pop("equal_tokens")
    tp["ours_options"] = "the trainer's defaults (eagle3 train with no options)"
    sf = tp.get("specforge", {})
    for name, key in (("ours", ""), ("ours_equal_tokens", "_equal_tokens")):
        side = tp.get(name, {})
        if "tokens_per_s" in side and "tokens_per_s" in sf:
            tp[f"throughput_ratio{key}"] = round(side["tokens_per_s"] / sf["tokens_per_s"], 3)
            if side.get("peak_mem_gb") and sf.get("peak_mem_gb"):
                tp[f"memory_ratio{key}"] = round(side["peak_mem_gb"] / sf["peak_mem_gb"], 3)
    tp["goal_ratio"] = 1.7 if workload == "chat" else 1.2
    return tp


def assemble(work: Path, out: Path, workload: str, device: str) -> int:
    """The result file from the workers' own records in `work` (throughput-<side>.json, the
    probe's if it ran): for a parent cut by a time limit after its workers wrote them."""
    import transformers

    tp = {}
    for path in sorted(work.glob("throughput-*.json")):
        tp[path.stem.removeprefix("throughput-")] = json.loads(path.read_text())
    if not tp:
        print(f"bench_specforge --assemble: no worker record in {work}", file=sys.stderr)
        return 1
    probe_path = work / "probe.json"
    report = {
        "bench": "specforge",
        "machine": describe(device=device, transformers=transformers.__version__),
        "probe": json.loads(probe_path.read_text()) if probe_path.exists() else None,
        "throughput": {workload: throughput_summary(tp, workload)},
        "assembled": f"from the workers' own records ({work.name}/throughput-*.json): the "
        "parent was cut by its time limit before it wrote this file; the same formula",
    }
    save_result(out, report)
    print_summary(report)
    return 0


def run_worker(args, role: str, extra: list[str] | None = None) -> dict:
    out = Path(args.work) / f"{role}.json"
    cmd = worker_cmd(args, role, extra)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode or not out.exists():
        return {"error": proc.stderr[-4000:] or f"exit {proc.returncode}"}
    return json.loads(out.read_text())


def worker_cmd(args, role: str, extra: list[str] | None = None) -> list[str]:
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--worker", role, "--device", args.device,
        "--wheel", str(args.wheel), "--work", str(args.work), "--epochs", str(args.epochs),
        "--lr", str(args.lr), "--ttt", str(args.ttt), "--holdout", str(args.holdout),
        *(extra or []),
    ]  # fmt: skip
    if args.quick:
        cmd.append("--quick")
    if args.side_by_side:
        cmd.append("--side-by-side")
    for key in ("heads", "kv_heads", "inter"):
        if getattr(args, key, None):
            cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    return cmd


def run_side_by_side(args, roles: dict[str, str], extra: list[str]) -> dict[str, dict]:
    """The workers at once, each its own process group listed for gpu_gate: they start, build
    and compile together, and each times its passes with every other one paused (SIGSTOP), so
    no kernel of another overlaps a timed pass. Every group is continued when one ends."""
    import signal

    import gpu_gate

    work = Path(args.work)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = {}
    for name, role in roles.items():
        log = open(work / f"{role}.log", "w")  # noqa: SIM115 (closed when it ends)
        procs[name] = (subprocess.Popen(
            worker_cmd(args, role, extra), cwd=REPO, env=env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        ), log, role)  # fmt: skip
    gpu_gate.register(work, [p.pid for p, _, _ in procs.values()])
    out: dict[str, dict] = {}
    while len(out) < len(procs):
        for name, (proc, log, role) in procs.items():
            if name in out or proc.poll() is None:
                continue
            log.close()
            live = [p.pid for n, (p, _, _) in procs.items() if n not in out and n != name]
            gpu_gate.register(work, [p for p in live if p != proc.pid])
            gpu_gate.signal_groups(live, signal.SIGCONT)
            path = work / f"{role}.json"
            out[name] = (
                json.loads(path.read_text())
                if proc.returncode == 0 and path.exists()
                else {"error": (work / f"{role}.log").read_text()[-4000:]}
            )
        time.sleep(0.2)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--part", action="append", choices=("throughput", "acceptance"))
    p.add_argument("--wheel", type=Path, default=DEFAULT_WHEEL)
    p.add_argument("--target", help="tiny target for the acceptance part (default: tiny preset)")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument(
        "--target-steps",
        type=int,
        help="train the tiny target this many steps first (default 400 on CUDA, 0 on CPU)",
    )
    p.add_argument(
        "--acc-max-tokens",
        type=int,
        default=256,
        help="our token budget in the acceptance part (256: about one sample per step)",
    )
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ttt", type=int, default=7)
    p.add_argument("--holdout", type=float, default=0.1)
    p.add_argument(
        "--workload",
        action="append",
        choices=("full", "chat"),
        help="throughput workloads (default both): full = one 4K sequence all supervised; "
        "chat = conversations with prompts, each trainer as its recipe runs them",
    )
    p.add_argument(
        "--no-noskip", action="store_true", help="chat: leave out ours without idle-row skipping"
    )
    p.add_argument(
        "--side-by-side", action="store_true",
        help="throughput: the sides' workers at once, each timing with the others paused",
    )  # fmt: skip
    p.add_argument("--work", type=Path)
    for key in ("heads", "kv_heads", "inter"):  # throughput shape overrides (default Kimi)
        p.add_argument(f"--{key.replace('_', '-')}", dest=key, type=int)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "specforge.json")
    p.add_argument(
        "--assemble", action="store_true",
        help="write --out from the workers' records already in --work (a parent cut by a limit)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.assemble:
        if args.work is None:
            p.error("--assemble needs --work")
        return assemble(args.work, args.out, (args.workload or ["chat"])[0], args.device or "cuda")
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.target_steps is None:
        args.target_steps = 400 if args.device == "cuda" else 0
    if args.worker:  # a child process: one side, result as JSON in the work dir
        if args.worker == "probe":
            res = probe(Path(args.wheel), args.device)
        elif args.worker.startswith("throughput-"):
            args.workload = args.workload[0]
            res = worker_throughput(args.worker.split("-", 1)[1], args)
        elif args.worker == "sf-train":
            res = worker_sf_train(args)
        else:
            raise SystemExit(f"unknown worker {args.worker}")
        (Path(args.work) / f"{args.worker}.json").write_text(json.dumps(res, indent=1, default=str))
        return 0

    parts = args.part or ["throughput", "acceptance"]
    args.work = args.work or Path(tempfile.mkdtemp(prefix="bench-specforge-"))
    args.work.mkdir(parents=True, exist_ok=True)
    import transformers

    report = {
        "bench": "specforge",
        "machine": describe(device=args.device, transformers=transformers.__version__),
        "tried": [],
    }
    report["probe"] = run_worker(args, "probe")
    report["tried"].append(
        "wheel on sys.path (zipimport), import the EAGLE-3 modules only: " + ", ".join(SF_MODULES)
    )
    sf_ok = report["probe"].get("ok", False)
    if "throughput" in parts:
        report["throughput"] = {}
        for workload in args.workload or ["full", "chat"]:
            sides = ["ours", "specforge"]
            if workload == "chat" and not args.no_noskip:
                sides.append("ours-noskip")
            tp = {}
            if not sf_ok:
                tp["specforge"] = {"error": "SpecForge did not import", "probe": report["probe"]}
                sides.remove("specforge")
            extra = ["--workload", workload]
            if args.side_by_side:  # start and compile together; each times with the GPU alone
                tp.update(run_side_by_side(args, {s: f"throughput-{s}" for s in sides}, extra))
            else:
                for side in sides:
                    tp[side] = run_worker(args, f"throughput-{side}", extra)
            report["throughput"][workload] = throughput_summary(tp, workload)
    if "acceptance" in parts:
        try:
            report["acceptance"] = run_acceptance(args)
        except Exception as exc:
            report["acceptance"] = {"error": f"{type(exc).__name__}: {exc}"}
    save_result(args.out, report)
    print(json.dumps(report, indent=1, default=str)[:6000])
    print_summary(report)
    acc = report.get("acceptance", {})
    if "eval_ours" in acc and "eval_specforge" in acc:
        print(
            f"bench_specforge: accept length ours {acc['eval_ours']['accept_length']} vs SpecForge "
            f"{acc['eval_specforge']['accept_length']} (untrained {acc.get('eval_untrained')}) "
            f"after {args.epochs} epochs"
        )
    return 0


def print_summary(report: dict) -> None:
    for workload, tp in report.get("throughput", {}).items():
        if "throughput_ratio" not in tp:
            print(f"bench_specforge [{workload}]: no ratio ({sorted(tp)})")
            continue
        eq = tp.get("ours_equal_tokens", {})
        print(
            f"bench_specforge [{workload}]: ours {tp['ours']['tokens_per_s']} tok/s vs "
            f"SpecForge {tp['specforge']['tokens_per_s']} tok/s = {tp['throughput_ratio']}x "
            f"(goal {tp['goal_ratio']}x); memory {tp['ours']['peak_mem_gb']} vs "
            f"{tp['specforge']['peak_mem_gb']} GB"
            + (
                f"; at equal tokens per step ({eq['seq']}) {eq['tokens_per_s']} tok/s, "
                f"{eq['peak_mem_gb']} GB"
                if "tokens_per_s" in eq
                else ""
            )
            + (
                f"; ours without idle-row skipping {tp['ours-noskip']['tokens_per_s']} tok/s"
                if "tokens_per_s" in tp.get("ours-noskip", {})
                else ""
            )
        )


if __name__ == "__main__":
    sys.exit(main())
