"""A retry (r/R) of a destructive step asks for a fresh typed confirmation (issue 13, item 1).
Pilot against the real engine and the real local agent."""

from __future__ import annotations

from eagle_tui.app.screens.confirm import ConfirmScreen

from .helpers import SIZE, opened, status, wait_for

RUNBOOK = """\
name: retry-confirm
vars:
  work: /tmp/unused
  python: python3
  job: unused
steps:
  - id: wipe
    title: Delete scratch (fails the first time)
    destructive: true
    confirm: Remove ${work}/scratch?
    preconditions:
      - {check: dir_size, path: "${work}/scratch", max: 1GiB, title: scratch size}
    run: test -e ${work}/second || { touch ${work}/second; exit 1; }; touch ${work}/scratch/done
"""


async def _confirm(pilot, app) -> None:
    await wait_for(
        pilot,
        lambda: isinstance(app.screen, ConfirmScreen) and app.screen.query("#confirm-input"),
        what="the confirmation",
    )
    app.screen.query_one("#confirm-input").focus()
    await pilot.press(*"wipe", "enter")


async def test_retry_of_a_destructive_step_asks_again(env, tmp_path):
    env.runbook = tmp_path / "retry.yaml"
    env.runbook.write_text(RUNBOOK)
    (env.work / "scratch").mkdir()
    (env.work / "scratch" / "f").write_text("x")
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        app.main.select("wipe")
        await pilot.press("r")
        await _confirm(pilot, app)
        await wait_for(pilot, lambda: status(app, "wipe") == "failed", what="first attempt fails")
        await pilot.press("R")  # retry: the confirmation given for the first attempt is spent
        await wait_for(
            pilot, lambda: isinstance(app.screen, ConfirmScreen), what="a fresh confirmation"
        )
        assert status(app, "wipe") != "running"  # nothing runs before it is typed
        await _confirm(pilot, app)
        await wait_for(pilot, lambda: status(app, "wipe") == "succeeded", what="retry succeeds")
        assert (env.work / "scratch" / "done").exists()  # the retry ran, once confirmed
