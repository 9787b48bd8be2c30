"""The production runbook's dry run against a box over the real sshd: every guard is evaluated on
the box and reported with its observed value; what the box lacks (SGLang, GPUs, the model, the
data) shows as blocked, nothing crashes, and nothing is created."""

from __future__ import annotations

import pytest

from tests.support.paths import REPO

PROD = REPO / "runbooks" / "kimi-k25-eagle3.yaml"

pytestmark = pytest.mark.sshd


def test_dry_run_over_ssh_reports_every_guard(ssh_cli, box, tmp_path):
    data = tmp_path / "data"
    out = ssh_cli(
        "run",
        str(PROD),
        "--dry-run",
        "--host",
        "box",
        "--set",
        f"data={data}",
        "--set",
        f"model={tmp_path / 'model'}",
        timeout=180,
    )
    assert out.returncode == 3, out.stdout[-4000:] + out.stderr
    text = out.stdout
    # each step is listed with where it would run and what it would run
    for step in (
        "tokenize",
        "merge",
        "delete-old-states",
        "extraction-server",
        "train",
        "serve-drafter",
        "stop-serving",
    ):
        assert f" {step} on box" in text, step
    assert "delete-old-states on box (destructive: needs confirmation)" in text
    # guards evaluated on the box, with observed values
    assert "no GPU: nvidia-smi not found" in text  # gpu_idle guards
    assert f"{data}/raw does not exist" in text
    assert text.count("observed: ") >= 8
    assert "blocked train on box" in text and "blocked check-patch-target on box" in text
    assert "nothing changed" in text
    assert not data.exists()  # the box is this machine: the dry run created nothing
    assert not (ssh_cli.state / "runs").exists()  # and recorded no run
