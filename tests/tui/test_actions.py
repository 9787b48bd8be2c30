"""Every cockpit action through Pilot, against the real engine and a real local agent."""

from __future__ import annotations

import json

import pytest

from eagle_tui.app.screens.confirm import ConfirmScreen
from eagle_tui.app.screens.dialogs import AskScreen, ReasonScreen
from eagle_tui.app.widgets.logs.live_log import LiveLog
from eagle_tui.app.widgets.steps.detail import StepDetail
from runbook import audit as audit_mod
from runbook.events import GuardsEvaluated, RunFinished

from .helpers import SIZE, Events, opened, status, wait_for


def audit_records(app) -> list[dict]:
    return audit_mod.read_records(app.engine.store.audit_path)


def detail_text(app) -> str:
    return str(app.main.query_one(StepDetail).render())


async def test_run_selected_shows_log_detail_and_exit(env):
    app = env.app()
    events = Events(app)
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        assert app.main.selected == "ok"
        await pilot.press("r")
        await wait_for(pilot, lambda: status(app, "ok") == "succeeded", what="ok to succeed")
        log = app.main.query_one(LiveLog)
        await wait_for(
            pilot, lambda: list(log.lines)[-2:] == ["ok-line-1", "ok-line-2"], what="log lines"
        )
        assert events.statuses("ok") == ["pending", "running", "succeeded"]
        text = detail_text(app)
        assert "exit 0" in text and "echo ok-line-1" in text


async def test_run_next_runs_the_first_step_not_done(env):
    app = env.app()
    events = Events(app)
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        await pilot.press("n")
        await wait_for(pilot, lambda: status(app, "ok") == "succeeded", what="ok")
        await pilot.press("n")  # flaky fails: exit 3, reason exit_code
        await wait_for(pilot, lambda: status(app, "flaky") == "failed", what="flaky to fail")
        assert app.main.selected == "flaky"
        rec = app.record("flaky")
        assert (rec.reason, rec.exit_code) == ("exit_code", 3)
        assert "exit 3" in detail_text(app) and "exit_code" in detail_text(app)
        assert events.statuses("long") == ["pending"]


async def test_retry_reruns_a_failed_step(env):
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        app.main.select("flaky")
        await pilot.press("r")
        await wait_for(pilot, lambda: status(app, "flaky") == "failed", what="flaky to fail")
        (env.work / "fixed").write_text("")
        await pilot.press("R")
        await wait_for(
            pilot, lambda: status(app, "flaky") == "succeeded", what="flaky to succeed on retry"
        )
        assert app.record("flaky").attempt == 2
        assert app.main.query_one(LiveLog).lines[-1] == "fixed"  # the new attempt's own log
        reasons = [r.get("reason") for r in audit_records(app) if r.get("step") == "flaky"]
        assert "operator_retry" in reasons


async def test_skip_asks_for_a_reason_and_is_audited(env):
    app = env.app()
    events = Events(app)
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        app.main.select("needs-input")
        await pilot.press("s")
        await wait_for(
            pilot, lambda: isinstance(app.screen, ReasonScreen), what="the reason prompt"
        )
        await pilot.press("enter")  # empty: refused, the prompt stays
        assert isinstance(app.screen, ReasonScreen)
        app.screen.query_one("#reason-input").value = "no input today"
        await pilot.press("enter")
        await wait_for(pilot, lambda: status(app, "needs-input") == "skipped", what="skipped")
        rec = [
            r
            for r in audit_records(app)
            if r.get("step") == "needs-input" and r.get("status") == "skipped"
        ]
        assert (
            rec and rec[-1]["message"] == "no input today" and rec[-1]["reason"] == "operator_skip"
        )
        assert events.statuses("needs-input")[-1] == "skipped"


async def test_run_all_stops_at_a_typed_confirmation_and_proceeds_when_typed(env):
    env.runbook = env.runbook.with_name("cockpit.yaml")
    app = env.app()
    events = Events(app)
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        await pilot.press("a")
        modal = await wait_for(
            pilot,
            lambda: (
                isinstance(app.screen, ConfirmScreen)
                and app.screen.query("#confirm-evidence Static")
                and app.screen
            ),
            what="the confirmation",
        )
        assert status(app, "wipe") == "pending"  # nothing ran yet
        shown = str(modal.query_one("#confirm-evidence Static").render())
        assert "old data size" in shown and str(env.work / "old") in shown and "64.0 KiB" in shown
        await wait_for(
            pilot,
            lambda: app.focused is not None and app.focused.id == "confirm-input",
            what="focus",
        )
        await pilot.press("w", "i", "p")
        assert modal.query_one("#confirm-yes").disabled  # not the exact id yet
        await pilot.press("enter")  # refused: stays open
        assert app.screen is modal
        await pilot.press("e", "enter")
        await wait_for(pilot, lambda: events.of(RunFinished), timeout=60, what="the run to finish")
        assert events.of(RunFinished)[-1].exit_code == 0
        assert app.engine.state.all_done()
        confirmed = [r for r in audit_records(app) if r["event"] == "step.confirmed"]
        assert len(confirmed) == 1
        assert confirmed[0]["mode"] == "typed" and confirmed[0]["typed"] == "wipe"
        assert confirmed[0]["evidence"][0]["observed"]["bytes"] == 65536


