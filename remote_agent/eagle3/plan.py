"""`eagle3 plan`: what a production run costs before the box is rented (issue 26).

From the merged dataset's token count and the box's numbers (measured, or stated assumptions),
per dump format: dump size, extraction time, training time, and the sustained read bandwidth the
trainer needs (training reads the whole dump once per epoch at its token rate). A short probe
measures this disk's read bandwidth (write, fsync, drop from the page cache, read back). When the
trainer would need more than the disk gives, training is disk-bound: the plan says so and names
the remedies (fp8 aux, fewer epochs, a faster volume, or the online mode that never writes dumps).

Bytes per token come from the dump format itself (dense.DumpMeta.bytes_per_token): Kimi-K2.5
(hidden 7168, 3 aux layers) is 57,348 B/token with bf16 aux and 35,856 with fp8 aux (per-token
fp32 scales; the final state stays bf16; + the int32 id).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput

HELP = "dump size, extraction/training time and disk bandwidth a run needs (before renting)"
GB = 1e9


def bytes_per_token(hidden: int, aux_layers: int, aux_dtype: str) -> int:
    from remote_agent.eagle3.dense import DumpMeta

    meta = DumpMeta(
        model="plan",
        hidden_size=hidden,
        num_layers=aux_layers + 3,
        aux_layer_ids=list(range(1, aux_layers + 1)),
        aux_dtype=aux_dtype,
        producer="plan",
    )
    return meta.bytes_per_token()


def probe_read_gbps(directory: Path, mb: int = 512) -> dict[str, Any]:
    """Sequential read bandwidth of `directory`'s volume: a fresh file, fsynced, evicted from
    the page cache (posix_fadvise DONTNEED), read back in 8 MiB blocks."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f".eagle3-plan-probe-{os.getpid()}"
    block = os.urandom(8 << 20)
    n = max(1, (mb << 20) // len(block))
    try:
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            for _ in range(n):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        write_s = time.perf_counter() - t0
        fd = os.open(path, os.O_RDONLY)
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            t0 = time.perf_counter()
            while os.read(fd, len(block)):
                pass
            read_s = time.perf_counter() - t0
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
    size = n * len(block)
    return {
        "dir": str(directory),
        "bytes": size,
        "read_gb_per_s": round(size / read_s / GB, 3),
        "write_gb_per_s": round(size / write_s / GB, 3),
        "note": "page cache dropped with posix_fadvise; a volume that ignores it reads faster here",
    }


def make_plan(
    tokens: int,
    hidden: int,
    aux_layers: int,
    epochs: float,
    train_tokens_per_s: float,
    extract_tokens_per_s: float,
    read_gb_per_s: float | None,
    assumptions: dict[str, str] | None = None,
) -> dict[str, Any]:
    formats = {}
    for aux in ("bf16", "fp8_e4m3"):
        bpt = bytes_per_token(hidden, aux_layers, aux)
        need = train_tokens_per_s * bpt / GB
        disk_bound = read_gb_per_s is not None and need > read_gb_per_s
        # when disk-bound the trainer runs at the disk's pace, not its own
        rate = min(train_tokens_per_s, read_gb_per_s * GB / bpt) if read_gb_per_s else None
        formats[aux] = {
            "bytes_per_token": bpt,
            "dump_bytes": tokens * bpt,
            "dump_tb": round(tokens * bpt / 1e12, 3),
            "extract_write_gb_per_s": round(extract_tokens_per_s * bpt / GB, 3),
            "train_read_gb_per_s_needed": round(need, 3),
            "disk_bound": disk_bound,
            "train_hours_at_disk_pace": (
                round(tokens * epochs / rate / 3600, 2) if rate and disk_bound else None
            ),
        }
    plan = {
        "tokens": tokens,
        "hidden_size": hidden,
        "aux_layers": aux_layers,
        "epochs": epochs,
        "extract_tokens_per_s": extract_tokens_per_s,
        "train_tokens_per_s": train_tokens_per_s,
        "disk_read_gb_per_s": read_gb_per_s,
        "extraction_hours": round(tokens / extract_tokens_per_s / 3600, 2),
        "training_hours": round(tokens * epochs / train_tokens_per_s / 3600, 2),
        "formats": formats,
        "assumptions": assumptions or {},
    }
    plan["verdict"], plan["remedies"] = verdict(plan)
    return plan


def verdict(plan: dict[str, Any]) -> tuple[str, list[str]]:
    f = plan["formats"]
    if plan["disk_read_gb_per_s"] is None:
        return "unknown: no disk read bandwidth (run with --probe DIR or --read-gbps)", []
    if not f["bf16"]["disk_bound"]:
        return "ok: training is not disk-bound with bf16 aux", []
    remedies = []
    if not f["fp8_e4m3"]["disk_bound"]:
        remedies.append(
            f"fp8 aux (`extract --aux-dtype fp8_e4m3`): {f['fp8_e4m3']['bytes_per_token']:,} "
            f"B/token needs {f['fp8_e4m3']['train_read_gb_per_s_needed']} GB/s"
        )
    else:
        remedies.append(
            f"fp8 aux alone is not enough: {f['fp8_e4m3']['train_read_gb_per_s_needed']} GB/s "
            f"needed vs {plan['disk_read_gb_per_s']} GB/s"
        )
    remedies += [
        "fewer epochs do not lower the bandwidth, only the hours spent at the disk's pace "
        f"({f['bf16']['train_hours_at_disk_pace']} h bf16 for {plan['epochs']} epochs)",
        f"a faster volume: >= {f['bf16']['train_read_gb_per_s_needed']} GB/s sustained reads "
        "(local NVMe RAID, several volumes striped)",
        "the online mode: the trainer takes hidden states from a live SGLang, no dump is written "
        "or read",
    ]
    return "disk-bound: training would wait on the disk with bf16 aux", remedies


def render(plan: dict[str, Any]) -> str:
    lines = [
        f"plan: {plan['tokens']:,} tokens, hidden {plan['hidden_size']}, {plan['aux_layers']} aux "
        f"layers, {plan['epochs']} epochs",
        f"  extraction: {plan['extraction_hours']} h at {plan['extract_tokens_per_s']:,.0f} tokens/s",
        f"  training:   {plan['training_hours']} h at {plan['train_tokens_per_s']:,.0f} tokens/s",
        f"  disk read:  {plan['disk_read_gb_per_s']} GB/s",
    ]
    for name, f in plan["formats"].items():
        lines.append(
            f"  {name:9s} {f['bytes_per_token']:>7,} B/token  dump {f['dump_tb']} TB  training "
            f"reads {f['train_read_gb_per_s_needed']} GB/s"
            + ("  DISK-BOUND" if f["disk_bound"] else "")
        )
    lines.append(f"verdict: {plan['verdict']}")
    lines += [f"  remedy: {r}" for r in plan["remedies"]]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", type=Path, help="the merged OUT.jsonl (its token count)")
    p.add_argument("--tokens", type=int, help="token count instead of --dataset")
    p.add_argument("--hidden", type=int, default=7168, help="target hidden size (Kimi-K2.5 7168)")
    p.add_argument("--aux-layers", type=int, default=3)
    p.add_argument("--epochs", type=float, default=3)
    p.add_argument(
        "--train-tokens-per-s", type=float, required=True, help="the box's drafter training rate"
    )
    p.add_argument(
        "--extract-tokens-per-s", type=float, required=True, help="the box's prefill dump rate"
    )
    p.add_argument("--probe", type=Path, help="measure read bandwidth of this directory's volume")
    p.add_argument("--probe-mb", type=int, default=512)
    p.add_argument("--read-gbps", type=float, help="the volume's read bandwidth, if known")
    p.add_argument("--assume", action="append", default=[], help="KEY=TEXT recorded as stated")
    p.add_argument(
        "--aux-dtype", choices=("bf16", "fp8_e4m3"), default="bf16", help="the planned format"
    )
    p.add_argument(
        "--strict", action="store_true", help="exit 1 when the planned format is disk-bound"
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", type=Path, help="write the plan JSON here")


def run(args: argparse.Namespace) -> int:
    if args.tokens is None and args.dataset is None:
        raise BadInput("plan needs --dataset OUT.jsonl or --tokens N")
    tokens = args.tokens
    if tokens is None:
        from remote_agent.eagle3.extraction.dataset import open_dataset

        tokens = open_dataset(args.dataset, require_manifest=False).total_tokens()
    if tokens <= 0 or args.train_tokens_per_s <= 0 or args.extract_tokens_per_s <= 0:
        raise BadInput("tokens and rates must be positive")
    probe = probe_read_gbps(args.probe, args.probe_mb) if args.probe else None
    read = probe["read_gb_per_s"] if probe else args.read_gbps
    assumptions = dict(a.split("=", 1) for a in args.assume if "=" in a)
    plan = make_plan(
        tokens,
        args.hidden,
        args.aux_layers,
        args.epochs,
        args.train_tokens_per_s,
        args.extract_tokens_per_s,
        read,
        assumptions,
    )
    if probe:
        plan["probe"] = probe
    if args.dataset:
        plan["dataset"] = str(args.dataset)
    if args.out:
        from remote_agent.eagle3.atomic import write_bytes_atomic

        write_bytes_atomic(args.out, (json.dumps(plan, indent=1) + "\n").encode())
    print(json.dumps(plan, indent=1) if args.json else render(plan))
    from remote_agent.eagle3.progress import emit

    emit("result", stage="plan", verdict=plan["verdict"], tokens=tokens)
    bound = plan["formats"][args.aux_dtype]["disk_bound"]
    if bound:
        print(f"{'BLOCKED' if args.strict else 'WARNING'}: {args.aux_dtype} training is disk-bound")
    return 1 if args.strict and bound else 0
