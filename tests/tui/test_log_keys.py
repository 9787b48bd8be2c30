"""Issue 15, defect 6: End / ctrl+End take the log pane to its last line and follow it; Home /
ctrl+Home to its first line. The todo list has focus and binds home/end to its own rows, so on
the old cockpit these keys never reached the log."""

from __future__ import annotations

from eagle_tui.app.widgets.logs.live_log import LiveLog

from .helpers import opened, status, wait_for


async def test_home_and_end_move_the_log_pane(env):
    env.extra_sets += ["gate_at=0"]  # the `long` step: 30 lines and its machine lines
    app = env.app()
    async with app.run_test(size=(100, 30)) as pilot:  # a short pane: 30+ lines scroll
        await opened(pilot)
        app.main.select("long")
        await pilot.press("r")
        await wait_for(pilot, lambda: status(app, "long") == "succeeded", timeout=60, what="long")
        log = app.main.query_one(LiveLog)
        await wait_for(
            pilot,
            lambda: log.max_scroll_y > 0,
            what="following at the end",
        )
        for home, end in (("home", "end"), ("ctrl+home", "ctrl+end")):
            await pilot.press(home)
            await wait_for(pilot, lambda: log.scroll_y == 0, what=f"{home}: the top")
            assert not log.follow
            await pilot.press(end)
            await wait_for(pilot, lambda: log.scroll_y == log.max_scroll_y, what=f"{end}: the end")
            assert log.follow and app.main.follow
        assert app.main.selected == "long"  # the keys moved the log, not the step cursor
