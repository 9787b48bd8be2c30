"""The device scripts' logic on CPU with tiny sizes, so their GPU run works the first time:
bench/bench_extract.py and tests/gpu/test_extraction_gpu.py (1 rank + 2 ranks under torchrun)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from tests.support.paths import REPO  # noqa: E402


def test_bench_extract_quick_on_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "bench_extract", REPO / "bench" / "bench_extract.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "extract.json"
    args = [
        "--quick",
        "--device",
        "cpu",
        "--preset",
        "ci",
        "--samples",
        "8",
        "--min-len",
        "8",
        "--max-len",
        "40",
        "--token-budget",
        "128",
        "--workdir",
        str(tmp_path),
        "--out",
        str(out),
    ]
    assert bench.main(args) == 0
    r = json.loads(out.read_text())
    assert r["config"]["samples"] == 8 and r["machine"]["device"] == "cpu"
    for key in ("forward_only", "extract_bf16", "extract_fp8_e4m3", "peer_per_sample_torch_save"):
        assert r[key]["tokens_per_s"] > 0
    b = r["bytes_per_token"]
    assert b["per_sample_formats_4xHx2"] == 4 * 64 * 2
    assert b["dense_fp8_aux"] < b["dense_bf16"] < 4 * 64 * 2 + 16  # fp8 aux roughly halves the aux
    assert isinstance(r["goal"]["met"], bool) and r["raw_disk_write_gb_per_s"] > 0
    assert [p.name for p in tmp_path.iterdir()] == ["extract.json"]  # the work dir was removed


def test_gpu_check_script_on_cpu(tmp_path):
    report = tmp_path / "check.json"
    cmd = [
        sys.executable,
        str(REPO / "tests" / "gpu" / "test_extraction_gpu.py"),
        "--device",
        "cpu",
        "--quick",
        "--preset",
        "ci",
        "--samples",
        "6",
        "--max-len",
        "48",
        "--report",
        str(report),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    r = json.loads(report.read_text())
    assert r["one_rank"]["samples"] == 6 and r["one_rank_vs_hf"]["within_tolerance"]
    assert r["two_ranks_disjoint"] and r["two_ranks_per_rank_samples"] == {"r000": 3, "r001": 3}
    assert r["two_ranks_vs_one"]["within_tolerance"]
