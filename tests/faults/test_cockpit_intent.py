"""Attack: kill -9 the cockpit in a real terminal while run-all waits on a long detached step.
Promise (issue 15 defect 4): the relaunched cockpit says it continues the run-all and finishes
the remaining steps without another key press; the audit chain verifies."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from eagle_tui.cli import main as cli_main
from tests.tui.helpers import JOB, RUNBOOKS
from tests.tui.tmux_driver import TmuxDriver

pytestmark = pytest.mark.skipif(not TmuxDriver.available(), reason="tmux is not installed")


def test_kill_9_during_run_all_then_relaunch_continues(tmp_path, tally, capsys, monkeypatch):
    state, work, spool = tmp_path / "state", tmp_path / "work", tmp_path / "spool"
    work.mkdir()
    monkeypatch.setenv("EAGLE_TUI_SPOOL", str(spool))
    env = {
        "TERM": "xterm-256color",
        "TEXTUAL_ANIMATIONS": "none",
        "EAGLE_TUI_SPOOL": str(spool),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PS1": "$ ",
    }
    argv = [sys.executable, "-m", "eagle_tui.cli", "run", str(RUNBOOKS / "cockpit.yaml")]
    argv += ["--state-dir", str(state), "--host", "local"]
    for s in (f"work={work}", f"python={sys.executable}", f"job={JOB}", "lines=10", "gate_at=5"):
        argv += ["--set", s]
    tm = TmuxDriver("intent", cwd=tmp_path, env=env, size=(160, 50))
    tm.start()
    try:
        tm.run(argv)
        tm.wait_for(r"● connected")
        tm.keys("a")
        tm.wait_for(r"Destructive step: wipe")
        tm.send_text("wipe")
        tm.keys("Enter")
        tm.wait_for(r"waiting for .*release")
        run_dir = next((state / "runs").iterdir())
        pid = int((run_dir / "lock").read_text())  # the cockpit holding the run
        os.kill(pid, signal.SIGKILL)
        tm.wait_for(r"EXIT=137")
        st = json.loads((run_dir / "state.json").read_text())
        assert st["intent"]["start"] == "prepare"

        tm.keys("reset", "Enter")  # the killed app left the terminal in its own modes
        tm.run(argv)
        tm.wait_for(r"\(resumed\)")
        said = tm.wait_for(r"continuing run-all from prepare", timeout=30) is not None
        (work / "release").write_text("")

        def report_done() -> bool:
            return (
                json.loads((run_dir / "state.json").read_text())["steps"]["report"]["status"]
                == "succeeded"
            )

        tm.wait_until(report_done, "report to run without a key press", timeout=60)
        held = said and report_done()
        tally.trial("cockpit kill -9 during run-all", held)
        tm.keys("q")
        tm.wait_for(r"EXIT=0")
    finally:
        tm.stop()
    st = json.loads((run_dir / "state.json").read_text())
    assert st["intent"] is None
    assert all(s["status"] == "succeeded" for s in st["steps"].values())
    capsys.readouterr()
    assert cli_main(["audit", "verify", "--state-dir", str(state)]) == 0
