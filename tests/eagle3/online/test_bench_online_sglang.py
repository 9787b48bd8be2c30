"""bench/bench_online.py against a server in EAGLE3_DUMP_MODE=both (issue 30's GPU measurement,
step `online-bench` of runbooks/gpu-sglang-check-kimi.yaml), on CPU: the extraction's server is
the one stand-in (tests/eagle3/extraction/eagle3_standins.py: HTTP and ForwardBatch fake, the
hook package, the tiny model's states, the clients and the trainers real).

The bench renames a subset of the dataset, streams it to the online trainer, takes the shards
the server dumped for the same forwards as the offline dump, and leaves the extraction's dump as
it was (the training steps after it read that dump with the merged dataset)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.support.paths import REPO  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "eagle3" / "extraction"))
from eagle3_standins import FakeSGLang, load_hook_package, write_dataset  # noqa: E402

from remote_agent.eagle3.cli import main  # noqa: E402
from remote_agent.eagle3.dense import DumpMeta, DumpReader, ShardWriter, init_dump_dir  # noqa: E402
from remote_agent.eagle3.online import compare  # noqa: E402

LENGTHS = [12, 40, 17, 33, 21, 9, 28, 16, 19, 37, 24, 14]


def _dump(root: Path, shards: list[list[str]], seed: int = 0) -> Path:
    """A dense dump with one shard per id list (rows from `seed`)."""
    meta = DumpMeta("m", 8, 8, [2, 4, 5])
    init_dump_dir(root, meta)
    g = torch.Generator().manual_seed(seed)
    for ids in shards:
        with ShardWriter(root, meta, shard_bytes=1 << 30) as w:
            for sid in ids:
                n = 5
                w.add(sid, torch.arange(n, dtype=torch.int32),
                      torch.randn(n, 24, generator=g).bfloat16(),
                      torch.randn(n, 8, generator=g).bfloat16())  # fmt: skip
    return root


def test_renamed_subset_keeps_records_under_new_ids(tmp_path):
    data = write_dataset(tmp_path / "d.jsonl", [5, 6, 7, 8])
    names = compare.renamed_subset(data, tmp_path / "sub.jsonl", 3, "onlineabc123-")
    assert names == {f"onlineabc123-s000{i}": f"s000{i}" for i in range(3)}
    old = [json.loads(x) for x in data.read_text().splitlines()]
    new = [json.loads(x) for x in (tmp_path / "sub.jsonl").read_text().splitlines()]
    assert [r["input_ids"] for r in new] == [r["input_ids"] for r in old[:3]]
    assert (tmp_path / "sub.manifest.json").exists()


def test_take_shards_moves_only_whole_shards_of_the_bench(tmp_path):
    dump = _dump(tmp_path / "dump", [["a", "b"], ["x-1", "x-2"], ["x-3"]])
    before = DumpReader(dump).ids()
    moved = compare.take_shards(dump, tmp_path / "mine", lambda i: i.startswith("x-"))
    assert sorted(moved) == ["x-1", "x-2", "x-3"]
    assert DumpReader(dump).ids() == ["a", "b"] and sorted(DumpReader(tmp_path / "mine").ids()) == [
        "x-1", "x-2", "x-3"]  # fmt: skip
    assert set(before) == {"a", "b", "x-1", "x-2", "x-3"}
    mixed = _dump(tmp_path / "mixed", [["a", "x-1"]])
    with pytest.raises(RuntimeError, match="mixes the bench's samples"):
        compare.take_shards(mixed, tmp_path / "m2", lambda i: i.startswith("x-"))
    assert compare.take_shards(tmp_path / "none", tmp_path / "m3", bool) == []


def test_sweep_only_moves_a_killed_attempts_samples_out(tmp_path):
    """The runbook's clean-dump step: what a SIGKILLed bench left in the extraction's dump goes
    (the training steps after it refuse samples not in their dataset); the rest stays."""
    dump = _dump(tmp_path / "dump", [["s1", "s2"], ["online1a2b3c-s1"], ["onlinezz-s3"]])
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_online.py"), "--sweep-only",
         "--dump", str(dump), "--work", str(tmp_path / "w")],
        env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(DumpReader(dump).ids()) == ["onlinezz-s3", "s1", "s2"]  # not a bench prefix
    assert DumpReader(tmp_path / "w" / "stale-dump").ids() == ["online1a2b3c-s1"]


def test_rows_diff_counts_bit_exact_samples(tmp_path):
    a = _dump(tmp_path / "a", [["x-1", "x-2"]], seed=1)
    b = _dump(tmp_path / "b", [["1", "2"]], seed=1)
    c = _dump(tmp_path / "c", [["1", "2"]], seed=2)
    same = compare.rows_diff(a, b, {"x-1": "1", "x-2": "2"})
    assert same["samples"] == same["bit_exact"] == 2
    assert same["max_abs_diff"] == {"aux": 0.0, "final": 0.0}
    other = compare.rows_diff(a, c, {"x-1": "1", "x-2": "2", "x-9": "9"})
    assert other["samples"] == 2 and other["bit_exact"] == 0 and other["max_abs_diff"]["aux"] > 0


@pytest.fixture
def both_mode(tmp_path, monkeypatch):
    """The extraction server's hook env as the Kimi runbook sets it (mode both)."""
    hook = load_hook_package(tmp_path / "hookpkg")
    for key in list(os.environ):
        if key.startswith(("EAGLE3_DUMP_", "EAGLE3_STREAM_")):
            monkeypatch.delenv(key)
    sock = f"/tmp/e3b-{os.getpid()}-{random.randrange(1 << 30)}.sock"  # AF_UNIX: short
    for k, v in {"DIR": str(tmp_path / "dump"), "MODE": "both", "SHARD_MB": "0.05",
                 "FLUSH_S": "0.5", "MIN_FREE_MB": "0"}.items():  # fmt: skip
        monkeypatch.setenv(f"EAGLE3_DUMP_{k}", v)
    monkeypatch.setenv("EAGLE3_STREAM_ADDR", f"unix:{sock}")
    hook.reset()
    monkeypatch.setattr(hook, "_writer_rank", lambda model: 0)
    yield hook, f"unix:{sock}", tmp_path / "dump"
    hook.reset()
    Path(sock).unlink(missing_ok=True)


