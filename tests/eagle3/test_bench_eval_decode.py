"""bench/bench_eval_decode.py: the batched reference decoder timed against the one-prompt decoder
in one run, at tiny sizes, writing the keys its result file promises (and tokens equal)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from tests.support.paths import REPO  # noqa: E402


def test_bench_eval_decode_records_both_decoders_and_equal_tokens(tmp_path):
    out = tmp_path / "eval-decode.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_eval_decode.py"), "--device", "cpu",
         "--prompts", "3", "--tokens", "10", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["tokens_equal"] is True
    for side in ("one_at_a_time", "batched"):
        assert result[side]["seconds"] > 0 and result[side]["tokens_per_s"] > 0
    assert result["speedup"] == pytest.approx(
        result["one_at_a_time"]["seconds"] / result["batched"]["seconds"], rel=0.02
    )
    assert "bench_eval_decode [ci, cpu]" in proc.stdout