async def test_refusing_the_confirmation_leaves_the_step_blocked(env):
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        (env.work / "scratch").mkdir()
        (env.work / "scratch" / "f").write_text("x")
        app.main.select("destroy")
        await pilot.press("r")
        await wait_for(
            pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation"
        )
        await pilot.press("escape")
        await wait_for(pilot, lambda: status(app, "destroy") == "blocked", what="blocked")
        assert app.record("destroy").reason == "confirmation_required"
        assert (env.work / "scratch" / "f").exists()


async def test_cancel_asks_first_then_kills_the_job(env):
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        app.main.select("long")
        await pilot.press("r")
        log = app.main.query_one(LiveLog)
        await wait_for(
            pilot, lambda: any("waiting for" in x for x in log.lines), what="the job at its gate"
        )
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, AskScreen), what="the cancel question")
        await pilot.press("n")  # keep it running
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, AskScreen), what="the cancel question")
        assert status(app, "long") == "running"
        await pilot.press("y")
        await wait_for(pilot, lambda: status(app, "long") == "cancelled", what="cancelled")
        assert app.record("long").reason == "cancelled"
        assert any(r["event"] == "step.cancel_requested" for r in audit_records(app))


async def test_cancel_on_a_step_that_is_not_running_is_refused(env):
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        await pilot.press("x")
        assert not isinstance(app.screen, AskScreen)
        assert any("not running" in n.message for n in app._notifications)


async def test_toggle_follow(env):
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        log = app.main.query_one(LiveLog)
        assert log.auto_scroll and app.main.follow
        await pilot.press("f")
        assert not log.auto_scroll and not app.main.follow
        await pilot.press("f")
        assert log.auto_scroll and app.main.follow


async def test_dry_run_evaluates_guards_and_changes_nothing(env):
    app = env.app()
    events = Events(app)
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        seq = app.engine.audit.head.seq
        await pilot.press("d")
        await wait_for(
            pilot,
            lambda: any("dry-run" in n.message for n in app._notifications),
            what="dry-run result",
        )
        guards = {e.step_id: e for e in events.of(GuardsEvaluated)}
        assert not guards["needs-input"].results[0]["ok"]
        assert guards["needs-input"].results[0]["observed"] == {
            "exists": False,
            "type": None,
            "size": None,
        }
        assert any("needs-input" in n.message for n in app._notifications)
        app.main.select("needs-input")
        await pilot.pause()
        text = detail_text(app)
        assert "input file" in text and "exists=no" in text
        assert app.engine.audit.head.seq == seq  # nothing audited: nothing changed
        assert {r.status for r in app.engine.state.steps.values()} == {"pending"}


@pytest.mark.parametrize("fmt", ["md", "jsonl", "csv"])
async def test_export_audit(env, fmt):
    app = env.app()
    out = env.root / f"export.{fmt}"
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        await pilot.press("r")
        await wait_for(pilot, lambda: status(app, "ok") == "succeeded", what="ok")
        await pilot.press("e")
        box = await wait_for(
            pilot,
            lambda: app.screen.query("#export-path") and app.screen.query_one("#export-path"),
            what="the export dialog",
        )
        box.value = str(out)
        await pilot.press("enter")
        await wait_for(
            pilot, lambda: any("wrote" in n.message for n in app._notifications), what="export"
        )
        records = audit_records(app)
    text = out.read_text()
    if fmt == "jsonl":
        assert [json.loads(x)["hash"] for x in text.splitlines()] == [r["hash"] for r in records]
    elif fmt == "csv":  # the first line says what was verified: the local chain only
        head, rest = text.split("\n", 1)
        assert head.startswith("# audit verify: ok (local chain only): ")
        assert rest == audit_mod.export_csv(records)
    else:  # the cockpit checks the chain against the run's state, and says that is all
        assert "## Succeeded steps" in text and "| ok | ran | 0 |" in text
        assert "- audit verify: ok (local chain only): " in text and "verified" not in text


async def test_full_log_pages_through_the_mirror(env):
    from eagle_tui.app.widgets.logs.full_log import FullLogScreen

    app = env.app("--set", "gate_at=0")
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        app.main.select("long")
        await pilot.press("r")
        await wait_for(pilot, lambda: status(app, "long") == "succeeded", what="long")
        await pilot.press("l")
        screen = await wait_for(
            pilot, lambda: isinstance(app.screen, FullLogScreen) and app.screen, what="the viewer"
        )
        mirror = app.record("long").log_file
        total = len(open(mirror, "rb").read().splitlines())
        await wait_for(pilot, lambda: screen.index.line_count == total, what="the index")
        await pilot.press("G")
        await wait_for(
            pilot, lambda: screen.view.scroll_y == screen.view.max_scroll_y, what="scrolled to end"
        )
        assert f"of {total:,}" in str(screen.query_one("#full-log-title").render())
        await pilot.press("escape")
        assert app.screen is app.main
