"""`train.sequence_parallel` through the real entry point: `eagle3 train` under torchrun on 2 and 3
gloo ranks (every rank a share of each packed batch) trains what one rank trains: the same
losses, accuracies and gradient norms every step, the same weights at the end."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from remote_agent.eagle3.drafter.train import checkpoint as ckpt
from tests.support.paths import REPO
from tests.support.procs import run_tree


def _train(cfg: Path, out: Path, ranks: int, *extra: str) -> tuple[list[dict], str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable]
    if ranks > 1:
        cmd += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    cmd += ["-m", "remote_agent.eagle3", "train", "--config", str(cfg), "--out", str(out), *extra]
    proc = run_tree(cmd, timeout=300, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines], proc.stdout


@pytest.mark.parametrize("ranks", [2, 3])
def test_sequence_parallel_train_equals_one_rank(tiny_inputs, tmp_path, make_config, ranks):
    cfg = make_config(tmp_path / "c.json", tiny_inputs, train={"max_steps": 4, "noise_std": 0.05})
    one, _ = _train(cfg, tmp_path / "one", 1)
    sp, said = _train(cfg, tmp_path / "sp", ranks, "--set", "train.sequence_parallel=true")
    assert "x 1 rank(s)" in said and f"each split over {ranks} ranks (sequence parallel)" in said
    assert [m["step"] for m in sp] == [m["step"] for m in one] == [1, 2, 3, 4]
    for a, b in zip(one, sp, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5), a["step"]
        assert b["loss_k"] == pytest.approx(a["loss_k"], rel=1e-5)
        assert b["acc_k"] == pytest.approx(a["acc_k"], abs=1e-5)
        assert b["acc_k_all"] == pytest.approx(a["acc_k_all"], abs=1e-5)
        assert b["sim_accept_len"] == pytest.approx(a["sim_accept_len"], abs=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    w1 = ckpt.load(ckpt.latest(tmp_path / "one" / "checkpoints"))["model"]
    wn = ckpt.load(ckpt.latest(tmp_path / "sp" / "checkpoints"))["model"]
    assert w1.keys() == wn.keys() and len(w1) > 5
    for k, v in w1.items():
        torch.testing.assert_close(wn[k], v, rtol=1e-4, atol=1e-6, msg=k)
