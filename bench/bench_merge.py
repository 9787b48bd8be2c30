"""Merge + verify throughput and peak memory, against a Hugging Face `datasets` pipeline.

Synthetic input shaped like the seed's merged set: 9 tokenized sources, 37,312 records, about
87.8 M tokens, log-normal lengths with different means per source (short math, long agentic and
long-context sources), Kimi-sized vocabulary (163,840), multi-turn loss masks. Generated once
and cached under .cache/bench-merge/.

Each pipeline step runs in its own child process; its peak RSS comes from os.wait4's rusage.
- ours: `eagle3 merge` (seeded external shuffle, dedup, truncation, manifest, index) then
  `eagle3 verify` (every record, index, order, totals, sha256);
- peer (how SpecForge prepares data): datasets.load_dataset("json") -> shuffle(seed) -> map
  (truncate) -> to_json, then a check pass: sha256 of the output and load_dataset of it, summing
  lengths.

Usage: python bench/bench_merge.py [--records 37312] [--tokens 87.8e6] [--skip-peer]
Writes bench/results/merge.json and prints the figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from machine_info import describe, save_result  # noqa: E402  (bench/ is sys.path[0] as a script)

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "bench-merge"
RESULTS = REPO / "bench" / "results" / "merge.json"
VOCAB = 163_840
MAX_LEN = 32_768
SEED = 1234

# name, share of records, median length, log-normal sigma
SOURCES = [
    ("sharegpt_regen", 0.24, 1500, 0.9),
    ("ultrachat_regen", 0.21, 1700, 0.7),
    ("magpie", 0.13, 1200, 0.8),
    ("opc_code", 0.11, 2100, 0.9),
    ("gsm8k", 0.09, 450, 0.5),
    ("tool_agent", 0.08, 3800, 1.0),
    ("multilingual", 0.07, 1400, 0.8),
    ("long_context", 0.04, 9000, 0.8),
    ("reasoning", 0.03, 6500, 0.6),
]


# -- synthetic data ----------------------------------------------------------------------------


def _lengths(rng, n_total: int, tokens: float):
    import numpy as np

    counts = [int(round(share * n_total)) for _, share, _, _ in SOURCES]
    counts[0] += n_total - sum(counts)
    raw = [
        np.clip(rng.lognormal(np.log(med), sig, size=c), 24, 40_000)
        for (_, _, med, sig), c in zip(SOURCES, counts, strict=True)
    ]
    # Scale so that the total after truncation to MAX_LEN is the target (a few passes converge).
    scale = 1.0
    for _ in range(20):
        total = sum(
            np.minimum(np.maximum((r * scale).astype(np.int64), 24), MAX_LEN).sum() for r in raw
        )
        scale *= tokens / total
    return [np.maximum((r * scale).astype(np.int64), 24) for r in raw]


def _record_line(rng, rid: str, source: str, n: int, id_perm) -> bytes:
    import numpy as np

    # Ids: 70 % Zipf-ranked frequent tokens (mapped through a permutation of the low ids, as BPE
    # gives frequent merges low ids), 30 % spread over the whole vocabulary.
    ranks = np.minimum(rng.zipf(1.15, size=n), len(id_perm)) - 1
    ids = np.where(rng.random(n) < 0.7, id_perm[ranks], rng.integers(0, VOCAB, size=n))
    # Masks: alternating prompt (0) / response (1) segments, prompt first, ~35 % prompt tokens.
    turns = int(rng.integers(1, 6))
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(2 * turns - 1, n - 1), replace=False))
    mask = np.zeros(n, dtype=np.uint8)
    bounds = np.concatenate(([0], cuts, [n]))
    for k in range(1, len(bounds) - 1, 2):
        mask[bounds[k] : bounds[k + 1]] = 1
    if not mask[:-1].any():  # keep one trainable token before the last
        mask[0] = 1
    mask_text = np.full(2 * n - 1, ord(","), dtype=np.uint8)
    mask_text[0::2] = mask + ord("0")
    return b"".join(
        (
            b'{"id":"',
            rid.encode(),
            b'","source":"',
            source.encode(),
            b'","input_ids":[',
            ",".join(map(str, ids.tolist())).encode(),
            b'],"loss_mask":[',
            mask_text.tobytes(),
            b"]}\n",
        )
    )


def ensure_inputs(records: int, tokens: float) -> list[Path]:
    import numpy as np

    key = hashlib.sha256(
        json.dumps([records, tokens, SOURCES, VOCAB, MAX_LEN, 4]).encode()
    ).hexdigest()[:12]
    root = CACHE / f"input-{key}"
    paths = [root / f"{name}.jsonl" for name, *_ in SOURCES]
    if (root / "done").exists():
        return paths
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    rng = np.random.default_rng(SEED)
    id_perm = rng.permutation(40_000)
    t0 = time.time()
    for (name, *_), lens, path in zip(SOURCES, _lengths(rng, records, tokens), paths, strict=True):
        with open(path, "wb", buffering=1 << 22) as f:
            for i, n in enumerate(lens.tolist()):
                f.write(_record_line(rng, f"{name}-{i:06d}", name, n, id_perm))
        print(f"  generated {path.name}: {len(lens)} records", file=sys.stderr)
    (root / "done").write_text(f"{time.time() - t0:.1f}s\n")
    return paths


# -- peer pipeline (runs in a child process) ---------------------------------------------------


def peer_merge(inputs: list[str], out: str, cache_dir: str) -> None:
    from datasets import load_dataset

    ds = load_dataset("json", data_files=inputs, split="train", cache_dir=cache_dir)
    ds = ds.shuffle(seed=SEED)

    def truncate(batch):
        return {
            "input_ids": [ids[:MAX_LEN] for ids in batch["input_ids"]],
            "loss_mask": [m[:MAX_LEN] for m in batch["loss_mask"]],
        }

    ds = ds.map(truncate, batched=True, batch_size=256)
    ds.to_json(out, lines=True)


def peer_verify(out: str, cache_dir: str) -> None:
    from datasets import load_dataset

    h = hashlib.sha256()
    with open(out, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    ds = load_dataset("json", data_files=[out], split="train", cache_dir=cache_dir)
    tokens = bad = 0
    for batch in ds.iter(batch_size=512):
        for ids, mask in zip(batch["input_ids"], batch["loss_mask"], strict=True):
            tokens += len(ids)
            bad += len(ids) != len(mask)
    print(json.dumps({"records": len(ds), "tokens": tokens, "bad": bad, "sha256": h.hexdigest()}))


# -- measurement -------------------------------------------------------------------------------


def _tree_rss_kb(root: int) -> int:
    """Summed RSS of root and all its descendants (from /proc), in KiB."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            status = Path(f"/proc/{d}/status").read_text()
        except OSError:
            continue
        parents[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
        m = next((ln for ln in status.splitlines() if ln.startswith("VmRSS:")), None)
        rss[int(d)] = int(m.split()[1]) if m else 0
    tree, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p and c not in tree]
        tree.update(kids)
        frontier.extend(kids)
    return sum(rss.get(p, 0) for p in tree)


