"""The dense shard writer alone: how close it comes to the disk, against writing each shard the
usual way (concatenate the rows, `safetensors.torch.save_file`, fsync), the path this writer
took before it streamed the row blocks itself.

Kimi-K2.5-shaped rows (hidden 7168, three aux layers + final, bf16: 57,344 bytes per token) in
samples of 2,048 tokens are handed to each writer as fast as it takes them; every shard is
fsynced before the clock stops. Three figures on the same directory:

- dense writer: `ShardWriter(background=True)`, the extractor's writer;
- peer: per shard, `torch.cat` of the buffered rows + `save_file` + fsync, one thread;
- raw: the same rows written straight from memory with no format + fsync: the ceiling.

On a tmpfs (`--dir /dev/shm`) the disk drops out and what remains is each writer's memory
traffic. Usage: python3 bench/bench_shard_writer.py [--gb 4] [--dir PATH] [--shard-mb 512]
Writes bench/results/shard_writer.json (or --out).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from machine_info import describe, save_result  # noqa: E402  (bench/ is sys.path[0] as a script)

from remote_agent.eagle3.dense import DumpMeta, ShardWriter  # noqa: E402

HIDDEN = 7168
TOKENS = 2048


def sample_tensors():
    import torch

    g = torch.Generator().manual_seed(0)
    aux = torch.randn(TOKENS, 3 * HIDDEN, generator=g).to(torch.bfloat16)
    final = torch.randn(TOKENS, HIDDEN, generator=g).to(torch.bfloat16)
    return torch.arange(TOKENS, dtype=torch.int32), aux, final


def run_dense(root: Path, meta: DumpMeta, n: int, shard_bytes: int) -> tuple[float, int]:
    ids, aux, final = sample_tensors()
    writer = ShardWriter(root, meta, shard_bytes=shard_bytes, background=True)
    start = time.perf_counter()
    for i in range(n):
        writer.add(f"s{i:06d}", ids, aux, final)
    writer.close()
    return time.perf_counter() - start, writer.bytes_written


def run_peer(root: Path, n: int, shard_bytes: int, bytes_per_token: int) -> tuple[float, int]:
    import torch
    from safetensors.torch import save_file

    ids, aux, final = sample_tensors()
    root.mkdir(parents=True)
    per_shard = max(1, shard_bytes // (TOKENS * bytes_per_token))
    total = 0
    start = time.perf_counter()
    for first in range(0, n, per_shard):
        k = min(per_shard, n - first)
        path = root / f"{first:06d}.safetensors"
        tensors = {
            "input_ids": torch.cat([ids] * k),
            "aux": torch.cat([aux] * k),
            "final": torch.cat([final] * k),
        }
        save_file(tensors, str(path), metadata={"samples": str(k)})
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        total += path.stat().st_size
    return time.perf_counter() - start, total


def run_raw(root: Path, n: int) -> float:
    """The same sample rows written straight from memory, no format: any writer's ceiling."""
    import torch

    views = [memoryview(t.view(torch.uint8).numpy()) for t in sample_tensors()]
    path = root / "raw.bin"
    start = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(n):
            for v in views:
                f.write(v)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - start
    path.unlink()
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=4.0, help="bytes written per writer")
    parser.add_argument("--shard-mb", type=float, default=512.0)
    parser.add_argument("--repeat", type=int, default=2, help="best of N")
    parser.add_argument("--dir", type=Path, help="filesystem to write to (default: a temp dir)")
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results" / "shard_writer.json"
    )
    args = parser.parse_args(argv)
    meta = DumpMeta(model="bench", hidden_size=HIDDEN, num_layers=61, aux_layer_ids=[2, 30, 58])
    bpt = meta.bytes_per_token()
    n = max(1, int(args.gb * 1e9 / (TOKENS * bpt)))
    shard_bytes = int(args.shard_mb * (1 << 20))
    work = Path(tempfile.mkdtemp(prefix="bench-writer-", dir=args.dir))
    runs: dict[str, list[float]] = {"dense": [], "peer": [], "raw": []}
    nbytes = 0
    print(
        f"bench_shard_writer: {n} samples x {TOKENS} tokens x {bpt} B = {n * TOKENS * bpt / 1e9:.2f}"
        f" GB per writer, {args.shard_mb:g} MiB shards, into {work}",
        flush=True,
    )
    try:
        for r in range(args.repeat):
            seconds, nbytes = run_dense(work / f"dense-{r}", meta, n, shard_bytes)
            runs["dense"].append(seconds)
            shutil.rmtree(work / f"dense-{r}")
            seconds, peer_bytes = run_peer(work / f"peer-{r}", n, shard_bytes, bpt)
            runs["peer"].append(seconds)
            shutil.rmtree(work / f"peer-{r}")
            runs["raw"].append(run_raw(work, n))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gbps = {k: round(nbytes / min(v) / 1e9, 3) for k, v in runs.items()}
    result = {
        "bench": "shard_writer",
        "machine": describe(),
        "config": {
            "dir": str(args.dir or tempfile.gettempdir()),
            "bytes_per_writer": nbytes,
            "shard_mb": args.shard_mb,
            "samples": n,
            "tokens_per_sample": TOKENS,
            "bytes_per_token": bpt,
            "repeat": args.repeat,
        },
        "gb_per_s": gbps,
        "seconds": {k: [round(s, 3) for s in v] for k, v in runs.items()},
        "dense_vs_peer": round(gbps["dense"] / gbps["peer"], 3),
        "dense_vs_raw_disk": round(gbps["dense"] / gbps["raw"], 3),
    }
    save_result(args.out, result)
    print(
        f"dense writer {gbps['dense']} GB/s | peer cat+save_file {gbps['peer']} GB/s "
        f"({result['dense_vs_peer']:.2f}x) | raw write {gbps['raw']} GB/s "
        f"(dense at {result['dense_vs_raw_disk']:.0%} of it)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