def extract(server, data, dump) -> list[str]:
    """The runbook's extract step through the server (nobody listens on the stream yet: it never
    blocks); the ids it dumped."""
    assert main(["extract", "--server", server.url, "--dataset", str(data), "--out", str(dump),
                 "--disk-margin-gb", "0", "--canary-timeout", "30", "--dump-timeout", "60",
                 "--progress-interval", "0"]) == 0  # fmt: skip
    return sorted(DumpReader(dump).ids())


def bench_cmd(server, stream, dump, data, target, work, out) -> list[str]:
    return [sys.executable, str(REPO / "bench" / "bench_online.py"), "--server", server.url,
            "--stream", stream, "--dump", str(dump), "--dataset", str(data),
            "--target", str(target), "--samples", "8", "--epochs", "2", "--max-tokens", "64",
            "--work", str(work), "--out", str(out)]  # fmt: skip


ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def test_bench_online_against_a_server_in_mode_both(both_mode, tiny_target, tmp_path):
    hook, stream, dump = both_mode
    data = write_dataset(tmp_path / "data.jsonl", LENGTHS, seed=3)
    with FakeSGLang(hook, tiny_target, flags={"version": "0.5.14"}) as server:
        extracted = extract(server, data, dump)
        cmd = bench_cmd(server, stream, dump, data, tiny_target, tmp_path / "bench",
                        tmp_path / "online.json")  # fmt: skip
        proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((tmp_path / "online.json").read_text())
    assert r["equal_to_offline"] is True and r["max_abs_diff_final_weights"] == 0.0
    assert r["losses_equal"] is True and r["sglang_version"] == "0.5.14"
    for side in ("online", "offline"):
        assert {"tokens_per_s", "disk_bytes_written", "accept_length"} <= set(r[side])
        assert r[side]["tokens_per_s"] > 0 and r[side]["accept_length"] is not None
    assert r["online"]["disk_bytes_written"] == 0 and r["offline"]["disk_bytes_written"] > 0
    assert r["online"]["stream"]["received"] >= 16  # 8 samples, 2 epochs
    again = r["rows_again_vs_first_forward"]  # epoch 2's forwards repeat epoch 1's here
    assert again["samples_streamed_again"] >= 8
    assert again["rows_identical_to_first"] == again["samples_streamed_again"]
    # the same samples as the extraction's rows: this stand-in runs each request alone
    rows = r["sglang_rows_vs_extraction"]
    assert rows["samples"] == 8 and rows["bit_exact"] == 8
    # the extraction's dump is as the extract step left it (train steps read it next)
    assert sorted(DumpReader(dump).ids()) == extracted == sorted(f"s{i:04d}" for i in range(12))
    assert len(DumpReader(tmp_path / "bench" / "dump").ids()) == 8


# The runbook's retry of step `online-bench` against the same live server after the first attempt
# was killed mid-run (the device's 10-minute cut of 2026-12-07 did this; the retry then reported
# "dumped 0 of the 48 streamed samples": the renamed subset, rewritten at the same size, kept the
# first attempt's index, so the retry asked for ids the server had already dumped).


def test_a_retry_after_a_killed_attempt_measures_on_the_same_server(
    both_mode, tiny_target, tmp_path
):
    hook, stream, dump = both_mode
    data = write_dataset(tmp_path / "data.jsonl", LENGTHS, seed=3)
    work, out = tmp_path / "bench", tmp_path / "online.json"
    with FakeSGLang(hook, tiny_target, flags={"version": "0.5.14"}) as server:
        extracted = extract(server, data, dump)
        cmd = bench_cmd(server, stream, dump, data, tiny_target, work, out) + [
            "--dump-wait-s",
            "30",
        ]
        first = subprocess.Popen(
            cmd, env=ENV, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        metrics = work / "online" / "metrics.jsonl"
        end = time.monotonic() + 600
        while time.monotonic() < end and first.poll() is None:
            if metrics.exists() and metrics.read_text().count("\n") >= 2:
                break  # the online trainer is mid-run: samples streamed and dumped
            time.sleep(0.2)
        assert first.poll() is None, "the first attempt ended before it could be killed"
        os.killpg(first.pid, signal.SIGKILL)  # the cut: no finally, no cleanup
        first.wait()
        proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["sglang_rows_vs_extraction"]["samples"] == 8
    assert r["equal_to_offline"] is True
    # the killed attempt's shards are out of the extraction's dump too
    assert sorted(DumpReader(dump).ids()) == extracted
