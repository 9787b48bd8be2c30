"""Attack: kill -9 the cockpit in a real terminal while run-all waits on a long detached step.
Promise (issue 15 defect 4): the relaunched cockpit says it continues the run-all and finishes
the remaining steps without another key press; the audit chain verifies.

Attack (issue 28 Major 5): kill -9 an `--auto` driver mid-run-all, then open the cockpit on the
run. Promise: its run-all is offered ("continue run-all from X? [y/N]"), never resumed by
opening the view; `y` continues it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from eagle_tui.app.screens.dialogs import AskScreen
from eagle_tui.cli import main as cli_main
from tests.tui.helpers import JOB, RUNBOOKS, SIZE, Env, opened, status, wait_for
from tests.tui.tmux_driver import TmuxDriver, gate_line

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
        # the box answers before the run is open; keys before that only toast "still opening"
        tm.wait_for(r"pending prepare — Prepare the work dir")
        tm.keys("a")
        tm.wait_for(r"Destructive step: wipe")
        tm.send_text("wipe")
        tm.keys("Enter")
        tm.wait_for(gate_line(work))
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


def _auto_until_gate_then_kill(env, need_progress: bool = False) -> None:
    """`--auto --yes` in its own process, killed (-9) while `train` waits at its gate."""
    argv = [sys.executable, "-m", "eagle_tui.cli", *env.argv("--auto", "--yes", "--quiet")]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                st = state_of(env)
            except (StopIteration, OSError, ValueError):
                st = None
            train = (st or {}).get("steps", {}).get("train", {})
            log = train.get("log_file")
            waiting = log and os.path.exists(log) and "waiting for" in open(log).read()
            if waiting and (train.get("progress") or not need_progress):
                break
            time.sleep(0.1)
        else:
            raise AssertionError("--auto never reached train's gate")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    st = state_of(env)
    assert st["intent"]["by"] == "auto" and st["steps"]["report"]["status"] == "pending"


def state_of(env) -> dict:
    run_dir = next((env.state / "runs").iterdir())
    return json.loads((run_dir / "state.json").read_text())


def test_dead_auto_run_all_is_offered_not_resumed(tmp_path, tally, monkeypatch):
    monkeypatch.setenv("EAGLE_TUI_SPOOL", str(tmp_path / "spool"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "work").mkdir()
    env = Env(tmp_path, RUNBOOKS / "cockpit.yaml", extra_sets=["gate_at=3", "lines=6"])
    _auto_until_gate_then_kill(env)
    try:
        asyncio.run(_offered_then_answered(env, tally))
    finally:
        from tests.support.jobs import kill_leftover_jobs

        kill_leftover_jobs(tmp_path / "spool")


async def _offered_then_answered(env, tally) -> None:
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        await wait_for(pilot, lambda: isinstance(app.screen, AskScreen), what="the offer")
        assert app.screen.title_text == "continue run-all from the first step? [y/N]"
        (env.work / "release").write_text("")  # the reattached train may end now
        await wait_for(
            pilot, lambda: status(app, "train") == "succeeded", timeout=60, what="train to end"
        )
        await pilot.pause(1.0)  # time for a wrongly resumed run-all to start `report`
        held = status(app, "report") == "pending" and isinstance(app.screen, AskScreen)
        tally.trial("a dead --auto driver's run-all is offered, not resumed", held)
        assert held
        await pilot.press("n")
        await wait_for(pilot, lambda: not isinstance(app.screen, AskScreen), what="the answer")
        await pilot.pause(0.5)
        assert status(app, "report") == "pending"
        assert any("not continued; nothing was started" in n.message for n in app._notifications)
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")

    app = env.app()  # asked again on the next opening; `y` continues it
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        await wait_for(pilot, lambda: isinstance(app.screen, AskScreen), what="the offer again")
        await pilot.press("y")
        await wait_for(
            pilot, lambda: status(app, "report") == "succeeded", timeout=60, what="report to run"
        )
        await pilot.press("q")


def test_status_after_the_driver_died_says_its_figures_are_stale(tmp_path, monkeypatch, capsys):
    """Issue 28: `status` of a run whose driver was killed says no driver is attached and how
    old the running step's progress and ETA are."""
    monkeypatch.setenv("EAGLE_TUI_SPOOL", str(tmp_path / "spool"))
    (tmp_path / "work").mkdir()
    # lines 0.6 s apart: the engine saves progress at most every 0.5 s
    sets = ["gate_at=6", "lines=8", "interval=0.6"]  # progress every 5 lines
    env = Env(tmp_path, RUNBOOKS / "cockpit.yaml", extra_sets=sets)
    try:
        _auto_until_gate_then_kill(env, need_progress=True)
        time.sleep(1.1)
        capsys.readouterr()
        assert cli_main(["status", "--state-dir", str(env.state)]) == 0
        out = capsys.readouterr().out
    finally:
        from tests.support.jobs import kill_leftover_jobs

        kill_leftover_jobs(tmp_path / "spool")
    row = next(x for x in out.splitlines() if "│ train" in x)
    assert "running" in row and "(as of " in row and " ago)" in row, out
    assert "no driver is attached: the state was last written " in out
    assert "progress and ETA of train are as of then" in out
