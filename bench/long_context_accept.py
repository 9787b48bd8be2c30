"""Worker of bench_long_context.py: acceptance length by context position, with and without long
training samples.

A tiny target (the `gpu` preset, trained `--target-steps`), its greedy answers to short prompts
(32-200 tokens) and to long ones (1K-3.8K tokens); two drafters, one trained on the short samples
only (the long source dropped), one on both (`data.long_samples: alone`); acceptance length by
context-position bucket (remote_agent/eagle3/drafter/eval/position_accept.py) on held-out prompts of
every length. Light on the GPU, so the orchestrator runs it beside the 4K equal-work workers
(paused while they time). Each stage is written to `<work>/accept.json` when done, so a worker
cut by the budget still says how far it got.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


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
    rng = random.Random(seed)
    return [rng.randint(lo, hi) for _ in range(n)]


def tiny_target(args, work: Path) -> tuple[Path, dict]:
    from remote_agent.eagle3.tiny.cache import ensure_tiny

    if args.tiny or args.target_steps == 0:
        return ensure_tiny("ci" if args.tiny else "gpu"), {"trained_steps": 0}
    build = work / "target"
    cmd = [
        sys.executable, "-m", "remote_agent.eagle3", "build-tiny", "--out", str(build),
        "--preset", "gpu", "--device", args.device, "--per-source", "300",
        "--train-steps", str(args.target_steps), "--batch", "16", "--seq-len", "1024",
    ]  # fmt: skip
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True)
    return build / "model", {
        "trained_steps": args.target_steps,
        "seq_len": 1024,
        "seconds": round(time.perf_counter() - t0, 1),
    }


# (samples, prompt tokens) of short, long and held-out prompts; new tokens; budget; vocab; TTT
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(short=(24, (16, 48)), long=(6, (256, 900)), eval=8, new=16, budget=256,
                 vocab=256, ttt=3),
    "gpu": dict(short=(160, (32, 200)), long=(32, (1024, 3800)), eval=24, new=96, budget=2048,
                vocab=4096, ttt=7),
}  # fmt: skip


class Stages:
    """The record written after every stage."""

    def __init__(self, path: Path) -> None:
        self.path, self.t0 = path, time.perf_counter()
        self.rec: dict[str, Any] = {"stages_done": []}

    def done(self, name: str, **fields: Any) -> None:
        self.rec.update(fields)
        self.rec["stages_done"].append(
            {"stage": name, "at_s": round(time.perf_counter() - self.t0, 1)}
        )
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.rec, indent=1, default=str))
        os.replace(tmp, self.path)


def run(args) -> dict:
    from remote_agent.eagle3.drafter.eval.synthetic import build_inputs

    work, device = Path(args.work) / "accept", args.device
    work.mkdir(parents=True, exist_ok=True)
    st = Stages(Path(args.work) / f"{args.worker}.json")
    st.done("start")
    target, target_info = tiny_target(args, work)
    st.done("target", target={"preset": "ci" if args.tiny else "gpu", **target_info})
    z = SIZES["tiny" if args.tiny else "gpu"]
    (n_s, short), (n_l, long) = z["short"], z["long"]
    t0 = time.perf_counter()
    common: dict[str, Any] = dict(new_tokens=z["new"], draft_vocab=z["vocab"], device=device)
    short_in = build_inputs(
        target, work / "short", n_s, spread(n_s, short[0], short[1], 1), seed=1, **common
    )
    long_in = build_inputs(
        target, work / "long", n_l, spread(n_l, long[0], long[1], 2), seed=2, gen_batch=8, **common
    )
    eval_in = build_inputs(
        target, work / "eval", z["eval"], spread(z["eval"], short[0], long[1], 3), seed=3,
        gen_batch=8, **common,
    )  # fmt: skip
    both = combine([short_in, long_in], work / "both")
    data = {
        "short": {"samples": short_in["samples"], "tokens": short_in["tokens"], "prompt_tokens": short},
        "long": {"samples": long_in["samples"], "tokens": long_in["tokens"], "prompt_tokens": long},
        "eval": {"samples": eval_in["samples"], "tokens": eval_in["tokens"]},
        "answer_tokens": z["new"],
        "seconds": round(time.perf_counter() - t0, 1),
    }  # fmt: skip
    st.done(
        "data", data=data, train={"epochs": args.epochs, "max_tokens": z["budget"], "ttt": z["ttt"]}
    )
    depth = 3  # SGLang's chain: steps 3, draft tokens 4 (the trainer's sim_accept_len)
    st.rec["chain_depth"] = depth
    for name, inputs in (("without_long", short_in), ("with_long", both)):
        run_info, ckpt = train_one(args, target, inputs, short_in["vocab"], z, work / f"run-{name}")
        st.rec["train"][name] = run_info
        st.done(f"train {name}")
        st.rec[name] = by_position(target, ckpt, eval_in, z["budget"], depth, device)
        st.done(f"accept {name}")
    return st.rec


def train_one(args, target: Path, inputs: dict, vocab: str, z: dict, out: Path):
    from bench_specforge import drafter_heads

    from remote_agent.eagle3.drafter.train import config as config_mod
    from remote_agent.eagle3.drafter.train.loop import train

    heads = drafter_heads(target)
    cfg = {
        "target": {"path": str(target)},
        "data": {
            "dump": inputs["dump"],
            "dataset": inputs["data"],
            "vocab": vocab,  # one draft vocabulary for both
            "max_tokens": z["budget"],
            "long_samples": "alone",
        },
        "drafter": {"num_attention_heads": heads, "num_key_value_heads": heads},
        "train": {
            "out_dir": str(out),
            "epochs": args.epochs,
            "lr": 1e-3,
            "ttt_steps": z["ttt"],
            "log_every": 20,
            "save_every": 0,
            "device": args.device,
            "compile": False,
        },
    }
    t = time.perf_counter()
    res = train(config_mod.from_dict(cfg))
    info = {
        "steps": res["steps"],
        "loss": res["loss"],
        "seconds": round(time.perf_counter() - t, 1),
    }
    return info, Path(res["checkpoint"])


def by_position(target: Path, ckpt_dir: Path, eval_in: dict, budget: int, depth: int, device):
    import torch

    from remote_agent.eagle3.drafter.eval.position_accept import PositionAccept, batch_chains
    from remote_agent.eagle3.drafter.model.loss import load_target_tensor
    from remote_agent.eagle3.drafter.model.model import Eagle3Drafter
    from remote_agent.eagle3.drafter.train import checkpoint as ckpt
    from remote_agent.eagle3.drafter.train.data import Loader, Plan

    lm_head = load_target_tensor(target, "lm_head.weight").float().to(device)
    embed = load_target_tensor(target, "model.embed_tokens.weight").float()
    plan = Plan(Path(eval_in["dump"]), Path(eval_in["data"]), budget, long_samples="alone")
    state = ckpt.load(ckpt_dir)
    drafter = Eagle3Drafter(state["model_config"])
    drafter.load_state_dict(state["model"], strict=False)
    drafter.set_vocab(state["vocab"]["d2t"], state["vocab"]["t2d"])
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(embed)
    drafter.to(device).eval()
    acc = PositionAccept(depth)
    for _, _, b in Loader(plan, 0, 0, 0, 1, prefetch=2):
        acc.add(*batch_chains(drafter, b.to(device), lm_head, depth))
    return [
        {"bucket": x["bucket"], "accept_length": x["accept_length"], "chains": x["chains"]}
        for x in acc.report()
    ]
