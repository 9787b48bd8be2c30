"""runbooks/kimi-k25-eagle3.yaml: it validates, and its first steps run for real on a tiny
target locally, up to the delete, which is refused until the operator confirms it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from remote_agent.eagle3.tiny import data as tiny_data
from tests.support.paths import REPO
from tests.support.procs import run_tree

PROD = REPO / "runbooks" / "kimi-k25-eagle3.yaml"


def cli(tmp: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, EAGLE_TUI_STATE_DIR=str(tmp / "state"), EAGLE_TUI_SPOOL=str(tmp / "spool")
    )
    return run_tree(
        [sys.executable, "-m", "eagle_tui.cli", *args], timeout=timeout, env=env, cwd=tmp
    )


def test_production_runbook_validates(tmp_path):
    out = cli(tmp_path, "validate", str(PROD))
    assert out.returncode == 0, out.stderr
    assert "destructive: delete-old-states" in out.stdout


def test_delete_waits_for_a_verified_merge_and_a_confirmation(tmp_path, tiny_target):
    data = tmp_path / "data"
    sources = tiny_data.write_sources(data / "raw", per_source=12)
    sources["modules"].rename(data / "raw" / "longctx.jsonl")  # the source dropped below
    old = data / "hidden-states-previous"
    old.mkdir(parents=True)
    (old / "shard-000.safetensors").write_bytes(b"x" * 123_456)
    args = ["--host", "local", "--set", f"data={data}", "--set", f"model={tiny_target}"]
    args += ["--set", "drop_source=longctx"]  # optional since issue 17; still honoured

    out = cli(tmp_path, "run", str(PROD), "--auto", "--yes", *args)  # --yes: policy only
    assert out.returncode == 3, out.stdout[-3000:] + out.stderr[-2000:]
    steps = json.loads(cli(tmp_path, "status", "--json").stdout)["steps"]
    assert steps["regenerate"]["reason"] == "already_satisfied"  # vars.regenerate is false
    assert [steps[s]["status"] for s in ("tokenize", "merge", "verify-merge")] == ["succeeded"] * 3
    assert steps["delete-old-states"]["reason"] == "confirmation_required"
    assert (old / "shard-000.safetensors").stat().st_size == 123_456  # untouched

    out = cli(
        tmp_path,
        "run",
        str(PROD),
        "--auto",
        "--yes",
        "delete-old-states",
        "--only",
        "delete-old-states",
        *args,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert not old.exists()
    records = [
        json.loads(x)
        for x in cli(tmp_path, "audit", "export", "--format", "jsonl").stdout.splitlines()
    ]
    (confirmed,) = [r for r in records if r["event"] == "step.confirmed"]
    assert confirmed["mode"] == "yes_flag"
    assert not [g for g in confirmed["evidence"] if g["check"] == "dir_size"]
    (freed,) = [g for g in confirmed["evidence"] if g["check"] == "delete_target"]
    assert freed["ok"] and freed["observed"]["bytes"] == 123_456
    (done,) = [r for r in records if r["event"] == "step.state" and "deleted" in r]
    assert done["deleted"]["freed_bytes"] == 123_456
    manifest = json.loads((data / "merged.manifest.json").read_text())
    assert manifest["dropped_sources"] == ["longctx"]
