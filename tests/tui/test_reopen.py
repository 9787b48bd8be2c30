"""Issue 28 Major 3: a reopened cockpit shows what a live view showed.

- Major 3: the step selected when the run opens (a finished or failed one) shows the tail of its
  log from the mirror in the Log tab, as every other step does when selected.
"""

from __future__ import annotations

import json

from eagle_tui.app.widgets.logs.live_log import LiveLog
from eagle_tui.app.widgets.steps.detail import StepDetail

from .helpers import SIZE, opened, status, wait_for


def state_of(env) -> dict:
    run_dir = next((env.state / "runs").iterdir())
    return json.loads((run_dir / "state.json").read_text())


async def test_reopened_cockpit_shows_the_selected_steps_log_tail(cockpit_env):
    env = cockpit_env
    env.extra_sets += ["lines=12"]
    env.run_to_the_end()
    app = env.app("--run", "latest")
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        log = app.main.query_one(LiveLog)
        first = app.main.selected
        assert first == "prepare" and status(app, first) == "succeeded"
        await wait_for(
            pilot,
            lambda: any(x.startswith("prepared ") for x in log.lines),
            what="prepare's log in the Log tab on opening",
        )
        await pilot.press("down", "down", "down")  # train: its tail, as when it ran
        await wait_for(
            pilot, lambda: "train line 00012 of 12" in list(log.lines), what="train's log tail"
        )
        await pilot.press("q")


async def test_reopened_cockpit_keeps_the_guards_and_proofs(cockpit_env):
    """Issue 28 (minor): guard results and postconditions survive a reopen (from the audit),
    instead of "not evaluated yet"."""
    env = cockpit_env
    env.extra_sets += ["lines=6"]
    env.run_to_the_end()
    app = env.app("--run", "latest")
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        detail = app.main.query_one(StepDetail)
        text = str(detail.render())
        assert "proof" in text and "proven" in text and "not evaluated yet" not in text, text
        app.main.select("check")
        await pilot.pause(0.2)
        text = str(app.main.query_one(StepDetail).render())
        assert text.count("✓ guard") == 2 and "not evaluated yet" not in text, text
        await pilot.press("q")
