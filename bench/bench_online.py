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
  sglang_version    the server's version, or "not run" with the reference producer

Run here (CPU, the HF reference producer, the tiny target):
    python3 bench/bench_online.py [--samples 48] [--epochs 2]
On the GPU box with the reference producer:   --device cuda [--preset gpu]
With real SGLang (the integrator's run; see docs/RUNBOOKS.md "Online training"): make the
offline dump with `eagle3 extract --server` against a server started EAGLE3_DUMP_MODE=dense,
restart it with EAGLE3_DUMP_MODE=stream EAGLE3_STREAM_ADDR=unix:RUN/stream.sock, then
    python3 bench/bench_online.py --device cuda --server http://127.0.0.1:30000 \
        --dump DUMP --dataset DATA.jsonl --target MODEL --stream unix:RUN/stream.sock
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from machine_info import describe, save_result  # noqa: E402

ENV = {
    **os.environ,
    "PYTHONPATH": str(REPO),
    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
}

TRAIN_CHILD = r"""
import json, resource, sys, time, torch
from remote_agent.eagle3.drafter import config as cm
from remote_agent.eagle3.drafter.train import train
cfg = cm.from_dict(json.load(open(sys.argv[1])))
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
    from remote_agent.eagle3.http_client import HttpClient

    return HttpClient(url, 30).get("/server_info")


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


def side(train_result: dict, tokens: int, disk: int, extra: dict) -> dict:
    wall = train_result["wall_s"]
    return {
        "tokens_per_s": round(tokens / wall, 1),
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument(
        "--preset", default="ci", help="tiny target preset (remote_agent/eagle3/tiny.py)"
    )
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--cache-gb", type=float, default=0.0, help="online disk cache ring")
    ap.add_argument("--server", help="a patched SGLang in stream mode (default: the reference)")
    ap.add_argument("--stream", help="with --server: the EAGLE3_STREAM_ADDR it was started with")
    ap.add_argument("--dump", type=Path, help="with --server: its offline dump of --dataset")
    ap.add_argument("--dataset", type=Path, help="with --server: the dataset (JSONL)")
    ap.add_argument("--target", type=Path, help="with --server: the model it serves")
    ap.add_argument("--work", type=Path, help="work directory (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "online.json")
    args = ap.parse_args()

    from remote_agent.eagle3.online import compare

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-online-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.server:
        if not (args.dump and args.dataset and args.target and args.stream):
            raise SystemExit("--server needs --dump, --dataset, --target and --stream")
        target, data, dump = args.target, args.dataset, args.dump
        extraction = {"wall_s": None, "note": "made beforehand with eagle3 extract --server"}
    else:
        from remote_agent.eagle3.tiny import ensure_tiny

        target = ensure_tiny(args.preset)
        vocab = json.loads((target / "config.json").read_text())["vocab_size"]
        lengths = [24 + (i * 37) % (args.max_tokens // 2) for i in range(args.samples)]
        data = compare.write_dataset(work / "data.jsonl", lengths, vocab, seed=7)
        dump = work / "dump"
        shutil.rmtree(dump, ignore_errors=True)
        extraction = child(DUMP_CHILD, str(target), str(data), str(dump), args.device,
                           log=work / "extract.log")  # fmt: skip
    from remote_agent.eagle3.data.records import DatasetIndex

    index = DatasetIndex.open(data)
    tokens = sum(min(index.length(s), args.max_tokens) for s in index.ids()) * args.epochs
    sections = {"data": {"max_tokens": args.max_tokens},
                "train": {"epochs": args.epochs, "device": args.device}}  # fmt: skip

    # offline: train from the dump
    off_run = work / "offline"
    shutil.rmtree(off_run, ignore_errors=True)
    (work / "offline.json").write_text(
        json.dumps(with_keys(compare.config(target, data, off_run, dump, **sections), target))
    )
    off = child(TRAIN_CHILD, str(work / "offline.json"), log=work / "offline.log")

    # online: the producer streams while the trainer trains
    on_run = work / "online"
    shutil.rmtree(on_run, ignore_errors=True)
    stream = args.stream or f"unix:{work}/stream.sock"
    producer = None
    if args.server:
        url = args.server
    else:
        producer, url = start_reference(target, stream, args.device, work / "producer.log")
    online = {"server": url, "listen": stream}
    if args.cache_gb:
        online.update(cache_gb=args.cache_gb, cache_dir=str(work / "cache"))
    cfg = with_keys(compare.config(target, data, on_run, None, **sections, online=online), target)
    (work / "online.json").write_text(json.dumps(cfg))
    try:
        on = child(TRAIN_CHILD, str(work / "online.json"), log=work / "online.log")
        info = server_info(url)
    finally:
        if producer is not None:
            producer.terminate()
            producer.wait(30)
    peak = {k: info[k] for k in ("max_rss_bytes", "cuda_max_memory_allocated") if k in info}
    stats = json.loads((on_run / "online-stats.json").read_text())

    diff = compare.max_abs_diff(compare.final_weights(on_run), compare.final_weights(off_run))
    losses_equal = compare.losses(on_run) == compare.losses(off_run)
    dump_bytes = tree_bytes(dump)
    result = {
        "bench": "online",
        "what": f"{args.samples} samples x {args.epochs} epochs, max_tokens {args.max_tokens}, "
        f"{'SGLang' if args.server else 'HF reference'} producer, tiny target {target.name}",
        "online": side(
            on,
            tokens,
            stats.get("cache_bytes_written", 0),
            {
                "end_to_end_s": round(on["wall_s"], 2),
                "producer_memory": peak,
                "stream": stats,
            },
        ),  # fmt: skip
        "offline": side(
            off,
            tokens,
            dump_bytes,
            {
                "end_to_end_s": round(off["wall_s"] + (extraction.get("wall_s") or 0), 2),
                "extraction_wall_s": extraction.get("wall_s"),
                "extractor_memory": {"max_rss_bytes": extraction.get("max_rss_bytes")},
            },
        ),  # fmt: skip
        "equal_to_offline": diff == 0.0 and losses_equal,
        "max_abs_diff_final_weights": diff,
        "losses_equal": losses_equal,
        "sglang_version": (server_info(url).get("version") if args.server else "not run"),
        "machine": describe(device=args.device),
    }
    print(json.dumps({k: result[k] for k in ("online", "offline")}, indent=1))
    print(
        f"online {result['online']['tokens_per_s']} tok/s, 0+{result['online']['disk_bytes_written']} B "
        f"on disk | offline {result['offline']['tokens_per_s']} tok/s, {dump_bytes} B dumped | "
        f"equal_to_offline {result['equal_to_offline']} (max abs diff {diff})"
    )
    save_result(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
