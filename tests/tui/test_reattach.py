"""Quit in the middle of a detached job, start again: the job kept running, the cockpit
reattaches, the log pane continues from the mirror without a gap or a repeated line, and the
training curves are rebuilt from the mirror's metrics lines."""

from __future__ import annotations

import re

from eagle_tui.app.widgets.logs.live_log import LiveLog
from eagle_tui.app.widgets.logs.readable import is_progress, readable
from eagle_tui.app.widgets.progress.curves import Curves
from eagle_tui.cli import main as cli_main
from runbook.events import Notice, RunFinished

from .helpers import SIZE, Events, opened, status, type_confirmation, wait_for

NUMBERED = re.compile(r"^train line (\d{5}) of 40$")


def mirror_lines(path: str) -> list[str]:
    """The mirror's lines as the pane shows them: `@@eagle3` machine lines made readable, the
    progress records left to the progress bar (issue 28: not one log line per update)."""
    lines = open(path, "rb").read().decode().splitlines()
    return [readable(x) for x in lines if not is_progress(x)]


async def test_quit_mid_job_then_reattach_without_gap_or_repeat(cockpit_env, capsys):
    env = cockpit_env
    env.extra_sets += ["gate_at=21", "lines=40"]
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        run_id = app.run_id
        await pilot.press("a")
        await type_confirmation(pilot, "wipe")
        log = app.main.query_one(LiveLog)
        await wait_for(
            pilot, lambda: any("waiting for" in x for x in log.lines), timeout=60, what="the gate"
        )
        assert app.main.selected == "train"  # following: the running step is selected
        curves = app.main.query_one(Curves)
        await wait_for(
            pilot,
            lambda: curves.metrics is not None and curves.metrics.count == 4,
            what="4 metrics",
        )
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")
    assert app.return_value == 0
    assert app.jobs_left_running() == ["train"]

    app2 = env.app()
    events = Events(app2)
    assert app2.run_id == run_id  # resumed, not a new run
    async with app2.run_test(size=SIZE) as pilot:
        await opened(pilot)
        assert app2.main.selected == "train"
        await wait_for(
            pilot,
            lambda: any("reattached" in e.message for e in events.of(Notice)),
            what="reattach",
        )
        # the run-all of the first cockpit goes on (actions.continue_intent); withdraw it, so the
        # pane stays on train when it ends instead of following `report` (a race otherwise)
        assert any("continuing run-all" in n.message for n in app2._notifications)
        await pilot.press("A")
        await wait_for(pilot, lambda: app2.engine.state.intent is None, what="run-all withdrawn")
        log = app2.main.query_one(LiveLog)
        mirror = app2.record("train").log_file
        assert list(log.lines) == mirror_lines(mirror)  # rebuilt from the mirror, exactly
        curves = app2.main.query_one(Curves)
        await wait_for(
            pilot,
            lambda: curves.metrics is not None and curves.metrics.count == 4,
            what="curves rebuilt from the mirror",
        )
        (env.work / "release").write_text("")
        await wait_for(
            pilot, lambda: status(app2, "train") == "succeeded", timeout=60, what="train to finish"
        )
        await wait_for(
            pilot, lambda: list(log.lines) == mirror_lines(mirror), what="the pane to catch up"
        )
        assert status(app2, "report") == "pending"  # nothing ran on after the withdrawal
        numbers = [int(m.group(1)) for x in log.lines if (m := NUMBERED.match(x))]
        assert numbers == list(range(1, 41))  # every line exactly once, in order
        # issue 15 defect 5: progress and metrics readable, no raw JSON with 16-digit floats
        assert not any(x.startswith("@@eagle3") for x in log.lines)
        assert any(x.startswith("▸ metrics · step 20 · loss ") for x in log.lines)
        # issue 28: progress updates are the bar, not log lines (the full log keeps them)
        assert not any(x.startswith("▸ train · ") for x in log.lines)
        assert any('"kind":"progress"' in x for x in open(mirror).read().splitlines())
        assert curves.metrics.count == 8
        assert app2.record("train").progress["kind"] == "result"
        await pilot.press("n")
        await wait_for(pilot, lambda: events.of(RunFinished), what="the run to finish")
        assert events.of(RunFinished)[-1].exit_code == 0
        await pilot.press("q")
        await wait_for(pilot, lambda: not app2.is_running, what="the app to exit")
    capsys.readouterr()
    assert cli_main(["audit", "verify", "--state-dir", str(env.state)]) == 0
    assert "ok:" in capsys.readouterr().out
