"""Online training data-parallel: two torchrun ranks (gloo, CPU), each listening on its own
address (`online.listen` with `{k}`), the producer routing every sample to the rank that asked
for it (`@k/` rids): equal to the same two-rank run from the dump, bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from remote_agent.eagle3.online import compare  # noqa: E402
from remote_agent.eagle3.online.producer import ReferenceProducer  # noqa: E402
from tests.support.paths import REPO  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def torchrun(cfg: dict, path: Path) -> None:
    path.write_text(json.dumps(cfg))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "-m", "remote_agent.eagle3", "train", "--config", str(path)]  # fmt: skip
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_two_ranks_online_equal_two_ranks_offline(inputs, tmp_path):
    t, data = inputs["target"], inputs["data"]
    small = {"max_tokens": 128}  # 16 samples -> enough packed batches for two ranks
    torchrun(
        compare.config(t, data, tmp_path / "off", inputs["dump"], data=small), tmp_path / "off.json"
    )
    template = f"unix:{tmp_path}/s-{{k}}.sock"
    with ReferenceProducer(t, template) as producer:
        on = compare.config(t, data, tmp_path / "on", data=small,
                            online={"server": producer.url, "listen": template})  # fmt: skip
        torchrun(on, tmp_path / "on.json")
        stats = producer.sender.stats
    assert stats["destinations"] == 2 and stats["misrouted"] == 0 and stats["overflow"] == 0
    assert compare.losses(tmp_path / "on") == compare.losses(tmp_path / "off")
    diff = compare.max_abs_diff(
        compare.final_weights(tmp_path / "on"), compare.final_weights(tmp_path / "off")
    )
    assert diff == 0.0


def test_ranks_need_their_own_addresses(inputs, tmp_path):
    from remote_agent.eagle3.drafter.train import config as config_mod
    from remote_agent.eagle3.errors import BadInput
    from remote_agent.eagle3.online.source import OnlinePlan

    cfg = compare.config(inputs["target"], inputs["data"], tmp_path / "run",
                         online={"server": "http://127.0.0.1:9", "listen": "unix:/tmp/one.sock"})  # fmt: skip
    with pytest.raises(BadInput, match=r"needs \{k\}"):
        OnlinePlan(config_mod.from_dict(cfg), world=2, rank=1)