def measure_rss(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, object]:
    """Run cmd as a child: wall and CPU seconds, the largest process's peak RSS (os.wait4's
    rusage, which covers the child and its waited-for descendants) and the peak of the summed RSS
    of the whole process tree (sampled every 50 ms: our merge/verify run worker processes)."""
    t0 = time.perf_counter()
    peak_tree = 0
    with open(CACHE / "child.out", "wb") as out, open(CACHE / "child.err", "wb") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=err)
        stop = threading.Event()

        def sample() -> None:
            nonlocal peak_tree
            while not stop.wait(0.05):
                peak_tree = max(peak_tree, _tree_rss_kb(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        stop.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    stdout = (CACHE / "child.out").read_text()
    stderr = (CACHE / "child.err").read_text()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stderr[-3000:]}")
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "peak_tree_rss_mb": round(peak_tree / 1024, 1),
        "stdout": stdout,
        "stderr": stderr,
    }


def result_line(stderr: str) -> dict:
    lines = [
        ln for ln in stderr.splitlines() if ln.startswith("@@eagle3 ") and '"kind":"result"' in ln
    ]
    return json.loads(lines[-1][len("@@eagle3 ") :])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=37_312)
    ap.add_argument("--tokens", type=float, default=87.8e6)
    ap.add_argument("--memory-mb", type=float, default=512)
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="runs of ours; the fastest is reported")
    ap.add_argument(
        "--small-memory-mb",
        type=float,
        default=64,
        help="also merge once with this budget (0: skip) and check the bytes are the same",
    )
    ap.add_argument("--peer-merge", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--peer-verify", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer_merge:
        *inputs, out, cache_dir = args.peer_merge
        peer_merge(inputs, out, cache_dir)
        return 0
    if args.peer_verify:
        peer_verify(*args.peer_verify)
        return 0

    inputs = ensure_inputs(args.records, args.tokens)
    load_before = list(os.getloadavg())  # the box may be shared: record how busy it was
    input_bytes = sum(p.stat().st_size for p in inputs)
    work = CACHE / "run"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    py = sys.executable
    try:
        merge_cmd = [py, "-m", "remote_agent.eagle3", "merge", *map(str, inputs)]
        merge_cmd += ["--out", str(work / "merged.jsonl"), "--max-len", str(MAX_LEN)]
        merge_cmd += ["--seed", str(SEED), "--memory-mb", str(args.memory_mb)]
        verify_cmd = [py, "-m", "remote_agent.eagle3", "verify", str(work / "merged.jsonl")]
        verify_cmd += ["--vocab-size", str(VOCAB)]
        # The box may be shared: repeat and keep the fastest run (all runs are recorded).
        runs = []
        for _ in range(args.repeat):
            m, v = measure_rss(merge_cmd, env), measure_rss(verify_cmd, env)
            runs.append((m, v))
            print(f"  run: merge {m['wall_s']} s, verify {v['wall_s']} s", file=sys.stderr)
        merge, verify = min(runs, key=lambda mv: mv[0]["wall_s"] + mv[1]["wall_s"])
        merged = result_line(merge["stderr"])
        small = None
        if args.small_memory_mb:
            cmd = [
                *merge_cmd[: merge_cmd.index("--memory-mb")],
                "--memory-mb",
                str(args.small_memory_mb),
            ]
            cmd[cmd.index("--out") + 1] = str(work / "small.jsonl")
            m = measure_rss(cmd, env)
            r = result_line(m["stderr"])
            small = {
                "memory_budget_mb": args.small_memory_mb,
                "wall_s": m["wall_s"],
                "cpu_s": m["cpu_s"],
                "peak_rss_mb": m["peak_rss_mb"],
                "peak_tree_rss_mb": m["peak_tree_rss_mb"],
                "shuffle": r["shuffle"],
                "same_bytes_as_default_budget": r["sha256"] == merged["sha256"],
            }
            (work / "small.jsonl").unlink()
        verified = result_line(verify["stderr"])
        assert verified["ok"] and verified["sha256"] == merged["sha256"]
        in_tokens = merged["tokens"]  # tokens written (input tokens minus truncation)
        ours_wall = merge["wall_s"] + verify["wall_s"]
        ours = {
            "merge_wall_s": merge["wall_s"],
            "merge_cpu_s": merge["cpu_s"],
            "merge_peak_rss_mb": merge["peak_rss_mb"],
            "merge_peak_tree_rss_mb": merge["peak_tree_rss_mb"],
            "verify_wall_s": verify["wall_s"],
            "verify_cpu_s": verify["cpu_s"],
            "verify_peak_rss_mb": verify["peak_rss_mb"],
            "verify_peak_tree_rss_mb": verify["peak_tree_rss_mb"],
            "tokens_per_s": round(in_tokens / ours_wall),
            "merge_tokens_per_s": round(in_tokens / merge["wall_s"]),
            "verify_tokens_per_s": round(in_tokens / verify["wall_s"]),
            "peak_rss_mb": max(merge["peak_rss_mb"], verify["peak_rss_mb"]),
            "peak_tree_rss_mb": max(merge["peak_tree_rss_mb"], verify["peak_tree_rss_mb"]),
            "workers": merged["workers"],
            "shuffle": merged["shuffle"],
            "runs_wall_s": [[m["wall_s"], v["wall_s"]] for m, v in runs],
            "tokens_per_cpu_s": round(merged["tokens"] / (merge["cpu_s"] + verify["cpu_s"])),
        }
        peer = None
        if not args.skip_peer:
            hf_cache = work / "hf-cache"
            peer_env = {
                **env,
                "HF_DATASETS_CACHE": str(hf_cache),
                "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
            }
            pm = measure_rss(
                [
                    py,
                    __file__,
                    "--peer-merge",
                    *map(str, inputs),
                    str(work / "peer.jsonl"),
                    str(hf_cache),
                ],
                peer_env,
            )
            shutil.rmtree(
                hf_cache, ignore_errors=True
            )  # the check pass must not reuse the arrow cache
            pv = measure_rss(
                [py, __file__, "--peer-verify", str(work / "peer.jsonl"), str(hf_cache)], peer_env
            )
            checked = json.loads(pv["stdout"].strip().splitlines()[-1])
            peer_wall = pm["wall_s"] + pv["wall_s"]
            peer = {
                "merge_wall_s": pm["wall_s"],
                "merge_cpu_s": pm["cpu_s"],
                "merge_peak_rss_mb": pm["peak_rss_mb"],
                "merge_peak_tree_rss_mb": pm["peak_tree_rss_mb"],
                "verify_wall_s": pv["wall_s"],
                "verify_cpu_s": pv["cpu_s"],
                "verify_peak_rss_mb": pv["peak_rss_mb"],
                "verify_peak_tree_rss_mb": pv["peak_tree_rss_mb"],
                "tokens_per_s": round(checked["tokens"] / peer_wall),
                "tokens_per_cpu_s": round(checked["tokens"] / (pm["cpu_s"] + pv["cpu_s"])),
                "peak_rss_mb": max(pm["peak_rss_mb"], pv["peak_rss_mb"]),
                "peak_tree_rss_mb": max(pm["peak_tree_rss_mb"], pv["peak_tree_rss_mb"]),
                "records": checked["records"],
                "tokens": checked["tokens"],
                "output_bytes": (work / "peer.jsonl").stat().st_size,
            }
        result = {
            "benchmark": "merge+verify",
            "machine": describe(),
            "data": {
                "sources": len(inputs),
                "input_records": args.records,
                "records": merged["records"],
                "tokens": merged["tokens"],
                "trainable_tokens": merged["trainable_tokens"],
                "input_bytes": input_bytes,
                "input_mb": round(input_bytes / 2**20, 1),
                "max_len": MAX_LEN,
                "vocab": VOCAB,
            },
            "memory_budget_mb": args.memory_mb,
            "merge_with_small_budget": small,
            "ours": ours,
            "peer_hf_datasets": peer,
            "ratios": None
            if peer is None
            else {
                "tokens_per_s": round(ours["tokens_per_s"] / peer["tokens_per_s"], 2),
                "peak_rss": round(ours["peak_rss_mb"] / peer["peak_rss_mb"], 3),
                "peak_tree_rss": round(ours["peak_tree_rss_mb"] / peer["peak_tree_rss_mb"], 3),
                "tokens_per_cpu_s": round(ours["tokens_per_cpu_s"] / peer["tokens_per_cpu_s"], 2),
            },
            "load_average_before": load_before,
            "load_average_after": list(os.getloadavg()),
            "goal": {"tokens_per_s": 3_000_000, "met": ours["tokens_per_s"] >= 3_000_000},
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save_result(RESULTS, result)
    d, o = result["data"], result["ours"]
    mb = d["input_mb"]
    print(
        f"data: {d['records']} records, {d['tokens'] / 1e6:.1f} M tokens, {mb} MiB JSONL, 9 sources"
    )
    for who, r in (("ours", o), ("peer", peer)):
        if r is None:
            continue
        print(
            f"{who}: merge {r['merge_wall_s']} s wall / {r['merge_cpu_s']} s cpu, peak RSS "
            f"{r['merge_peak_rss_mb']} MiB (process tree {r['merge_peak_tree_rss_mb']} MiB); verify "
            f"{r['verify_wall_s']} s / {r['verify_cpu_s']} s cpu, {r['verify_peak_rss_mb']} MiB (tree "
            f"{r['verify_peak_tree_rss_mb']} MiB) -> {r['tokens_per_s'] / 1e6:.2f} M tokens/s"
        )
    if peer:
        r = result["ratios"]
        print(
            f"ours/peer: {r['tokens_per_s']}x tokens/s, {r['tokens_per_cpu_s']}x tokens per CPU-s, "
            f"{r['peak_rss']}x peak RSS, {r['peak_tree_rss']}x process-tree RSS"
        )
    small = result["merge_with_small_budget"]
    if small:
        print(
            f"merge with a {small['memory_budget_mb']} MiB budget: {small['wall_s']} s, peak RSS "
            f"{small['peak_rss_mb']} MiB, {small['shuffle']['buckets']} buckets, same bytes: "
            f"{small['same_bytes_as_default_budget']}"
        )
    print(
        f"tokens per CPU-second: ours {o['tokens_per_cpu_s']:,}"
        + (f", peer {peer['tokens_per_cpu_s']:,}" if peer else "")
    )
    print(
        f"load average before {result['load_average_before']}, after {result['load_average_after']}"
    )
    print(f"wrote {RESULTS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
