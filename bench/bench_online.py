"""Bench: online training (hidden states streamed from the producer) vs offline (dump, then train
from it), same samples, same order, same config.

Each side runs in its own process, measured separately: the producer (`eagle3 stream-reference`,
or a patched SGLang server), the extractor (offline dump) and each trainer. Printed and written
to bench/results/online.json:

  online / offline  tokens_per_s        trained tokens / the training process's wall time
                    end_to_end_s        offline: extraction + training; online: training (the
                                        producer computes while the trainer trains)
                    disk_bytes_written  offline: the dump's bytes; online: 0, or the cache's
                    accept_length       simulated chain acceptance (sim_accept_len) of the last
                                        training window (the drafter's, serving config 3/1/4)
                    memory              peak RSS (and CUDA peak) of each process
  equal_to_offline  final weights and per-step losses identical; max_abs_diff_final_weights
  equal_on_first_forwards  identical through the first epoch, the first difference opening a
                    later one whose rows the server computed again (rows_again_vs_first_forward
                    counts those that changed), later losses within 1e-3 (compare.py); with
                    --server the bench exits 1 unless one of the two holds
  sglang_version    the server's version, or "not run" with the reference producer

Run here (CPU, the HF reference producer, the tiny target):
    python3 bench/bench_online.py [--samples 48] [--epochs 2]
On the GPU box with the reference producer:   --device cuda [--preset gpu]
With real SGLang (the Kimi check, runbooks/gpu-sglang-check-kimi.yaml step online-bench): the
extraction server runs with EAGLE3_DUMP_MODE=both EAGLE3_STREAM_ADDR=unix:RUN/stream.sock, so
one server start serves the extraction and this bench:
    python3 bench/bench_online.py --device cuda --server http://127.0.0.1:30000 \
        --stream unix:RUN/stream.sock --dump DUMP --dataset DATA.jsonl --target MODEL
Here the first --samples records of DATA are renamed (a fresh id prefix), streamed to the
online trainer and, by the same forwards, dumped by the server (mode both); the offline trainer
trains from the shards the server wrote for them, moved out of DUMP (which is left as the
extraction made it). Same forwards, same bytes: equal bit for bit through the first epoch; each
later epoch is a second forward, which SGLang need not repeat bit for bit. The
rows are also compared with the extraction's own dump of the same samples
(`sglang_rows_vs_extraction`: does the server's batching change them?).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STALE = re.compile(r"online[0-9a-f]{6}-").match  # the renamed ids of any earlier attempt
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from machine_info import describe, save_result  # noqa: E402

ENV = {
    **os.environ,
    "PYTHONPATH": str(REPO),
    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    # cuBLAS reproducible run to run (both trainers must be equal bit for bit on the GPU too)
    "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8"),
}

TRAIN_CHILD = r"""
import json, resource, sys, time, torch
from remote_agent.eagle3.drafter.train import config as cm
from remote_agent.eagle3.drafter.train.loop import train
cfg = cm.from_dict(json.load(open(sys.argv[1])))
if cfg.train.device != "cpu":  # deterministic kernels where torch has them (warn elsewhere)
    torch.use_deterministic_algorithms(True, warn_only=True)
