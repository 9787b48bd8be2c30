"""Issue 15, defect 4: run-all is part of the run's state. After `a` and its confirmation, a quit
during the long detached step and a relaunch continue the run-all (the cockpit says so); `A`
withdraws it without killing the running job. Every change of intent is in the audit log."""

from __future__ import annotations

import asyncio
import json

from eagle_tui.app.widgets.host.header import RunHeader
from runbook.events import RunFinished

from .helpers import SIZE, Events, opened, status, type_confirmation, wait_for


def audit_events(app) -> list[dict]:
    path = app.engine.store.audit_path
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


async def start_run_all_and_quit_at_the_gate(env) -> str:
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        await pilot.press("a")
        await type_confirmation(pilot, "wipe")
        await wait_for(pilot, lambda: status(app, "train") == "running", timeout=60, what="train")
        assert app.engine.state.intent is not None and app.engine.state.intent.start == "prepare"
        await pilot.press("q")  # only detached work: quits at once
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")
    return app.run_id


async def test_relaunch_continues_run_all(cockpit_env):
    env = cockpit_env
    env.extra_sets += ["gate_at=5", "lines=10"]
    run_id = await start_run_all_and_quit_at_the_gate(env)

    app = env.app()
    events = Events(app)
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        assert app.run_id == run_id
        await wait_for(
            pilot,
            lambda: any("continuing run-all from prepare" in n.message for n in app._notifications),
            what="the cockpit to say it continues run-all",
        )
        header = app.main.query_one(RunHeader)
        assert "run-all from prepare (continued; A stops it)" in header.mode
        (env.work / "release").write_text("")
        await wait_for(pilot, lambda: events.of(RunFinished), timeout=60, what="the run to end")
        assert events.of(RunFinished)[-1].exit_code == 0
        assert status(app, "report") == "succeeded"  # nobody pressed a key after the relaunch
        assert app.engine.state.intent is None
        kinds = [r["event"] for r in audit_events(app) if r["event"].startswith("run.intent")]
        assert kinds == ["run.intent_set", "run.intent_resumed", "run.intent_cleared"]
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")


async def test_stop_run_all_keeps_the_job_and_starts_nothing_more(cockpit_env):
    env = cockpit_env
    env.extra_sets += ["gate_at=5", "lines=10"]
    await start_run_all_and_quit_at_the_gate(env)

    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        await wait_for(pilot, lambda: app.actions.auto_running(), what="run-all to continue")
        await pilot.press("A")
        assert app.engine.state.intent is None
        await wait_for(
            pilot,
            lambda: any("train keeps running" in n.message for n in app._notifications),
            what="the stop note",
        )
        assert status(app, "train") == "running"  # withdrawing the intent kills nothing
        (env.work / "release").write_text("")
        await wait_for(pilot, lambda: status(app, "train") == "succeeded", timeout=60, what="train")
        await wait_for(pilot, lambda: not app.actions.auto_running(), what="run-all to stop")
        assert status(app, "report") == "pending"  # no next step after A
        why = [r.get("why") for r in audit_events(app) if r["event"] == "run.intent_cleared"]
        assert why == ["stopped by the operator"]
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")


def test_headless_auto_continues_the_cockpits_run_all(env, capsys):
    """`--auto` without --from/--only takes up a saved intent: it runs from the intent's step
    (the steps before it, which the operator did not ask for, stay as they were)."""
    from eagle_tui.cli import main as cli_main

    env.extra_sets += ["gate_at=5"]
    app = env.app()

    async def cockpit() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await opened(pilot)
            app.main.select("long")
            await pilot.press("a")  # run all from `long`
            await wait_for(pilot, lambda: status(app, "long") == "running", what="long")
            await pilot.press("q")  # detached: quits at once, the intent stays
            await wait_for(pilot, lambda: not app.is_running, what="the app to exit")

    asyncio.run(cockpit())
    (env.work / "release").write_text("")
    code = cli_main([*env.argv("--auto", "--quiet"), "--run", app.run_id])
    state = json.loads((env.state / "runs" / app.run_id / "state.json").read_text())
    assert state["steps"]["ok"]["status"] == "pending"  # before the intent's start: untouched
    assert state["steps"]["long"]["status"] == "succeeded"
    assert state["steps"]["needs-input"]["status"] == "blocked"  # run-all went on, then stopped
    assert code == 3
    assert state["intent"] is None  # cleared when the run-all ended
    audit = env.state / "runs" / app.run_id / "audit.jsonl"
    records = [json.loads(x) for x in audit.read_text().splitlines()]
    resumed = [r for r in records if r["event"] == "run.intent_resumed"]
    assert resumed and resumed[0]["by"] == "auto" and resumed[0]["start"] == "long"
    capsys.readouterr()
