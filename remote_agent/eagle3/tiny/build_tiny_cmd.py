"""`eagle3 build-tiny`: a tiny DeepseekV3 target with real structure, plus chat data from it.

    OUT/model/                  tokenizer (trained offline) + config + safetensors
    OUT/data/implement.jsonl    ShareGPT   (stdlib: prompt -> function source)
    OUT/data/explain.jsonl      OpenAI     (source -> docstring)
    OUT/data/modules.jsonl      SpecForge  (whole modules: the long-outlier source)
    OUT/data/regenerated.jsonl  the trained target's own answers to `--prompts` prompts
    OUT/tiny.json               what was built (read by later steps and by reports)

`--preset ci` builds in seconds on a CPU; `--preset gpu` (0.3 B parameters) is meant for a few
minutes of `--train-steps` on one H200. Re-running with the same arguments is a no-op.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from remote_agent.eagle3.errors import BadInput

HELP = "build a tiny tokenizer + DeepseekV3 target (demo, tests, GPU runs)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument(
        "--preset",
        choices=("ci", "gpu", "kimi-gpu", "kimi-k25-ci", "kimi-k25-gpu"),
        default="ci",
        help="kimi-k25-*: the KimiK25ForConditionalGeneration wrapper + tiktoken tokenizer",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-source", type=int, default=200, help="samples per ground-truth source")
    p.add_argument(
        "--train-steps", type=int, default=0, help="next-token training steps (0: random target)"
    )
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--prompts", type=int, default=0, help="prompts the trained target answers")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--regen-batch", type=int, default=32)
    p.add_argument(
        "--temperature", type=float, default=0.0, help="regeneration temperature (0: greedy)"
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")


def run(args: argparse.Namespace) -> int:
    import torch

    from remote_agent.eagle3.progress import emit
    from remote_agent.eagle3.tiny import cache, data, train

    device = (
        args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BadInput(f"--device {device}: no CUDA device here")
    available = sum(1 for _ in data.stdlib_functions())
    if args.prompts > available or 2 * args.per_source > available:
        raise BadInput(
            f"this Python's standard library has {available} usable functions: ask for at most "
            f"{available} --prompts and {available // 2} --per-source"
        )
    params = {k: v for k, v in vars(args).items() if k not in ("out", "device", "command")}
    summary_path = args.out / "tiny.json"
    if summary_path.exists() and json.loads(summary_path.read_text()).get("params") == params:
        print(f"{args.out}: already built with these arguments")
        emit("result", stage="build-tiny", cached=True, out=str(args.out))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"params": params, "device": device}
    t0 = time.time()
    base = cache.ensure_tiny(args.preset, args.seed)
    model_dir = args.out / "model"
    if model_dir.exists():
        shutil.rmtree(model_dir)
    shutil.copytree(base, model_dir)
    summary["build_s"] = round(time.time() - t0, 2)
    sources = data.write_sources(args.out / "data", args.per_source, args.seed)
    summary["sources"] = {k: str(v) for k, v in sources.items()}
    if args.train_steps > 0:
        convs = []
        for line in sources["implement"].read_text().splitlines():
            c = json.loads(line)["conversations"]
            convs.append(
                [
                    {"role": "user", "content": c[0]["value"]},
                    {"role": "assistant", "content": c[1]["value"]},
                ]
            )
        for line in sources["explain"].read_text().splitlines():
            convs.append(json.loads(line)["messages"])
        t1 = time.time()
        summary["train"] = train.train_target(
            model_dir, convs, args.train_steps, args.seq_len, args.batch, args.lr, device, args.seed
        )
        summary["train"]["wall_s"] = round(time.time() - t1, 2)
    if args.prompts > 0:
        t2 = time.time()
        summary["regenerate"] = train.regenerate(
            model_dir,
            data.prompts(args.prompts, args.seed),
            args.out / "data" / "regenerated.jsonl",
            args.max_new_tokens,
            args.regen_batch,
            device,
            args.temperature,
            args.seed,
        )
        summary["regenerate"]["wall_s"] = round(time.time() - t2, 2)
    from remote_agent.eagle3.atomic import write_bytes_atomic

    write_bytes_atomic(summary_path, (json.dumps(summary, indent=1) + "\n").encode())
    emit(
        "result",
        stage="build-tiny",
        out=str(args.out),
        **{k: summary[k] for k in ("train", "regenerate") if k in summary},
    )
    print(json.dumps(summary, indent=1))
    return 0