t0 = time.perf_counter()
result = train(cfg)
result["wall_s"] = time.perf_counter() - t0
result["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if torch.cuda.is_available() and cfg.train.device != "cpu":
    result["cuda_max_memory_allocated"] = torch.cuda.max_memory_allocated()
print("BENCH_RESULT " + json.dumps(result), flush=True)
"""

DUMP_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from remote_agent.eagle3.online import compare
t0 = time.perf_counter()
out = compare.offline_dump(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
out["wall_s"] = time.perf_counter() - t0
out["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print("BENCH_RESULT " + json.dumps(out), flush=True)
"""


def child(script: str, *args: str, log: Path) -> dict:
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, "-c", script, *args], env=ENV, stdout=subprocess.PIPE,
                              stderr=f, text=True, check=False)  # fmt: skip
    lines = [x for x in proc.stdout.splitlines() if x.startswith("BENCH_RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"child failed (rc {proc.returncode}); see {log}")
    return json.loads(lines[-1].removeprefix("BENCH_RESULT "))


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_info(url: str) -> dict:
    """/server_info (SGLang 0.5.23, the reference producer), else /get_server_info (0.5.14)."""
    from remote_agent.eagle3.extraction.server import Http
    from remote_agent.eagle3.extraction.server import server_info as read

    return read(Http(url, timeout=30))


def producer_memory(info: dict) -> dict:
    """What the producer says of its memory: the reference's peaks, SGLang's memory_usage."""
    out = {k: info[k] for k in ("max_rss_bytes", "cuda_max_memory_allocated") if k in info}
    states = info.get("internal_states")
    first = states[0] if isinstance(states, list) and states else None
    if isinstance(first, dict) and "memory_usage" in first:
        out["sglang_memory_usage_gb"] = first["memory_usage"]
    if "mem_fraction_static" in info:
        out["mem_fraction_static"] = info["mem_fraction_static"]
    return out


def start_reference(target: Path, stream: str, device: str, log: Path):
    port = free_port()
    cmd = [sys.executable, "-m", "remote_agent.eagle3", "stream-reference", "--model", str(target),
           "--stream", stream, "--port", str(port), "--device", device]  # fmt: skip
    proc = subprocess.Popen(cmd, env=ENV, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 300
    while time.monotonic() < end:
        try:
            server_info(url)
            return proc, url
        except Exception:
            if proc.poll() is not None:
                raise SystemExit(f"the reference producer exited; see {log}") from None
            time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"the reference producer did not come up; see {log}")


def with_keys(cfg: dict, target: Path) -> dict:
    cfg["target"].update(wrapper_keys(target))
    return cfg


def wrapper_keys(target: Path) -> dict:
    """A multimodal wrapper (Kimi-K2.5's KimiK25ForConditionalGeneration) keeps the text model's
    lm_head and embeddings under `language_model.`: name them, as the Kimi configs do."""
    if "text_config" in json.loads((Path(target) / "config.json").read_text()):
        return {"lm_head_key": "language_model.lm_head.weight",
                "embed_key": "language_model.model.embed_tokens.weight"}  # fmt: skip
    return {}


def steady_tokens_per_s(run_dir: Path) -> float | None:
    """The trainer's own rate after its first step (start-up and compilation left out)."""
    import statistics

    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    rates = [json.loads(x).get("tokens_per_s") for x in path.read_text().splitlines()[1:] if x]
    rates = [r for r in rates if r]
    return round(statistics.median(rates), 1) if rates else None


def side(train_result: dict, tokens: int, disk: int, run_dir: Path, extra: dict) -> dict:
    wall = train_result["wall_s"]
    return {
        "tokens_per_s": round(tokens / wall, 1),
        "steady_tokens_per_s": steady_tokens_per_s(run_dir),
        "train_wall_s": round(wall, 2),
        "disk_bytes_written": disk,
        "accept_length": train_result.get("sim_accept_len"),
        "final_loss": train_result.get("loss"),
        "trainer_memory": {
            k: train_result[k]
            for k in ("max_rss_bytes", "cuda_max_memory_allocated")
            if k in train_result
        },
        **extra,
    }


def same_forward_dump(args, work: Path, url: str, expected: set[str], names: dict[str, str],
                      prefix: str, strict: bool = True) -> tuple[Path, int, dict]:  # fmt: skip
    """After the online run: seal the server's buffered shard, wait for the streamed samples'
    shards, and move them out of --dump into work/dump (the offline trainer's dump), whatever
    happened: --dump is left as the extraction made it. Returns (dump, its shard bytes, the rows
    compared with the extraction's own dump of the same samples). strict=False (the online run
    failed): a short wait, then move what is there."""
    from remote_agent.eagle3.online import compare

    missing = expected
    try:
        compare.flush_dump(url, args.rid_prefix, 1)
        missing = compare.wait_dumped(args.dump, expected, args.dump_wait_s if strict else 10)
    finally:
        dump = work / "dump"
        shutil.rmtree(dump, ignore_errors=True)
        moved = compare.take_shards(args.dump, dump, lambda i: i.startswith(prefix))
    if missing and strict:
        hint = (
            "start it with EAGLE3_DUMP_MODE=both (dense and stream) and "
            f"EAGLE3_DUMP_DIR={args.dump}"
            if len(missing) == len(expected)
            else "see its log"
        )
        raise SystemExit(
            f"the server at {url} dumped {len(expected) - len(missing)} of the "
            f"{len(expected)} streamed samples within {args.dump_wait_s:g}s ({hint}); "
            f"missing e.g. {sorted(missing)[:3]}"
        )
    rows = compare.rows_diff(dump, args.dump, {m: names[m] for m in moved if m in names})
    return dump, tree_bytes(dump / "shards"), rows


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument(
        "--preset", default="ci", help="tiny target preset (remote_agent/eagle3/tiny/deepseek.py)"
    )
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--cache-gb", type=float, default=0.0, help="online disk cache ring")
    ap.add_argument("--server", help="a patched SGLang in EAGLE3_DUMP_MODE=both (default: the "
                    "HF reference producer)")  # fmt: skip
    ap.add_argument("--stream", help="with --server: the EAGLE3_STREAM_ADDR it was started with")
    ap.add_argument("--dump", type=Path, help="with --server: its EAGLE3_DUMP_DIR")
    ap.add_argument("--dataset", type=Path, help="with --server: the dataset (JSONL)")
    ap.add_argument("--target", type=Path, help="with --server: the model it serves")
    ap.add_argument("--rid-prefix", default="dump-", help="with --server: its dump rid prefix")
    ap.add_argument("--dump-wait-s", type=float, default=120.0)
    ap.add_argument("--producer-wait-s", type=float, default=180.0,
                    help="online trainer: give up after this long without a sample (a server's "
                    "first forwards may compile kernels)")  # fmt: skip
    ap.add_argument("--compile", action="store_true",
                    help="on CUDA: the trainer's compiled layer and flex attention (default: "
                    "eager, chunked attention: a short bench, no minutes of compilation)")  # fmt: skip
    ap.add_argument("--sweep-only", action="store_true",
                    help="with --dump: only move the bench's renamed samples (a killed attempt's) "
                    "out of it into WORK/stale-dump, and exit")  # fmt: skip
    ap.add_argument("--work", type=Path, help="work directory (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "online.json")
    args = ap.parse_args()
    # a step timeout's SIGTERM unwinds (the finally below leaves --dump as it was)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    import uuid

    from remote_agent.eagle3.online import compare

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-online-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.sweep_only:  # the runbook's clean-dump step, before the training steps read --dump
        if args.dump is None:
            raise SystemExit("--sweep-only needs --dump")
        swept = compare.take_shards(args.dump, work / "stale-dump", STALE)
        print(f"{args.dump}: {len(swept)} sample(s) of an earlier bench attempt moved out")
        return 0
    names: dict[str, str] = {}
    prefix = ""
    if args.server:
        if not (args.dump and args.dataset and args.target and args.stream):
            raise SystemExit("--server needs --dump, --dataset, --target and --stream")
        target = args.target
        # shards a killed earlier attempt left in the server's dump go (they would fail the
        # training steps that read it next: samples not in their dataset); first the server
        # seals what it still buffers of that attempt, or it would share a shard with this one's
        compare.flush_dump(args.server, args.rid_prefix, 1)
        compare.settle(args.dump)
        compare.take_shards(args.dump, work / "stale-dump", STALE)
        # a fresh prefix per attempt: the server remembers every id it dumped (a rerun of the
        # same ids would be skipped as duplicates, and stream with no dump behind it)
        prefix = f"online{uuid.uuid4().hex[:6]}-"
        data = work / "data.jsonl"
        names = compare.renamed_subset(args.dataset, data, args.samples, prefix)
        dump = None  # the server writes it during the online run
        extraction: dict = {"wall_s": None}
    else:
        from remote_agent.eagle3.tiny.cache import ensure_tiny

        target = ensure_tiny(args.preset)
        vocab = json.loads((target / "config.json").read_text())["vocab_size"]
        lengths = [24 + (i * 37) % (args.max_tokens // 2) for i in range(args.samples)]
        data = compare.write_dataset(work / "data.jsonl", lengths, vocab, seed=7)
        dump = work / "dump"
        shutil.rmtree(dump, ignore_errors=True)
        extraction = child(DUMP_CHILD, str(target), str(data), str(dump), args.device,
                           log=work / "extract.log")  # fmt: skip
    from remote_agent.eagle3.data.records import DatasetIndex
    from remote_agent.eagle3.drafter.train import config as config_mod
    from remote_agent.eagle3.drafter.train.data import is_holdout

    index = DatasetIndex.open(data)
    tokens = sum(min(index.length(s), args.max_tokens) for s in index.ids()) * args.epochs
    train_opts: dict = {"epochs": args.epochs, "device": args.device}
    if args.device != "cpu" and not args.compile:
        train_opts.update(compile=False, attention="chunked")
    sections = {"data": {"max_tokens": args.max_tokens}, "train": train_opts}

    def offline_run(dump_dir: Path, name: str = "offline") -> dict:
        run = work / name
        shutil.rmtree(run, ignore_errors=True)
        cfg = with_keys(compare.config(target, data, run, dump_dir, **sections), target)
        (work / f"{name}.json").write_text(json.dumps(cfg))
        return child(TRAIN_CHILD, str(work / f"{name}.json"), log=work / f"{name}.log")

    # offline first where the dump exists (the reference); with --server after the online run,
    # whose forwards write it
    off = offline_run(dump) if dump is not None else None

    # online: the producer streams while the trainer trains
    on_run = work / "online"
    shutil.rmtree(on_run, ignore_errors=True)
    stream = args.stream or f"unix:{work}/stream.sock"
    producer = None
    if args.server:
        url = args.server
    else:
        producer, url = start_reference(target, stream, args.device, work / "producer.log")
    # a producer that never connects fails the bench in minutes, not the trainer's 15 (default)
    online = {"server": url, "listen": stream, "rid_prefix": args.rid_prefix,
              "compare_reforwards": True,  # rows_again_vs_first_forward
              "producer_wait_s": args.producer_wait_s, "sample_timeout_s": 60.0}  # fmt: skip
    if args.cache_gb:
        online.update(cache_gb=args.cache_gb, cache_dir=str(work / "cache"))
    cfg = with_keys(compare.config(target, data, on_run, None, **sections, online=online), target)
    (work / "online.json").write_text(json.dumps(cfg))
    holdout = config_mod.from_dict(cfg).data.holdout_fraction
    expected = {  # what the online trainer asks the server for (OnlinePlan's samples)
        i for i in index.ids() if index.length(i) >= 3 and not is_holdout(i, holdout)
    }
    rows: dict | None = None
    dump_bytes, ok = 0, False
    try:
        on = child(TRAIN_CHILD, str(work / "online.json"), log=work / "online.log")
        info = server_info(url)
        ok = True
    finally:
        if producer is not None:
            producer.terminate()
            producer.wait(30)
        if args.server:  # always: --dump must be left as the extraction made it
            dump, dump_bytes, rows = same_forward_dump(
                args, work, url, expected, names, prefix, strict=ok
            )
    assert dump is not None
    if off is None:
        off = offline_run(dump)
    else:
        dump_bytes = tree_bytes(dump)
    stats = json.loads((on_run / "online-stats.json").read_text())

    diff = compare.max_abs_diff(
        compare.final_weights(on_run), compare.final_weights(work / "offline")
    )
    on_losses, off_losses = compare.losses(on_run), compare.losses(work / "offline")
    losses_equal = on_losses == off_losses
    first = compare.first_difference(on_losses, off_losses)
    if first is not None:  # epoch 1 equal and epoch 2 apart: the producer's second forward
        first.update(compare.locate(work / "offline", first["step"]))
    repeat = None
    if diff != 0.0 or not losses_equal:  # the trainer itself, run twice on the same dump: is
        offline_run(dump, "offline-repeat")  # the difference the stream's or the device's?
        again = work / "offline-repeat"
        repeat = {
            "max_abs_diff_final_weights": compare.max_abs_diff(
                compare.final_weights(again), compare.final_weights(work / "offline")
            ),
            "losses_equal": compare.losses(again) == off_losses,
        }
    result = {
        "bench": "online",
        "what": f"{len(index)} samples x {args.epochs} epochs, max_tokens {args.max_tokens}, "
        f"{'SGLang' if args.server else 'HF reference'} producer, target {target}",
        "online": side(
            on,
            tokens,
            stats.get("cache_bytes_written", 0),
            on_run,
            {
                "end_to_end_s": round(on["wall_s"], 2),
                "producer_memory": producer_memory(info),
                "stream": stats,
            },
        ),
        "offline": side(
            off,
            tokens,
            dump_bytes,
            work / "offline",
            {
                "end_to_end_s": (
                    round(off["wall_s"] + extraction["wall_s"], 2)
                    if extraction.get("wall_s")
                    else None
                ),
                "extraction_wall_s": extraction.get("wall_s"),
                "extractor_memory": {"max_rss_bytes": extraction.get("max_rss_bytes")},
            },
        ),
        "equal_to_offline": diff == 0.0 and losses_equal,
        # bit for bit on the same forwards, a later epoch's re-forward within LATER_EPOCH_REL_TOL
        "equal_on_first_forwards": compare.equal_on_first_forwards(
            on_losses, off_losses, first, stats.get("reforwards") or {}
        ),
        "max_abs_diff_final_weights": diff,
        "losses_equal": losses_equal,
        # where online (a) and offline (b) part: step 1 = inputs or kernels, later = growth
        "first_loss_difference": first,
        "offline_run_to_run": repeat,  # only when online and offline differ
        # each later epoch asks the producer again: were a sample's rows its first forward's?
        "rows_again_vs_first_forward": stats.get("reforwards"),
        "sglang_version": info.get("version") if args.server else "not run",
        "trainer": "eager, chunked attention" if "compile" in train_opts else "default options",
        "measures": {
            "tokens_per_s": "trained tokens / the training process's wall time (start-up, and "
            "online the wait for the producer, included); steady_tokens_per_s: the trainer's own "
            "median rate after its first step",
            "accept_length": "simulated chain acceptance (sim_accept_len, 3 steps, topk 1) of "
            "the last training window; equal weights serve equal acceptance",
        },
        "machine": describe(device=args.device),
    }
    if args.server:
        result["offline_dump"] = (
            "written by the server from the same forwards that fed the stream "
            "(EAGLE3_DUMP_MODE=both); its extraction time is the producer's, inside the online run"
        )
        result["sglang_rows_vs_extraction"] = rows
        result["sglang_server"] = {k: info.get(k) for k in ("model_path", "tp_size",
                                   "speculative_algorithm", "attention_backend")}  # fmt: skip
    print(json.dumps({k: result[k] for k in ("online", "offline")}, indent=1))
    print(
        f"online {result['online']['tokens_per_s']} tok/s, 0+{result['online']['disk_bytes_written']} B "
        f"on disk | offline {result['offline']['tokens_per_s']} tok/s, {dump_bytes} B dumped | "
        f"equal_to_offline {result['equal_to_offline']} (max abs diff {diff}; on the first "
        f"forwards {result['equal_on_first_forwards']}) | "
        f"sglang {result['sglang_version']}"
    )
    save_result(args.out, result)
    print(f"wrote {args.out}")
    ok = result["equal_to_offline"] or result["equal_on_first_forwards"]
    return 0 if ok or not args.server else 1


if __name__ == "__main__":
    sys.exit(main())
