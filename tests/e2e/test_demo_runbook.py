"""The README's main job: the demo runbook end to end, headless, on the embedded default."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runbook.audit import Head, read_records, verify
from tests.support.paths import REPO
from tests.support.procs import run_tree

DEMO = REPO / "runbooks" / "demo.yaml"


def cli(tmp: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, EAGLE_TUI_STATE_DIR=str(tmp / "state"), EAGLE_TUI_SPOOL=str(tmp / "spool")
    )
    return run_tree(
        [sys.executable, "-m", "eagle_tui.cli", *args],
        timeout=timeout,
        env=env,
        cwd=tmp,  # demo work paths are relative to the agent
    )


def test_demo_refuses_the_destructive_step_without_confirmation(tmp_path):
    out = cli(tmp_path, "run", str(DEMO), "--auto", "--only", "delete-old-states")
    assert out.returncode == 3, out.stdout + out.stderr
    state = json.loads(cli(tmp_path, "status", "--json").stdout)["steps"]["delete-old-states"]
    # not even its guards ran far: it requires verify-merge, which never ran in this run
    assert state["status"] == "blocked" and state["reason"] == "requires_unmet"


@pytest.mark.timeout(900)  # about 2 min on 2 idle cores; a loaded CI box gets headroom
def test_demo_runs_to_exit_0_and_its_audit_verifies(tmp_path):
    out = cli(tmp_path, "run", str(DEMO), "--auto", "--yes", "--quiet", timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    status = json.loads(cli(tmp_path, "status", "--json").stdout)
    assert {s["status"] for s in status["steps"].values()} == {"succeeded"}
    audit_path = tmp_path / "state" / "runs" / status["run_id"] / "audit.jsonl"
    assert verify(audit_path, Head(status["audit_seq"], status["audit_head"])).ok
    assert cli(tmp_path, "audit", "verify").returncode == 0
    records = read_records(audit_path)
    finals = {
        r["step"]: r for r in records if r["event"] == "step.state" and r["status"] == "succeeded"
    }
    assert set(finals) == set(status["steps"])
    confirmed = [r for r in records if r["event"] == "step.confirmed"]
    assert [c["step"] for c in confirmed] == ["delete-old-states"]
    # the evidence shown for the delete says how many bytes it frees: the agent's measure of
    # exactly the target it then deletes itself (the one walk of the target per evaluation)
    evidence = confirmed[0]["evidence"]
    assert not [g for g in evidence if g["check"] == "dir_size"]
    (target,) = [g for g in evidence if g["check"] == "delete_target"]
    assert target["ok"] and target["observed"]["bytes"] == 8_000_000
    assert [t["bytes"] for t in confirmed[0]["targets"]] == [8_000_000]
    # ... and the agent's account of the deletion: that target, those bytes freed
    deleted = finals["delete-old-states"]["deleted"]
    assert deleted["freed_bytes"] == 8_000_000
    assert [t["result"] for t in deleted["targets"]] == ["deleted"]
    work = tmp_path / "eagle3-demo" / status["run_id"]
    assert not (work / "old-hidden-states").exists()
    evaluation = json.loads((work / "eval.json").read_text())
    trained, untrained = evaluation["trained"], evaluation["untrained"]
    assert trained["lossless"] is True and untrained["lossless"] is True
    assert trained["accept_length"] >= 1.0 and trained["completion_tokens"] > 0
    assert (work / "drafter" / "config.json").exists()
    assert (tmp_path / "state" / "runs" / status["run_id"] / "audit.md").exists()
    # the patch was applied and reverted on the scratch copy: pristine bytes again
    scratch = work / "sglang-scratch" / "sglang" / "srt" / "models" / "deepseek_v2.py"
    import hashlib

    assert hashlib.sha256(scratch.read_bytes()).hexdigest().startswith("f61f93019bf1")
