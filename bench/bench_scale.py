"""Scaling of the two GPU stages on one box: reference extraction and drafter training under
torchrun with 1, 2, 4, 8 ranks (whatever --ranks lists and the box has).

    python3 bench/bench_scale.py --ranks 1,2 --out bench/results/scale.json
    python3 bench/bench_scale.py --device cpu --ranks 1,2 --quick     # rehearsal (gloo)

For every rank count: total and per-rank tokens/s, scaling efficiency against 1 rank
(tokens/s at n / (n x tokens/s at 1)), peak GPU memory per GPU (nvidia-smi, sampled), the
training data-wait share, and the extraction write rate, so a stage that stops scaling shows
why (data loading, writes or all-reduce). NVLink multicast stays off (NCCL_NVLS_ENABLE=0 etc.).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from machine_info import describe, disk_write_gbps, save_result  # noqa: E402  (bench/ is sys.path[0] as a script)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NCCL_SAFE = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def records(path: Path, n: int, vocab: int, seed: int) -> int:
    """Synthetic tokenized records with a realistic length skew (log-normal, 64..2048)."""
    rng = random.Random(seed)
    total = 0
    with open(path, "w") as f:
        for i in range(n):
            length = int(min(2048, max(64, rng.lognormvariate(6.0, 0.6))))
            prompt = max(8, length // 5)
            ids = [rng.randrange(16, vocab) for _ in range(length)]
            mask = [0] * prompt + [1] * (length - prompt)
            f.write(
                json.dumps(
                    {"id": f"s{i:06d}", "source": "synthetic", "input_ids": ids, "loss_mask": mask}
                )
                + "\n"
            )
            total += length
    return total


class GpuMemory:
    """Peak memory.used per GPU, sampled every 0.2 s while a stage runs."""

    def __init__(self) -> None:
        self.peak: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(
                    [
                        "nvidia-smi",
                        "--query-gpu=index,memory.used",
                        "--format=csv,noheader,nounits",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=5,
                ).stdout
            except (OSError, subprocess.TimeoutExpired):
                return
            for line in out.splitlines():
                idx, used = (int(x) for x in line.split(","))
                self.peak[idx] = max(self.peak.get(idx, 0), used)
            self._stop.wait(0.2)

    def __enter__(self) -> GpuMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def torchrun(
    n: int, args: list[str], env: dict[str, str], timeout: float
) -> tuple[list[dict], float, str]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(n),
        "-m",
        "remote_agent.eagle3",
        *args,
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
    wall = time.monotonic() - t0
    recs = []
    for line in out.splitlines():
        if "@@eagle3 " in line:
            try:
                recs.append(json.loads(line.split("@@eagle3 ", 1)[1]))
            except ValueError:
                pass
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args[:1])} with {n} ranks failed (exit {proc.returncode}):\n{out[-3000:]}"
        )
    return recs, wall, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/eagle3-scale"))
    ap.add_argument(
        "--target", type=Path, help="target model dir (default: the tiny `gpu` preset, random)"
    )
    ap.add_argument("--samples", type=int, default=4000)
    ap.add_argument("--train-steps", type=int, default=60)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--shard-mb",
        type=float,
        help="extraction shard size (default: each rank's share of the dump / 16, at most 2048): "
        "a real dump is thousands of shards, so only the last shard's write trails the forwards",
    )
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "scale.json")
    args = ap.parse_args()
    ranks = [int(x) for x in args.ranks.split(",")]
    cpu = args.device == "cpu"
    if args.quick:
        args.samples, args.train_steps = (120, 12) if cpu else (1500, 40)
    env = {
        **os.environ,
        **NCCL_SAFE,
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    if cpu:
        env["OMP_NUM_THREADS"] = "1"

    from remote_agent.eagle3.tiny.cache import ensure_tiny

    target = args.target or ensure_tiny("ci" if cpu else "gpu")
    cfg = json.loads((Path(target) / "config.json").read_text())
    vocab = cfg["vocab_size"]
    args.work.mkdir(parents=True, exist_ok=True)
    raw = args.work / "synthetic.jsonl"
    merged = args.work / "merged.jsonl"
    tokens = records(raw, args.samples, vocab, seed=0)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "remote_agent.eagle3",
            "merge",
            str(raw),
            "--out",
            str(merged),
            "--seed",
            "0",
            "--vocab-size",
            str(vocab),
        ],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
    )
    budget = "4096" if cpu else "65536"
    from remote_agent.eagle3.dense import DumpMeta
    from remote_agent.eagle3.extraction.capture import resolve_layer_ids

    layers = cfg["num_hidden_layers"]
    meta = DumpMeta("", cfg["hidden_size"], layers, resolve_layer_ids(layers))
    dump_bytes = tokens * meta.bytes_per_token()
    result: dict = {
        # extraction writes every rank's shards to this one disk: when the write rate nears it,
        # extraction is disk-bound and more ranks cannot help
        "machine": describe(disk_write_gb_per_s=round(disk_write_gbps(args.work), 3)),
        "target": str(target),
        "samples": args.samples,
        "tokens": tokens,
        "ranks": ranks,
        "extract": {},
        "train": {},
    }
    dump_for_training = None
    for n in ranks:
        shard_mb = args.shard_mb or min(2048.0, max(8.0, dump_bytes / n / 16 / (1 << 20)))
        out_dir = args.work / f"dump-{n}"
        subprocess.run(["rm", "-rf", str(out_dir)], check=True)
        with GpuMemory() as mem:
            recs, wall, _ = torchrun(
                n,
                [
                    "extract",
                    "--backend",
                    "hf",
                    "--model",
                    str(target),
                    "--dataset",
                    str(merged),
                    "--out",
                    str(out_dir),
                    "--token-budget",
                    budget,
                    "--device",
                    args.device,
                    "--disk-margin-gb",
                    "0.1",
                    "--min-free-gb",
                    "0.1",
                    "--shard-mb",
                    str(round(shard_mb, 1)),
                ],
                env,
                timeout=900,
            )
        summary = next(r for r in recs if r.get("kind") == "result")
        per_rank = {
            r["rank"]: r.get("tokens_per_s")
            for r in recs
            if r.get("kind") == "progress" and "rank" in r and r.get("done") == r.get("total")
        }
        result["extract"][n] = {
            "tokens_per_s": summary.get("tokens_per_s"),
            "seconds": summary.get("seconds"),
            "wall_s": round(wall, 2),
            "per_rank_tokens_per_s": per_rank,
            "bytes_per_token": summary.get("bytes_per_token"),
            "write_gb_s": round(summary["bytes_written"] / 1e9 / summary["seconds"], 3)
            if summary.get("seconds")
            else None,
            "peak_mem_mib": mem.peak,
            "shard_mb": round(shard_mb, 1),
        }
        dump_for_training = dump_for_training or out_dir
        print(json.dumps({"extract": n, **result["extract"][n]}), flush=True)

    config = (
        REPO
        / "remote_agent/eagle3/drafter/examples"
        / ("tiny-cpu.yaml" if cpu else "tiny-gpu.yaml")
    )
    for n in ranks:
        run_dir = args.work / f"train-{n}"
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
        with GpuMemory() as mem:
            recs, wall, _ = torchrun(
                n,
                [
                    "train",
                    "--config",
                    str(config),
                    "--device",
                    args.device,
                    "--max-steps",
                    str(args.train_steps),
                    "--out",
                    str(run_dir),
                    "--set",
                    f"target.path={target}",
                    "--set",
                    f"data.dump={dump_for_training}",
                    "--set",
                    f"data.dataset={merged}",
                    "--set",
                    "train.log_every=5",
                    "--set",
                    "train.save_every=0",
                ],
                env,
                timeout=900,
            )
        metrics = [r for r in recs if r.get("kind") == "metrics"]
        steady = metrics[len(metrics) // 2 :] or metrics  # after compile and warm-up
        result["train"][n] = {
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady)
            if steady
            else None,
            "data_wait": statistics.median(r.get("data_wait", 0.0) for r in steady)
            if steady
            else None,
            "peak_mem_mib": mem.peak,
            "wall_s": round(wall, 2),
            "reported_peak_mem_gb": steady[-1].get("peak_mem_gb") if steady else None,
        }
        print(json.dumps({"train": n, **result["train"][n]}), flush=True)

    for stage in ("extract", "train"):
        base = result[stage].get(ranks[0], {}).get("tokens_per_s")
        for n in ranks:
            tps = result[stage][n]["tokens_per_s"]
            if base and tps:
                result[stage][n]["per_rank_avg_tokens_per_s"] = round(tps / n, 1)
                result[stage][n]["efficiency"] = round(tps / (n / ranks[0] * base), 3)
    save_result(args.out, result)
    for stage in ("extract", "train"):
        for n in ranks:
            r = result[stage][n]
            print(
                f"{stage:8s} {n} rank(s): {r['tokens_per_s']} tok/s, efficiency {r.get('efficiency')}, "
                f"peak MiB {r['peak_mem_mib']}"
            )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
