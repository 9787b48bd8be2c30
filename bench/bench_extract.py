"""Reference extraction throughput on one GPU, against a forward-only pass of the same model on
the same batches, and the per-sample file format SpecForge-style pipelines write.

A random-weight DeepseekV3 (preset `gpu`: hidden 1024, 8 layers, MLA + 16 experts; `wide`:
hidden 7168 like Kimi-K2.5, so bytes/token are Kimi's, with 8 thin layers, i.e. the write path's
worst case; `deep`: `gpu` with 48 layers, so the forward needs fewer bytes per second than a
single NVMe disk writes, as a real target's does: the overhead it shows is the extractor's own,
not the disk's) runs right-padded token-budget batches of random ids. Phases, each on the same
batches after a warm-up:

- forward: the base model (no lm_head), nothing captured: the floor;
- extract bf16 / fp8: the reference extractor's loop (pre-hooks, real-row gather, async D2H into
  pinned memory overlapping the next forward, dense shards written by a background thread),
  timed until the last shard is fsynced;
- peer: the same capture, then one `torch.save` file per sample (input_ids, aux_hidden_state
  [T, 3H], hidden_state [T, H], loss_mask) from a 4-thread pool, as SpecForge's
  prepare_hidden_states does.

Reports tokens/s, the capture + write overhead over forward (goal < 10 %), writer GB/s, raw disk
GB/s, bytes/token (dense bf16, dense fp8 aux, per-sample files, and the 4 x hidden x 2 figure).
Needs only torch, transformers, safetensors, numpy; about 1-2 minutes on an H200.

Usage: python3 bench/bench_extract.py [--quick] [--preset gpu|wide|deep|ci] [--device cuda|cpu]
Writes bench/results/extract.json (or --out) and prints the figures.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # also when loaded as a module (the CPU test does)

from machine_info import describe, disk_write_gbps, save_result  # noqa: E402

from remote_agent.eagle3.dense import DumpMeta, DumpReader, ShardWriter  # noqa: E402
from remote_agent.eagle3.extraction.capture import (  # noqa: E402
    AuxCapture,
    capture_batch,
    decoder_of,
    pad_batch,
    plan_batches,
    resolve_layer_ids,
)
from remote_agent.eagle3.extraction.reference import extract_loop  # noqa: E402
from remote_agent.eagle3.tiny import deepseek as tiny  # noqa: E402

PRESETS = {
    "ci": tiny.PRESETS["ci"],
    "gpu": tiny.PRESETS["gpu"],
    "wide": tiny.TinyPreset(7168, 8, 16, 512, 256, 64, 32, 64, 4096, 512, 8, 2, 16384, 8192),
    "deep": tiny.TinyPreset(1024, 48, 16, 256, 128, 64, 32, 64, 2816, 512, 16, 4, 16384, 4096),
}


def machine(device) -> dict:
    import transformers

    return describe(device=str(device), transformers=transformers.__version__)


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(preset: str, device, dtype, seed: int = 0):
    import torch
    from transformers import DeepseekV3ForCausalLM

    p = PRESETS[preset]
    cfg = tiny.deepseek_config(p, p.vocab_size, eos_token_id=1, pad_token_id=2)
    torch.manual_seed(seed)
    with torch.device(device):
        model = DeepseekV3ForCausalLM(cfg)
    return model.to(dtype).eval()


def make_samples(
    n: int, lo: int, hi: int, vocab: int, seed: int = 0
) -> list[tuple[str, list[int]]]:
    rng = random.Random(seed)
    return [
        (f"s{i:05d}", [rng.randrange(11, vocab) for _ in range(rng.randint(lo, hi))])
        for i in range(n)
    ]


def run_forward(decoder, batches, device) -> float:
    import torch

    sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        for _, ids, mask, _ in batches:
            decoder(input_ids=ids, attention_mask=mask, use_cache=False)
    sync(device)
    return time.perf_counter() - start


def run_extract(decoder, layers, layer_ids, batches, meta, out: Path, device, shard_mb: float):
    """The reference extractor's own loop (extraction/reference.py: extract_loop)."""
    writer = ShardWriter(out, meta, shard_bytes=int(shard_mb * (1 << 20)), background=True)
    sync(device)
    start = time.perf_counter()
    extract_loop(decoder, layers, layer_ids, batches, writer, device)
    writer.close()
    seconds = time.perf_counter() - start
    return seconds, writer


