"""Multi-node training needs one `train.out` for every rank: two real gloo ranks (torchrun),
each given the directory its node would see. Node-local storage (rank 1 sees another dir) and
ranks about to resume from different checkpoints are refused on every rank; shared storage
passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.paths import REPO

pytest.importorskip("torch")

SCRIPT = """\
import json, os, sys
from pathlib import Path
from remote_agent.eagle3.distributed import Dist
from remote_agent.eagle3.drafter.parallel.multinode import check_shared_out
from remote_agent.eagle3.errors import BadInput
base, mode = Path(sys.argv[1]), sys.argv[2]
d = Dist.from_env("cpu")
out = base / (f"node{d.rank}" if mode == "per-node" else "shared")
resume = Path(f"step-0000000{d.rank}") if mode == "diverged" else None
try:
    check_shared_out(d, out, resume)
    verdict = "ok"
except BadInput as exc:
    verdict = str(exc)
(base / f"rank{d.rank}.json").write_text(json.dumps(verdict))
d.close()
"""


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("shared", None),
        ("per-node", "do not see rank 0's files"),
        ("diverged", "different checkpoints"),
    ],
)
def test_train_out_must_be_shared(tmp_path, mode, message):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(script), str(tmp_path), mode],
        check=True, capture_output=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    verdicts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    if message is None:
        assert verdicts == ["ok", "ok"]
    else:  # every rank refuses (each naming its own train.out)
        assert all(message in v for v in verdicts), verdicts
