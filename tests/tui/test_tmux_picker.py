"""Issue 15, defect 3: the run picker in a real terminal. `o` lists this runbook's runs; Enter
on another one quits this run and the cockpit opens the chosen one."""

from __future__ import annotations

import json

import pytest

from .helpers import RUNBOOKS
from .tmux_driver import TmuxDriver, cockpit_argv, terminal_env

pytestmark = pytest.mark.skipif(not TmuxDriver.available(), reason="tmux is not installed")


def test_picker_opens_another_run(tmp_path):
    (tmp_path / "work").mkdir()
    rb = RUNBOOKS / "actions.yaml"
    tm = TmuxDriver("picker", cwd=tmp_path, env=terminal_env(tmp_path), size=(160, 40))
    tm.start()
    try:
        tm.run(cockpit_argv(rb, tmp_path))
        tm.wait_for(r"● connected")
        tm.keys("q")
        tm.wait_for(r"EXIT=0")
        first = next((tmp_path / "state" / "runs").iterdir()).name
        tm.run(cockpit_argv(rb, tmp_path, "--new-run"))
        tm.wait_for(r"\(new\)[\s\S]*● connected")
        tm.wait_until(
            lambda: len(list((tmp_path / "state" / "runs").glob("*/state.json"))) == 2,
            "the new run's state",
        )
        tm.keys("o")
        tm.wait_for(r"Runs of cockpit-actions")
        tm.wait_for(r"\(open\)")
        tm.keys("Up", "Enter")  # the older run (oldest first)
        tm.wait_for(rf"run {first} \(resumed\)[\s\S]*● connected", timeout=30)
        tm.keys("q")
        tm.wait_for(r"EXIT=0[\s\S]*EXIT=0", timeout=20)
        assert f"opening run {first}" in tm.screen()  # printed between the two cockpits
    finally:
        tm.stop()
    state = json.loads((tmp_path / "state" / "runs" / first / "state.json").read_text())
    assert state["run_id"] == first
