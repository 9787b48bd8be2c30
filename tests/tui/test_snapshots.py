"""Snapshots (pytest-textual-snapshot) of the main screen, the typed confirmation and the
full-log viewer, on a seeded run with a fixed clock: no wall-clock time, durations, run ids or
paths of this machine can change them. Update with `pytest tests/tui --snapshot-update`."""

from __future__ import annotations

import pytest

from eagle_tui.app.screens.confirm import ConfirmScreen
from eagle_tui.app.widgets.host.resources import ResourcesPanel
from eagle_tui.app.widgets.logs.full_log import FullLogScreen
from eagle_tui.app.widgets.logs.live_log import LiveLog
from runbook.engine import ConfirmRequest

from .helpers import SIZE, wait_for
from .seed import seeded_app, stats_events


async def _ready(pilot) -> None:
    app = pilot.app
    await wait_for(
        pilot, lambda: app.opened and app.main.selected == "train", what="the seeded run"
    )
    for ev in stats_events():
        app.engine_listener(ev)
    await wait_for(
        pilot,
        lambda: (
            app.main.query_one(ResourcesPanel).samples == 24 and len(app.main.query("GpuRow")) == 2
        ),
        what="stats applied",
    )
    log = app.main.query_one(LiveLog)
    await wait_for(pilot, lambda: log.line_count > 0, what="the log pane")
    await pilot.pause()


def test_main_screen(snap_compare, tmp_path):
    app = seeded_app(tmp_path / "state")
    assert snap_compare(app, terminal_size=SIZE, run_before=_ready)


@pytest.mark.parametrize("size", [(100, 30), (250, 70)], ids=["100x30", "250x70"])
def test_main_screen_small_and_large(snap_compare, tmp_path, size):
    """The sizes issue 15 was tried at: a laptop split pane and a large monitor."""
    app = seeded_app(tmp_path / "state")
    assert snap_compare(app, terminal_size=size, run_before=_ready)


def test_confirmation_modal(snap_compare, tmp_path):
    app = seeded_app(tmp_path / "state")

    async def before(pilot) -> None:
        await _ready(pilot)
        step = app.engine.rb.step("wipe")
        evidence = tuple(app.record("wipe").guards)
        req = ConfirmRequest("wipe", step.title, step.confirm or "", step.shown_command, evidence)
        app.run_worker(app.confirm(req), name="confirm-snapshot")
        await wait_for(
            pilot,
            lambda: (
                isinstance(app.screen, ConfirmScreen)
                and app.focused is not None
                and app.focused.id == "confirm-input"
            ),
            what="the modal",
        )
        app.focused.cursor_blink = False
        await pilot.press("w", "i")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=before)


def test_full_log_viewer(snap_compare, tmp_path):
    app = seeded_app(tmp_path / "state")

    async def before(pilot) -> None:
        await _ready(pilot)
        await pilot.press("l")
        screen = await wait_for(
            pilot, lambda: isinstance(app.screen, FullLogScreen) and app.screen, what="viewer"
        )
        await wait_for(pilot, lambda: screen.index.line_count == 288, what="the index")
        await pilot.press("pagedown")
        await wait_for(
            pilot,
            lambda: (
                screen.view.scroll_y > 0 and screen.view.scroll_y == screen.view.scroll_target_y
            ),
            what="a page down",
        )
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=before)
