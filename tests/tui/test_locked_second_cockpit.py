"""Issue 15, item 11: a second cockpit on a run another cockpit drives prints one line naming the
holder and exits 4 at once (it showed a blank screen, then exited 2 silently)."""

from __future__ import annotations

import time

import pytest

from .helpers import RUNBOOKS
from .tmux_driver import TmuxDriver, cockpit_argv, terminal_env

pytestmark = pytest.mark.skipif(not TmuxDriver.available(), reason="tmux is not installed")


def test_second_cockpit_on_a_held_run_says_who_and_exits_4(tmp_path):
    (tmp_path / "work").mkdir()
    first = TmuxDriver("first", cwd=tmp_path, env=terminal_env(tmp_path), size=(120, 40))
    second = TmuxDriver("second", cwd=tmp_path, env=terminal_env(tmp_path), size=(200, 20))
    first.start()
    second.start()
    try:
        first.run(cockpit_argv(RUNBOOKS / "actions.yaml", tmp_path))
        first.wait_for(r"● connected")
        t0 = time.monotonic()
        second.run(cockpit_argv(RUNBOOKS / "actions.yaml", tmp_path))
        second.wait_for(r"EXIT=4", timeout=20)
        took = time.monotonic() - t0
        screen = second.screen()
        assert "is being driven by" in screen and "pid" in screen, screen
        assert took < 10, f"the refusal took {took:.1f}s"
        first.keys("q")
        first.wait_for(r"EXIT=0")
    finally:
        first.stop()
        second.stop()