def run_peer(decoder, layers, layer_ids, batches, out: Path, device) -> tuple[float, int]:
    """SpecForge-style: one torch.save file per sample, written by a small thread pool."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    pool = ThreadPoolExecutor(4)
    futures = []
    sync(device)
    start = time.perf_counter()
    with AuxCapture(layers, layer_ids) as cap, torch.inference_mode():
        for sids, ids, mask, lens in batches:
            got, aux, final = (
                t.cpu() for t in capture_batch(decoder, cap, ids, mask, torch.bfloat16, lens)
            )
            off = 0
            for sid, n in zip(sids, lens, strict=True):
                record = {
                    "input_ids": got[off : off + n].clone(),
                    "aux_hidden_state": aux[off : off + n].clone(),
                    "hidden_state": final[off : off + n].clone(),
                    "loss_mask": torch.ones(n, dtype=torch.int32),
                }
                futures.append(pool.submit(torch.save, record, out / f"{sid}.ckpt"))
                off += n
    for f in futures:
        f.result()
    pool.shutdown()
    for p in out.iterdir():  # like the dense writer: on disk before the clock stops
        with open(p, "rb") as fh:
            os.fsync(fh.fileno())
    seconds = time.perf_counter() - start
    return seconds, sum(p.stat().st_size for p in out.iterdir())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, one repetition")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpu")
    parser.add_argument("--device", default="cuda" if _cuda() else "cpu")
    parser.add_argument("--samples", type=int, help="default 256 (quick: 48)")
    parser.add_argument("--min-len", type=int, default=256)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--token-budget", type=int, default=16384)
    parser.add_argument("--repeat", type=int, help="repetitions, best kept (default 2, quick 1)")
    parser.add_argument(
        "--shard-mb",
        type=float,
        help="shard size (default: the dump / 16, at most 2048): a production dump of terabytes "
        "is thousands of 2 GB shards, so only its last shard's write cannot overlap a forward; "
        "one 2 GB shard holding this whole benchmark would serialise every write after it",
    )
    parser.add_argument("--workdir", type=Path, help="where shards go (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "extract.json")
    args = parser.parse_args(argv)
    import torch

    device = torch.device(args.device)
    n = args.samples or (48 if args.quick else 256)
    repeat = args.repeat or (1 if args.quick else 2)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(args.preset, device, dtype)
    decoder, layers = decoder_of(model)
    cfg = model.config
    layer_ids = resolve_layer_ids(cfg.num_hidden_layers)
    hidden = cfg.hidden_size
    samples = make_samples(n, args.min_len, args.max_len, cfg.vocab_size)
    lengths = dict(samples)
    plan = plan_batches([(s, len(ids)) for s, ids in samples], args.token_budget)
    batches = []
    for group in plan:
        seqs = [lengths[s] for s in group]
        ids, mask = pad_batch(seqs, 2, device)
        batches.append((group, ids, mask, [len(q) for q in seqs]))
    tokens = sum(len(v) for v in lengths.values())
    padded = sum(b[1].numel() for b in batches)
    dump_bytes = tokens * _meta(cfg, layer_ids, "bf16").bytes_per_token()
    shard_mb = args.shard_mb or min(2048.0, max(8.0, dump_bytes / 16 / (1 << 20)))
    work = Path(tempfile.mkdtemp(prefix="bench-extract-", dir=args.workdir))
    print(
        f"bench_extract: {args.preset} on {device}, {n} samples, {tokens} tokens "
        f"({padded} padded) in {len(batches)} batches, hidden {hidden}, aux layers {layer_ids}",
        flush=True,
    )
    try:
        run_forward(decoder, batches[:2], device)  # warm-up (kernels, allocator)
        run_extract(
            decoder,
            layers,
            layer_ids,
            batches[:2],
            _meta(cfg, layer_ids, "bf16"),
            work / "warm",
            device,
            64,
        )
        shutil.rmtree(work / "warm")
        fwd, ext = [], {"bf16": [], "fp8_e4m3": []}
        for r in range(repeat):
            fwd.append(run_forward(decoder, batches, device))
            for kind in ext:
                out = work / f"{kind}-{r}"
                seconds, writer = run_extract(
                    decoder,
                    layers,
                    layer_ids,
                    batches,
                    _meta(cfg, layer_ids, kind),
                    out,
                    device,
                    shard_mb,
                )
                reader = DumpReader(out)
                assert len(reader) == n and reader.total_tokens() == tokens, "dump incomplete"
                shards = len(list((out / "shards").glob("*.safetensors")))
                ext[kind].append((seconds, writer.bytes_written, writer.write_seconds, shards))
                shutil.rmtree(out)
        peer_s, peer_bytes = run_peer(decoder, layers, layer_ids, batches, work / "peer", device)
        shutil.rmtree(work / "peer")
        raw = disk_write_gbps(work, min(1 << 30, max(ext["bf16"][0][1], 64 << 20)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    f = min(fwd)
    result = {
        "bench": "extract",
        "machine": machine(device),
        "config": {
            "preset": args.preset,
            "hidden": hidden,
            "layers": cfg.num_hidden_layers,
            "aux_layer_ids": layer_ids,
            "samples": n,
            "tokens": tokens,
            "padded_tokens": padded,
            "batches": len(batches),
            "token_budget": args.token_budget,
            "shard_mb": round(shard_mb, 1),
            "repeat": repeat,
            "model_dtype": str(dtype).removeprefix("torch."),
            "quick": args.quick,
        },
        "forward_only": {"seconds": round(f, 4), "tokens_per_s": round(tokens / f, 1)},
    }
    for kind, runs in ext.items():
        seconds, nbytes, busy, shards = min(runs)
        # the disk alone needs nbytes / raw seconds: when that exceeds the forward, no writer
        # can get below this overhead on this machine
        floor = max(0.0, nbytes / (raw * 1e9) / f - 1)
        result[f"extract_{kind}"] = {
            "seconds": round(seconds, 4),
            "tokens_per_s": round(tokens / seconds, 1),
            "overhead_vs_forward": round(seconds / f - 1, 4),
            "disk_bound_overhead_floor": round(floor, 4),
            "shards": shards,
            "bytes": nbytes,
            "bytes_per_token": round(nbytes / tokens, 1),
            "write_gb_per_s": round(nbytes / busy / 1e9, 3) if busy else None,
            "gb_per_s_sustained": round(nbytes / seconds / 1e9, 3),
        }
    result["peer_per_sample_torch_save"] = {
        "seconds": round(peer_s, 4),
        "tokens_per_s": round(tokens / peer_s, 1),
        "overhead_vs_forward": round(peer_s / f - 1, 4),
        "bytes_per_token": round(peer_bytes / tokens, 1),
    }
    result["bytes_per_token"] = {
        "dense_bf16": result["extract_bf16"]["bytes_per_token"],
        "dense_fp8_aux": result["extract_fp8_e4m3"]["bytes_per_token"],
        "per_sample_files_measured": result["peer_per_sample_torch_save"]["bytes_per_token"],
        "per_sample_formats_4xHx2": 4 * hidden * 2,
    }
    result["raw_disk_write_gb_per_s"] = round(raw, 3)
    result["goal"] = {
        "overhead_below": 0.10,
        "met": result["extract_bf16"]["overhead_vs_forward"] < 0.10,
    }
    save_result(args.out, result)
    _print(result)
    return 0


def _meta(cfg, layer_ids, aux_dtype: str) -> DumpMeta:
    return DumpMeta(
        model="bench-random",
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_hidden_layers,
        aux_layer_ids=layer_ids,
        aux_dtype=aux_dtype,
    )


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _print(r: dict) -> None:
    f = r["forward_only"]
    print(f"forward only          {f['tokens_per_s']:>12,.0f} tok/s")
    for key, label in (
        ("extract_bf16", "extract bf16"),
        ("extract_fp8_e4m3", "extract fp8 aux"),
        ("peer_per_sample_torch_save", "peer: per-sample files"),
    ):
        e = r[key]
        print(
            f"{label:<22}{e['tokens_per_s']:>12,.0f} tok/s  overhead {e['overhead_vs_forward']:+.1%}"
            f"  {e['bytes_per_token']:,.0f} B/token"
            + (f"  writer {e['write_gb_per_s']} GB/s" if e.get("write_gb_per_s") else "")
            + (
                f"  (disk-bound floor {e['disk_bound_overhead_floor']:+.1%}, {e['shards']} shards)"
                if "shards" in e
                else ""
            )
        )
    ours, peer = r["extract_bf16"], r["peer_per_sample_torch_save"]
    print(f"dense bf16 / per-sample files: {ours['tokens_per_s'] / peer['tokens_per_s']:.2f}x")
    b = r["bytes_per_token"]
    print(
        f"bytes/token: dense bf16 {b['dense_bf16']}, fp8 aux {b['dense_fp8_aux']}, per-sample files "
        f"{b['per_sample_files_measured']} (4 x hidden x 2 = {b['per_sample_formats_4xHx2']})"
    )
    print(
        f"raw disk write {r['raw_disk_write_gb_per_s']} GB/s; goal overhead < 10 %: {r['goal']['met']}"
    )


if __name__ == "__main__":
    sys.exit(main())
