"""Issue 15, defect 10: the layout follows the terminal. The left pane is sized by it (it was a
fixed 64 columns: at 100x30 the log got 36), the guards header is never cut to "guar", and the
notes column shows when there is room (it never did, even at 250 columns)."""

from __future__ import annotations

import pytest
from textual.geometry import Region

from eagle_tui.app.widgets.logs.live_log import LiveLog
from eagle_tui.app.widgets.steps.todo_list import TodoList

from .seed import seeded_app
from .test_snapshots import _ready


def todo_text(app) -> list[str]:
    todo = app.main.query_one(TodoList)
    strips = todo.render_lines(Region(0, 0, todo.size.width, todo.size.height))
    return ["".join(seg.text for seg in strip) for strip in strips]


@pytest.mark.parametrize(
    ("size", "min_log", "notes"),
    [((100, 30), 55, False), ((160, 50), 90, True), ((250, 70), 140, True)],
)
async def test_layout_adapts_to_the_terminal(tmp_path, size, min_log, notes):
    app = seeded_app(tmp_path / "state")
    async with app.run_test(size=size) as pilot:
        await _ready(pilot)
        await pilot.pause(0.1)
        log = app.main.query_one(LiveLog)
        assert log.size.width >= min_log, log.size.width
        lines = todo_text(app)
        header = lines[0].split()
        assert "guards" in header, lines[0]  # whole, not "guar"
        assert ("note" in header) == notes, lines[0]
        train = next(x for x in lines if " train " in x)
        assert ("60%" in train) == notes, train  # the running step's progress note
        todo = app.main.query_one(TodoList)
        assert todo.virtual_size.width <= todo.scrollable_content_region.width  # no h-scroll
