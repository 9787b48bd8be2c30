"""bench/bench_long_context.py's logic on CPU, so its one GPU call works the first time: the
memory-fitted probes, the gate that pauses the other workers while one times, and the whole
tiny rehearsal writing every key of issue 17 (emulated OOMs drive the max_seq search)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from tests.support.paths import REPO  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))

import gpu_gate  # noqa: E402
from long_context_trials import next_probe  # noqa: E402

K = 1024


def test_probes_follow_the_memory_fit():
    # 10 GiB + 1 GiB per 1K tokens on a 100 GiB card: 96 GiB fit 86K -> 84K (a 4K multiple)
    ok = [
        {"seq": 16 * K, "ok": True, "peak_mem_gb": 26.0},
        {"seq": 32 * K, "ok": True, "peak_mem_gb": 42.0},
    ]
    assert next_probe(ok, 4096, 100.0) == 64 * K  # at most double the longest success
    ok.append({"seq": 64 * K, "ok": True, "peak_mem_gb": 74.0})
    assert next_probe(ok, 4096, 100.0) == 84 * K
    ok.append({"seq": 84 * K, "ok": True, "peak_mem_gb": 94.0})
    assert next_probe(ok, 4096, 100.0) == 88 * K  # at least one step past the longest
    assert next_probe([*ok, {"seq": 88 * K, "ok": False}], 4096, 100.0) is None  # fresh children
    assert next_probe(ok[:1], 4096, None) == 32 * K  # no memory figures (CPU): double
    assert next_probe([], 4096, 100.0) is None


def test_probes_stop_at_the_longest_allowed(tmp_path):
    """--max-probe: a probe past it is clamped to it (the time budget, not the memory, bounds
    the search on a big card), and none once it was tried."""
    import argparse

    import long_context_trials as trials

    args = argparse.Namespace(
        side="ours_mid", worker_budget_s=60, work=str(tmp_path), worker="w", step=4096,
        max_probe=256 * K,
    )  # fmt: skip
    w = trials.Worker(args)
    w.rec["gpu_total_gib"] = 139.8
    w.rec["trials"] = [
        {"seq": 32 * K, "ok": True, "peak_mem_gb": 60.0},
        {"seq": 128 * K, "ok": True, "peak_mem_gb": 75.0},
    ]
    tried = []
    w.trial = lambda seq, timed: (
        tried.append(seq) or w.rec["trials"].append({"seq": seq, "ok": True})
    )
    w.search()
    assert tried == [256 * K]


def test_the_ladder_reads_the_card_and_runs_the_defaults():
    """max_seq with the trainer's defaults (long batches in query shards): 16K (timed), the
    goal 131,072, 32K (timed); 16K shards on an H200, 8K on an H100 (80 GB)."""
    import bench_long_context as blc
    import long_context_trials as trials

    assert blc.ladder_for(139.8) == ([16 * K, 128 * K, 32 * K], 16 * K)
    assert blc.ladder_for(79.2) == ([16 * K, 128 * K, 32 * K], 8 * K)
    assert blc.ladder_for(0.0, tiny=True)[1] == blc.TINY_SHARD
    mid = trials.OPTION_SETS["ours_mid"]
    assert mid["shard_tokens"] == 16 * K and mid["embed_once"] and mid["embed_on_host"]
    assert trials.OPTION_SETS["ours"] == {}  # the plain unroll: every option off


def test_executed_flops_count_the_embedding_half_once_and_the_shards_extra():
    import bench_train

    from remote_agent.eagle3.drafter.model.model import build_config
    from remote_agent.eagle3.drafter.train.config import DrafterSection

    k = bench_train.KIMI
    c = build_config(
        DrafterSection(num_attention_heads=64, num_key_value_heads=64, intermediate_size=18432),
        target_hidden=7168, vocab_size=k["vocab"], draft_vocab_size=k["draft_vocab"],
        aux_layer_ids=[2, 30, 58], target_context=262144,
    )  # fmt: skip
    plain = bench_train.model_flops(c, [4096], 7)
    once = bench_train.model_flops(c, [4096], 7, embed_once=True)
    assert plain["train_executed"] == plain["train_total"] == once["train_total"]
    saved = 3 * 2 * 7168 * (3 * 7168) * 4096 * 6  # 6 of 7 embedding halves, fwd + dgrad + wgrad
    assert plain["train_total"] - once["train_executed"] == saved
    assert 0.12 < saved / plain["train_total"] < 0.13
    long = bench_train.model_flops(c, [128 * K], 7, embed_once=True, shard=16 * K)
    unsharded = bench_train.model_flops(c, [128 * K], 7, embed_once=True)
    assert long["train_executed"] > unsharded["train_executed"]
    # step 0's projections twice more, its k/v backward once more, the teacher's draft logits
    # once more: ~2.5 GFLOP per token, 3.2 % of the step at 128K (attention dominates there)
    assert 1.02 * unsharded["train_executed"] < long["train_executed"]
    assert long["train_executed"] < 1.04 * unsharded["train_executed"]


def test_the_memory_model_sees_the_options_and_the_shards():
    """bench/memory_model.py (the Kimi step on fake tensors, seconds on CPU): the defaults keep
    less than the plain unroll at 4K, and a 32K batch in 8K shards far less than in one pass."""
    import memory_model

    from remote_agent.eagle3.drafter.model import ttt_attention

    flex_fn = ttt_attention._flex_fn
    plain = memory_model.model("ours", 4096)["peak_gib"]
    mid = memory_model.model("ours_mid", 4096)["peak_gib"]
    assert mid < plain - 10, (mid, plain)
    one_pass = memory_model.model("ours_mid", 32 * K, shard_tokens=0)["peak_gib"]
    sharded = memory_model.model("ours_mid", 32 * K, shard_tokens=8 * K)
    assert sharded["shard_tokens"] == 8 * K
    assert sharded["peak_gib"] < 0.6 * one_pass, (sharded, one_pass)
    assert ttt_attention._flex_fn is flex_fn  # the stand-ins are gone after each model


def test_the_gate_pauses_every_other_worker(tmp_path):
    ticks = tmp_path / "ticks"
    loop = (  # each tick replaces the file whole: a read never meets a truncated one
        f"import time, pathlib\np = pathlib.Path({str(ticks)!r})\nt = p.with_suffix('.tmp')\n"
        "i = 0\nwhile True:\n    i += 1\n    t.write_text(str(i))\n    t.replace(p)\n"
        "    time.sleep(0.01)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", loop], start_new_session=True)
    try:
        gpu_gate.register(tmp_path, [child.pid])
        while not ticks.exists():
            time.sleep(0.05)
        rec: dict = {}
        with gpu_gate.exclusive(tmp_path, rec):
            time.sleep(0.3)  # a write in flight when stopped lands now
            before = ticks.read_text()
            time.sleep(0.5)
            assert ticks.read_text() == before  # paused
        assert rec["paused_groups"] == 1
        time.sleep(0.5)
        assert int(ticks.read_text()) > int(before)  # continued
    finally:
        os.killpg(child.pid, 9)
        child.wait()


@pytest.mark.timeout(700)  # its own budget is 400 s (the suite's default limit is 300)
def test_tiny_rehearsal_writes_every_key(tmp_path):
    """The whole one-call run with tiny shapes: every part's keys, ours' figures, the max_seq
    search ending at the emulated OOM (ours_lean past 1,600 tokens) found to 128 tokens."""
    out = tmp_path / "long-context.json"
    cmd = [
        sys.executable, str(REPO / "bench" / "bench_long_context.py"), "--tiny",
        "--budget-s", "400", "--work", str(tmp_path / "work"), "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env["BENCH_LC_OOM_ONCE"] = "ours_mid"  # its first 4K child runs out of memory: rerun once
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    eq = r["equal_work_4k"]
    for side in ("ours", "ours_mid", "ours_lean"):
        assert eq[side]["tokens_per_s"] > 0, eq[side]
    assert "specforge" in eq  # measured, or the missing wheel recorded
    assert eq["rerun_after_oom_beside_others"] == ["ours_mid"]
    assert r["max_seq"]["ours"] == 1536 and r["max_seq_detail"]["ours"]["first_fail"] == 1664
    assert r["max_seq_detail"]["ours"]["failure"]["kind"] == "oom"
    for label in ("throughput_16k", "throughput_32k"):
        assert r[label]["tokens_per_s"] > 0 and "mfu" in r[label]
    acc = r["accept_by_position"]
    for name in ("with_long", "without_long"):
        assert acc[name] and all({"bucket", "accept_length"} <= set(x) for x in acc[name])
    assert "long-context [max seq] ours 1536" in proc.stdout


@pytest.mark.timeout(900)
def test_the_one_call_script_rehearses_on_cpu(tmp_path):
    """bench/gpu_trainer_run.sh with tiny shapes on CPU (TINY=1): long-context.json with every
    part's keys (max_seq in shards, 16K/32K with MFU), specforge-chat.json with ours (the
    defaults), ours_equal_tokens and SpecForge, and the chat result assembled from the
    workers' records when the parent left none."""
    wheel = REPO / ".whl" / "specforge-0.2.0-py3-none-any.whl"
    if not wheel.exists():
        env = {**os.environ, "PYTHON": sys.executable}
        subprocess.run(["bash", str(REPO / "bench" / "stage_long_context.sh")], env=env, check=True)
    out, work = tmp_path / "run", tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OUT": str(out), "WORK": str(work), "TINY": "1",
           "LC_S": "330", "TOTAL_S": "700", "PYTHON": sys.executable}  # fmt: skip
    proc = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_trainer_run.sh")], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=850,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((out / "long-context.json").read_text())
    for side in ("ours", "ours_mid", "ours_lean", "specforge"):
        assert r["equal_work_4k"][side]["tokens_per_s"] > 0, r["equal_work_4k"][side]
    assert r["max_seq"]["ours"] >= 1536
    assert r["budget"]["max_seq"]["shard_tokens"] == 512  # the rungs past 512 ran in shards
    for label in ("throughput_16k", "throughput_32k"):
        assert r[label]["tokens_per_s"] > 0 and "mfu" in r[label] and "mfu_executed" in r[label]
    chat = json.loads((out / "specforge-chat.json").read_text())["throughput"]["chat"]
    for side in ("ours", "ours_equal_tokens", "specforge"):
        assert chat[side]["tokens_per_s"] > 0, side
    assert "throughput_ratio" in chat and "throughput_ratio_equal_tokens" in chat
    assert "gpu_trainer_run: done" in proc.stdout
    # what comes back from the device: at most 8 files, the rest in one archive
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu-trainer-run.log", "long-context.json", "run-logs.tar.gz", "specforge-chat.json",
    ]  # fmt: skip
    assert "long-context [max seq]" in (out / "gpu-trainer-run.log").read_text()
    (out / "specforge-chat.json").unlink()
    cmd = [sys.executable, str(REPO / "bench" / "bench_specforge.py"), "--assemble", "--workload",
           "chat", "--work", str(work / "chat-work"), "--out", str(out / "specforge-chat.json")]  # fmt: skip
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True, timeout=120)
    again = json.loads((out / "specforge-chat.json").read_text())
    assert again["throughput"]["chat"]["throughput_ratio"] == chat["throughput_ratio"]
    assert "assembled" in again


