"""Issue 15 item 7 and the wording of item 11, in the real cockpit (Pilot, real local agent):
a skip_if that does not hold is "not skipped", not a failure; postconditions are shown as the
proof; dry-run marks go when the step really runs; the confirmation shows what exactly the delete
removes, with an empty input and the word to type as a label."""

from __future__ import annotations

import textwrap

from textual.widgets import Input

from eagle_tui.app.screens.confirm import ConfirmScreen
from eagle_tui.app.widgets.steps.detail import StepDetail
from eagle_tui.app.widgets.steps.todo_list import TodoList

from .helpers import SIZE, opened, status, type_confirmation, wait_for

RUNBOOK = """\
name: guard-views
vars: {work: /nonexistent, python: python3, job: none, gate_at: 0}
steps:
  - id: make
    title: Make the old data
    run: mkdir -p ${work}/old && head -c 65536 /dev/zero > ${work}/old/blob && echo made
    skip_if:
      - {check: path_exists, path: "${work}/old/blob", title: already made}
    postconditions:
      - {check: dir_size, path: "${work}/old", min: 65536, title: blob written}
  - id: wipe
    title: Delete the old data
    destructive: true
    confirm: Delete the old data?
    delete: ["${work}/old"]
    delete_within: "${work}"
    requires: [make]
    preconditions:
      - {check: dir_size, path: "${work}/old", min: 1, title: bytes this frees}
    postconditions:
      - {check: path_absent, path: "${work}/old", title: old data gone}
"""


def detail(app) -> str:
    return app.main.query_one(StepDetail).visual.plain


def guard_cell(app, sid: str) -> str:
    return str(app.main.query_one(TodoList).get_row(sid)[4])


async def test_skip_conditions_proofs_and_dry_run_marks(env):
    env.runbook = env.root / "guard-views.yaml"
    env.runbook.write_text(textwrap.dedent(RUNBOOK))
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        app.main.select("wipe")
        await pilot.press("d")
        await wait_for(pilot, lambda: "dry-run" in detail(app), what="the dry run's marks")
        shown = detail(app)
        assert "⋯ guard dry-run bytes this frees: pending on step make" in shown, shown
        notes = [n.message for n in app._notifications]
        assert any(n.startswith("dry-run: nothing blocked; 1 pending") for n in notes), notes

        app.main.select("make")
        await pilot.press("r")
        await wait_for(pilot, lambda: status(app, "make") == "succeeded", what="make")
        await wait_for(pilot, lambda: "proof" in detail(app), what="the proof")
        shown = detail(app)
        assert "· skip if already made: does not hold" in shown  # the step ran: not a failure
        assert "✓ proof blob written: proven" in shown
        assert "dry-run" not in shown and "✗" not in shown
        assert guard_cell(app, "make") == "✓1"  # the proof counts; the unmet skip_if does not
        # wipe has not run: its dry-run marks still say they are a dry run's
        app.main.select("wipe")
        await pilot.pause()
        assert "dry-run" in detail(app)


async def test_the_confirmation_shows_what_the_delete_removes(env):
    env.runbook = env.root / "guard-views.yaml"
    env.runbook.write_text(textwrap.dedent(RUNBOOK))
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        app.main.select("make")
        await pilot.press("a")  # run all from make
        modal = await wait_for(
            pilot,
            lambda: (
                isinstance(app.screen, ConfirmScreen)
                and app.screen.query("#confirm-evidence Static")
                and app.screen
            ),
            what="the confirmation",
        )
        box = modal.query_one(Input)
        assert box.value == "" and box.placeholder == ""  # the word to type is not pre-shown
        labels = [str(w.visual.plain) for w in modal.query("Label")]
        assert any("Type the step id wipe to run it" in t for t in labels), labels
        evidence = modal.query_one("#confirm-evidence Static").visual.plain
        assert "removes 64.0 KiB in 1 file" in evidence and "4096" not in evidence
        assert f"the agent deletes dir {env.work / 'old'} (exactly this one)" in evidence
        await type_confirmation(pilot, "wipe")
        await wait_for(pilot, lambda: status(app, "wipe") == "succeeded", what="wipe", timeout=60)
        app.main.select("wipe")
        await wait_for(pilot, lambda: "old data gone" in detail(app), what="wipe's proof")
        assert "✓ proof old data gone: proven" in detail(app)
        assert not (env.work / "old").exists()


async def test_the_header_says_key_once(env):
    from eagle_tui.app.widgets.host.header import RunHeader

    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        header = app.main.query_one(RunHeader)
        header.set_connection("gpu", "connecting", 1, None, None)  # an ssh box, key not yet seen
        await pilot.pause()
        shown = header.visual.plain
        assert "host gpu · key not known yet" in shown and "key key" not in shown
        assert "host local · key none (local)" in shown
