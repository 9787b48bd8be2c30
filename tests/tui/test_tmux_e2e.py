"""End to end in a real terminal: the app in a fixed-size tmux window on the demo-like runbook,
driven by key presses. Run to the end, type the confirmation, quit in the middle of the detached
job, start again and see it reattached, finish, export the audit log and verify it.

The box is the `e2e_host_args` fixture: the local agent now; the SSH issue's loopback sshd can
override that fixture (e.g. `["--host", "user@127.0.0.1:PORT", "--known-hosts", ...]`)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from eagle_tui.cli import main as cli_main

from .helpers import JOB, RUNBOOKS
from .tmux_driver import TmuxDriver, gate_line

pytestmark = pytest.mark.skipif(
    not TmuxDriver.available(), reason="tmux is not installed (apt-get install tmux)"
)


@pytest.fixture
def e2e_host_args(host) -> list[str]:
    return ["--host", host]


def state_of(state_dir):
    runs = sorted((state_dir / "runs").iterdir())
    return json.loads((runs[-1] / "state.json").read_text()) if runs else None


def test_tmux_run_quit_mid_job_reattach_finish_export(tmp_path, e2e_host_args, capsys):
    run_tmux_e2e(tmp_path, e2e_host_args, capsys)


def run_tmux_e2e(tmp_path, e2e_host_args, capsys, extra_env=None) -> None:
    """The scenario, for any box (tests/ssh runs it over the loopback sshd)."""
    state, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    env = {
        "TERM": "xterm-256color",
        "COLORTERM": "truecolor",
        "TEXTUAL_ANIMATIONS": "none",
        "EAGLE_TUI_SPOOL": str(tmp_path / "spool"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PS1": "$ ",
        **(extra_env or {}),
    }
    argv = [
        sys.executable,
        "-m",
        "eagle_tui.cli",
        "run",
        str(RUNBOOKS / "cockpit.yaml"),
        "--state-dir",
        str(state),
        *e2e_host_args,
        "--set",
        f"work={work}",
        "--set",
        f"python={sys.executable}",
        "--set",
        f"job={JOB}",
        "--set",
        "lines=40",
        "--set",
        "gate_at=21",
    ]
    tm = TmuxDriver("e2e", cwd=tmp_path, env=env)
    tm.start()
    try:
        tm.run(argv)
        tm.wait_for(r"cockpit-test")
        tm.wait_for(r"● connected")
        # the box answers before the run is open; keys before that only toast "still opening"
        tm.wait_for(r"pending prepare — Prepare the work dir")
        tm.keys("a")  # run all from the selected (first) step
        tm.wait_for(r"Destructive step: wipe")
        tm.send_text("wipe")
        tm.keys("Enter")
        tm.wait_for(gate_line(work))  # the detached job sits at its gate
        tm.wait_for(r"train line 00020 of 40")
        tm.keys("q")  # quit in the middle of the detached job
        tm.wait_for(r"EXIT=0")
        assert "still running on the box (detached): train" in tm.screen()
        assert state_of(state)["steps"]["train"]["status"] == "running"

        tm.run(argv)  # the same command again: resumes the run and reattaches
        tm.wait_for(r"\(resumed\)")
        tm.wait_for(r"reattached to job")
        # issue 15: the run-all goes on (the header says so until it ends; the toast fades)
        tm.wait_for(r"run-all from prepare \(continued; A stops it\)")
        tm.wait_for(r"train line 00020 of 40")
        (work / "release").write_text("")
        tm.wait_until(
            lambda: state_of(state)["steps"]["train"]["status"] == "succeeded", "train to succeed"
        )
        tm.wait_for(r"run finished: exit 0")  # the report ran without a key press
        tm.keys("e")
        tm.wait_for(r"Export the audit log")
        tm.keys("Enter")  # the default file: <cwd>/<run id>.audit.md
        tm.wait_until(lambda: list(tmp_path.glob("*.audit.md")), "the export file")
        tm.wait_for(r"wrote")  # the toast (its long path wraps)
        tm.keys("q")
        tm.wait_for(r"EXIT=0[\s\S]*EXIT=0")
    finally:
        tm.stop()
    st = state_of(state)
    assert all(s["status"] == "succeeded" for s in st["steps"].values())
    mirror = st["steps"]["train"]["log_file"]
    numbered = [x for x in open(mirror).read().splitlines() if x.startswith("train line")]
    assert numbered == [f"train line {i:05d} of 40" for i in range(1, 41)]  # once each, in order
    exported = tmp_path / f"{st['run_id']}.audit.md"
    assert "| train | ran | 0 |" in exported.read_text()  # views: the Succeeded steps table
    capsys.readouterr()
    assert cli_main(["audit", "verify", "--state-dir", str(state)]) == 0
