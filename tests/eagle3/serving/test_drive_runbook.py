"""bench/drive_runbook.sh, the engine driver of every device-call script (bench/gpu_sglang.sh):
a call cut by its budget inside the per-step fallback loop leaves the run's intent `--only STEP`;
the resumed call must carry the whole run on, not stop once that one step is done. On 2026-12-07
it stopped there ("exit 0: selected steps done; 13 pending") and a device call was lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.paths import REPO

RUNBOOK = """\
name: cut
description: a failure, then a detached step the budget cuts, then two more
steps:
  - {id: fails, title: Fails, run: "false"}
  - id: slow
    title: Slow, detached (outlives its driver)
    run: python3 -c "import time, pathlib; time.sleep(12); pathlib.Path('MARK/slow').touch()"
    detach: true
  - id: after
    title: After slow
    run: python3 -c "import pathlib; pathlib.Path('MARK/after').touch()"
    requires: [slow]
  - id: last
    title: Last
    run: python3 -c "import pathlib; pathlib.Path('MARK/last').touch()"
"""

# the scripts call `python3`: this interpreter's
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def _drive(tmp, budget_s: int, resuming: bool) -> subprocess.CompletedProcess:
    script = (
        f"cd {REPO}; RB={tmp}/cut.yaml STATE={tmp}/state OUT={tmp}/out "
        f"END=$(( $(date +%s) + {budget_s} )) CHECK=bench/gpu_sglang_check.py "
        f"RESUMING={'1' if resuming else ''}; SETS=(); set -u; source bench/drive_runbook.sh; "
        "drive_runbook; echo RBRC=$RBRC"
    )
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=180, env=ENV
    )


def _statuses(tmp) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "eagle_tui.cli", "status", "--state-dir", str(tmp / "state"),
         "--json"], cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return {k: v["status"] for k, v in json.loads(out.stdout)["steps"].items()}


def test_a_resumed_call_carries_the_run_on_past_the_intent_a_cut_left(tmp_path):
    mark = tmp_path / "mark"
    mark.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "cut.yaml").write_text(RUNBOOK.replace("MARK", str(mark)))
    first = _drive(tmp_path, budget_s=9, resuming=False)  # `fails`, then --only slow: cut
    assert "RBRC=1" in first.stdout, first.stdout + first.stderr
    log = (tmp_path / "out" / "runbook.log").read_text()
    assert "== --only slow" in log, log
    st = _statuses(tmp_path)
    assert st["fails"] == "failed" and st["slow"] == "running", st
    assert not (mark / "after").exists() and not (mark / "last").exists()

    deadline = time.time() + 60
    while not (mark / "slow").exists() and time.time() < deadline:  # the job outlived its driver
        time.sleep(0.5)
    second = _drive(tmp_path, budget_s=120, resuming=True)
    log = (tmp_path / "out" / "runbook.log").read_text()
    st = _statuses(tmp_path)
    assert st == {"fails": "failed", "slow": "succeeded", "after": "succeeded",
                  "last": "succeeded"}, (st, log[-3000:])  # fmt: skip
    assert (mark / "after").exists() and (mark / "last").exists()
    assert "selected steps done; 3 pending" in log  # what the old driver took for the end
    assert "RBRC=0" in second.stdout
