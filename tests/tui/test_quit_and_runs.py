"""Issue 15, defects 1 and 3. Quitting while a bound step runs asks first and names exactly what
dies (bound) and what survives (detached); what it prints afterwards is what happened to the real
processes. Runs are first-class: `eagle-tui runs` lists them, `--run ID` opens one, `--new-run`
warns about an older run with a running step."""

from __future__ import annotations

import asyncio
import os
import time

from eagle_tui.app.screens.dialogs import AskScreen
from eagle_tui.cli import main as cli_main

from .helpers import SIZE, opened, status, wait_for

RUNBOOK = """\
name: quit-test
vars: {work: /tmp, python: python3, job: j}
steps:
  - id: bound
    title: Bound to the cockpit
    run: ${python} ${job} --lines 5 --gate-at 2 --gate-file ${work}/never
  - id: det
    title: Detached
    detach: true
    run: ${python} ${job} --lines 5 --gate-at 2 --gate-file ${work}/never
"""


def _alive(env, job_id: str) -> bool:
    pgid = int((env.root / "spool" / "jobs" / job_id / "pgid").read_text().split()[0])
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _gone_within(env, job_id: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(env, job_id):
            return True
        time.sleep(0.05)
    return False


async def _start_both(env):
    (env.root / "quit.yaml").write_text(RUNBOOK)
    env.runbook = env.root / "quit.yaml"
    app = env.app()
    pilot_ctx = app.run_test(size=SIZE)
    return app, pilot_ctx


def test_quit_with_a_bound_step_asks_and_says_what_dies_and_survives(env, capsys):
    # sync: the headless CLI below runs its own event loop, between the two cockpit sessions
    app = asyncio.run(_quit_with_bound_and_detached(env))
    bound_job, det_job = app.record("bound").job_id, app.record("det").job_id
    assert app.quit_work.bound == ["bound"] and app.jobs_left_running() == ["det"]
    assert _gone_within(env, bound_job, 10), "the bound job outlived the cockpit"
    assert _alive(env, det_job), "the detached job died with the cockpit"
    capsys.readouterr()
    rb = str(env.runbook)
    common = ["--state-dir", str(env.state)]
    assert cli_main(["runs", *common]) == 0
    listing = capsys.readouterr().out
    assert app.run_id in listing and "quit-test" in listing and "det" in listing
    # a new run warns that the old one still has a running step, naming it and how to open it
    code = cli_main(["run", rb, *common, "--dry-run", "--new-run", "--host", "local", "--quiet"])
    err = capsys.readouterr().err
    assert f"run {app.run_id} still has running steps: " in err and "det" in err, err
    assert f"--run {app.run_id}" in err and code in (0, 3)
    # a run that does not exist is a clear error (exit 2), not a new run
    assert cli_main(["run", rb, *common, "--dry-run", "--run", "nope-0"]) == 2
    assert "--run nope-0: no runs match" in capsys.readouterr().err
    asyncio.run(_reopen_by_id(env, app.run_id))


async def _quit_with_bound_and_detached(env):
    app, ctx = await _start_both(env)
    async with ctx as pilot:
        await opened(pilot)
        for sid in ("bound", "det"):
            app.main.select(sid)
            await pilot.press("r")
            await wait_for(pilot, lambda s=sid: status(app, s) == "running", what=f"{sid} runs")
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, AskScreen), what="the question")
        body = " ".join(w.visual.plain for w in app.screen.query("Static"))
        assert "killed when it quits: bound." in body
        assert "keep running on the box: det." in body
        await pilot.press("n")  # keep running: nothing is touched
        await wait_for(pilot, lambda: not isinstance(app.screen, AskScreen), what="closed")
        assert app.is_running and status(app, "bound") == status(app, "det") == "running"
        bound_job, det_job = app.record("bound").job_id, app.record("det").job_id
        assert _alive(env, bound_job) and _alive(env, det_job)
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, AskScreen), what="asked again")
        await pilot.press("y")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")
    return app


async def _reopen_by_id(env, run_id: str) -> None:
    app2 = env.app("--run", run_id[:-2])  # a unique prefix will do
    async with app2.run_test(size=SIZE) as pilot:
        await opened(pilot)
        assert app2.run_id == run_id
        await wait_for(pilot, lambda: status(app2, "bound") == "lost", what="bound marked lost")
        assert status(app2, "det") == "running"
        app2.main.select("det")
        await pilot.press("x")  # cancel the detached job so nothing is left behind
        await wait_for(pilot, lambda: isinstance(app2.screen, AskScreen), what="cancel question")
        await pilot.press("y")
        await wait_for(pilot, lambda: status(app2, "det") == "cancelled", what="det cancelled")
        await pilot.press("q")  # nothing live: quits without asking
        await wait_for(pilot, lambda: not app2.is_running, what="the app to exit")


async def test_quit_with_only_detached_work_does_not_ask(env):
    app, ctx = await _start_both(env)
    async with ctx as pilot:
        await opened(pilot)
        app.main.select("det")
        await pilot.press("r")
        await wait_for(pilot, lambda: status(app, "det") == "running", what="det runs")
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")
    assert app.jobs_left_running() == ["det"] and app.quit_work.bound == []
    assert _alive(env, app.record("det").job_id)
