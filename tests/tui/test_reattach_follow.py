"""Issue 15, defect 6: after a reattach to a job that produced more output while the cockpit was
away, the log pane shows the job's last line and follows it (it used to stop short of the end)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from eagle_tui.app.widgets.logs.live_log import LiveLog

from .helpers import opened, status, wait_for


def spool_log_has(spool_jobs: Path, text: str) -> bool:
    return any(text in p.read_text(errors="replace") for p in spool_jobs.rglob("*") if p.is_file())


async def test_reattach_follows_the_log_to_its_end(env):
    env.extra_sets += ["gate_at=10"]
    app = env.app()
    async with app.run_test(size=(100, 30)) as pilot:
        await opened(pilot)
        app.main.select("long")
        await pilot.press("r")
        log = app.main.query_one(LiveLog)
        await wait_for(pilot, lambda: any("waiting for" in x for x in log.lines), what="the gate")
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")
    # The job runs on while no cockpit watches: 20 more lines and its result.
    (env.work / "release").write_text("")
    jobs = Path(os.environ["EAGLE_TUI_SPOOL"]) / "jobs"
    deadline = time.monotonic() + 30
    while not spool_log_has(jobs, "train line 00030 of 30"):
        assert time.monotonic() < deadline, "the job never finished on the box"
        time.sleep(0.05)

    app2 = env.app()
    async with app2.run_test(size=(100, 30)) as pilot:
        await opened(pilot)
        log = app2.main.query_one(LiveLog)
        await wait_for(pilot, lambda: status(app2, "long") == "succeeded", what="long to end")
        await wait_for(
            pilot, lambda: any("00030 of 30" in x for x in log.lines), what="the last line"
        )
        await pilot.pause(0.3)
        assert log.max_scroll_y > 0  # the pane scrolls: following is observable
        assert log.scroll_y == log.max_scroll_y, (log.scroll_y, log.max_scroll_y)
        assert log.follow
        # End re-enables follow after scrolling away, and lands on the last line.
        await pilot.press("home")
        await wait_for(pilot, lambda: log.scroll_y == 0, what="home")
        await pilot.press("end")
        await wait_for(pilot, lambda: log.scroll_y == log.max_scroll_y, what="end")
        assert log.follow
