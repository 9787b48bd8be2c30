"""Issue 15, item 11 (the rest): ?/F1 help and Escape, undo a skip, "resuming run … with
changes" naming each variable (old -> new), progress never "done" on a failed step, the run
picker."""

from __future__ import annotations

from textual.widgets import DataTable, Label

from eagle_tui.app.screens.help import HelpScreen
from eagle_tui.app.screens.main import MainScreen
from eagle_tui.app.screens.runs import RunPickerScreen
from eagle_tui.app.widgets.progress.progress import StepProgress
from runbook.events import Notice

from .helpers import RUNBOOKS, Events, opened, status, wait_for


async def test_help_opens_with_question_mark_and_f1_and_escape_closes_it(env):
    app = env.app()
    async with app.run_test(size=(100, 30)) as pilot:
        await opened(pilot)
        for key in ("question_mark", "f1"):
            await pilot.press(key)
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what=f"{key}: help")
            table = app.screen.query_one(DataTable)
            keys = {str(table.get_row_at(i)[1]) for i in range(table.row_count)}
            assert {"run-all", "stop-all", "undo-skip", "runs", "help", "quit"} <= keys
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), what="esc closes")


async def test_undo_a_skip(env):
    app = env.app()
    async with app.run_test(size=(100, 30)) as pilot:
        await opened(pilot)
        app.main.select("ok")
        await pilot.press("s")
        await pilot.press(*"not today", "enter")
        await wait_for(pilot, lambda: status(app, "ok") == "skipped", what="the skip")
        await pilot.press("u")
        await wait_for(pilot, lambda: status(app, "ok") == "pending", what="the unskip")
        assert app.record("ok").reason == "operator_unskip"
        await pilot.press("r")
        await wait_for(pilot, lambda: status(app, "ok") == "succeeded", what="ok runs after all")
        app.main.select("flaky")
        await pilot.press("u")  # not skipped: refused with a note, nothing changes
        await wait_for(
            pilot,
            lambda: any("only a skipped step" in n.message for n in app._notifications),
            what="the refusal",
        )
        assert status(app, "flaky") == "pending"


async def test_resume_names_each_changed_variable(env):
    env.runbook = RUNBOOKS / "more.yaml"
    app = env.app("--set", "lines=10")
    async with app.run_test(size=(100, 30)) as pilot:
        await opened(pilot)
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, what="exit")
    app = env.app("--set", "lines=12")
    events = Events(app)
    async with app.run_test(size=(100, 30)) as pilot:
        await opened(pilot)
        notes = [e.message for e in events.of(Notice) if "resuming run" in e.message]
        assert notes and "lines: '10' -> '12'" in notes[0], notes
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, what="exit")


async def test_progress_is_not_done_on_a_failed_step(env):
    env.runbook = RUNBOOKS / "more.yaml"
    app = env.app()
    async with app.run_test(size=(100, 30)) as pilot:
        await opened(pilot)
        app.main.select("fails-late")
        await pilot.press("r")
        await wait_for(pilot, lambda: status(app, "fails-late") == "failed", what="the failure")
        bar = app.main.query_one(StepProgress)
        await wait_for(pilot, lambda: bar.has_class("-bad"), what="the bad style")
        text = str(bar.query_one(Label).render())
        assert text == "step failed", text
        assert "done" not in text
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, what="exit")


async def test_run_picker_lists_runs_and_opens_the_chosen_one(env):
    first = env.app()
    async with first.run_test(size=(100, 30)) as pilot:
        await opened(pilot)
        await pilot.press("q")
        await wait_for(pilot, lambda: not first.is_running, what="exit")
    app = env.app("--new-run")
    async with app.run_test(size=(120, 30)) as pilot:
        await opened(pilot)
        assert app.run_id != first.run_id
        await pilot.press("o")
        await wait_for(pilot, lambda: isinstance(app.screen, RunPickerScreen), what="the picker")
        table = app.screen.query_one(DataTable)
        assert table.row_count == 2
        shown = [str(table.get_row_at(i)[0]) for i in range(2)]
        assert shown == [first.run_id, f"{app.run_id} (open)"]
        await pilot.press("up", "enter")  # the older run
        await wait_for(pilot, lambda: not app.is_running, what="the switch")
    assert app.next_run == first.run_id  # run_app opens it next
