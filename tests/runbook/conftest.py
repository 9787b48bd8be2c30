"""Engine tests run the real CLI and the real local agent (a subprocess over pipes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.jobs import kill_leftover_jobs
from tests.support.paths import REPO


class Cli:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.state = tmp / "state"
        self.env = dict(
            os.environ,
            EAGLE_TUI_STATE_DIR=str(self.state),
            PYTHONPATH=str(REPO),
            EAGLE_TUI_SPOOL=str(tmp / "spool"),
            COLUMNS="200",
        )

    def runbook(self, text: str, name: str = "rb.yaml") -> Path:
        path = self.tmp / name
        path.write_text(textwrap.dedent(text))
        return path

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "eagle_tui.cli", *args]

    def __call__(
        self, *args: str, timeout: float = 120, check: int | None = None
    ) -> subprocess.CompletedProcess:
        out = subprocess.run(
            self.cmd(*args), env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check is not None:
            assert out.returncode == check, (
                f"exit {out.returncode}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}"
            )
        return out

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            self.cmd(*args),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def state_json(self) -> dict:
        out = self("status", "--json", check=0)
        return json.loads(out.stdout)

    def audit(self) -> list[dict]:
        out = self("audit", "export", "--format", "jsonl", check=0)
        return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.fixture
def cli(tmp_path: Path):
    c = Cli(tmp_path)
    yield c
    # leave no job behind (detached jobs outlive the engine by design)
    kill_leftover_jobs(tmp_path / "spool")