def test_the_specforge_side_keeps_no_drafter_of_ours(tmp_path):
    """SpecForge's llama3_eagle keeps its flash_attn ImportError (traceback and all) in a module
    global; imported while a frame held our drafter, it kept 6.43 GiB of ours beside SpecForge's
    on the GPU (41.54 vs 35.05 GB at 4K). import_sf imports it first: nothing of ours survives."""
    wheel = REPO / ".whl" / "specforge-0.2.0-py3-none-any.whl"
    if not wheel.exists():  # staged as a user stages it: PyPI download, sha256 checked
        env = {**os.environ, "PYTHON": sys.executable}
        subprocess.run(["bash", str(REPO / "bench" / "stage_long_context.sh")], env=env, check=True)
    code = (
        "import argparse, gc, sys\n"
        f"sys.path[:0] = [{str(REPO)!r}, {str(REPO / 'bench')!r}]\n"
        "import long_context_trials as T\n"
        "from remote_agent.eagle3.drafter.model.model import Eagle3Drafter\n"
        f"a = argparse.Namespace(tiny=True, ttt=3, wheel={str(wheel)!r})\n"
        "one, config, ctx = T.make_side('specforge', a, 'cpu')\n"
        "gc.collect()\n"
        "print('ours alive:', sum(isinstance(o, Eagle3Drafter) for o in gc.get_objects()))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ours alive: 0" in proc.stdout, proc.stdout


def test_profile_step_runs_each_side_and_classifies_its_kernels(tmp_path):
    """bench/profile_step.py on CPU (tiny shapes): every side and A/B variant runs in its own
    child and records step time and its profile; on CUDA the same code classifies kernels."""
    import profile_step

    out = tmp_path / "profile.json"
    sides = "ours_mid,ours_mid_eager_merge,ours_mid_eager_add"
    args = ["--device", "cpu", "--seq", "128", "--sides", sides, "--warmup", "1"]
    args += ["--timed", "1", "--profiled", "1", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench/profile_step.py"), *args],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rec = json.loads(out.read_text())["sides"]
    assert list(rec) == sides.split(",")
    for side, r in rec.items():
        assert r["side"] == side and r["step_s"] > 0 and r["tokens_per_s"] > 0, r
        assert r["profiled_wall_ms_per_step"] > 0
    assert profile_step.classify("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT") == "gemm"
    assert profile_step.classify("triton_tem_fused_flex_attention_backward_1") == "attention"
    assert profile_step.classify("multi_tensor_apply_kernel<FusedOptimizer") == "optimizer"
    assert profile_step.classify("triton_poi_fused_add_0") == "triton_fused"


def test_results_and_logs_name_no_machine_layout():
    """machine_info.portable: checkout paths become repo-relative and the home `~`, also inside
    a message such as a child's traceback; other strings are left alone."""
    from pathlib import Path

    from machine_info import portable

    home = str(Path.home())
    got = portable(
        {
            "wheel": f"{REPO}/.whl/x.whl",
            "tail": f'File "{REPO}/bench/profile_step.py", line 1\n  in {home}/.cache/y',
            "list": [str(REPO), "/tmp/bench-long-context-1", 3],
        }
    )
    assert got == {
        "wheel": ".whl/x.whl",
        "tail": 'File "bench/profile_step.py", line 1\n  in ~/.cache/y',
        "list": [".", "/tmp/bench-long-context-1", 3],
    }
