"""Defect 2 of issue 15: every user-supplied string (titles, commands, log lines, guard values,
error messages, paths) is shown literally and never parsed as markup. Textual 8 parses markup
itself; rich's `escape` does not round-trip through it (`\\[b]`, `[$x]` raise MarkupError or lose
characters), so a runbook's own `run:` text could crash the cockpit on open."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagle_tui.app.screens.confirm import ConfirmScreen
from eagle_tui.app.widgets.host.header import RunHeader
from eagle_tui.app.widgets.host.resources import ResourcesPanel
from eagle_tui.app.widgets.steps.detail import StepDetail
from runbook.engine import ConfirmRequest
from runbook.state import StepRecord

from .helpers import SIZE, log_lines, opened, wait_for

# The issue's command, and strings that break escape() + Textual markup in known ways.
HOSTILE = [
    "[print(f'…' , flush=(i%500==0)) for i in range(600)]",
    "\\[b]not bold",
    "[$x] and [$",
    "[@click=app.quit]q[/]",
    "a[/]b[/b]",
    "$title $$ ${work}",
    "[on red]x",
    "\\",
]
# Markup-ish text: brackets, backslashes, dollars, at-signs, equals, slashes, letters.
MARKUPISH = st.lists(
    st.sampled_from([*"[]\\/$@=#.:'\"() ab", "on ", "red", "[/]", "\\["]), max_size=20
).map("".join)
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _plain(widget) -> str:
    return widget.visual.plain  # the parsed form: building it is where markup errors raise


def _runbook(env, cmd: str, title: str) -> None:
    path = env.root / "hostile.yaml"
    q = lambda s: "'" + s.replace("'", "''") + "'"  # noqa: E731  (YAML single-quoted scalar)
    path.write_text(
        "name: hostile\nvars: {work: /tmp, python: python3, job: j}\nsteps:\n"
        f"  - id: weird\n    title: {q(title)}\n    run: {q(cmd)}\n"
        "    preconditions:\n"
        f"      - {{check: path_exists, path: {q('${work}')}, title: {q(title)}}}\n"
    )
    env.runbook = path


async def test_the_issues_command_opens_and_is_shown_literally(env):
    cmd = "python3 -c \"[print(f'line {i}' , flush=(i%500==0)) for i in range(3)]\" ; echo '[b]x\\[/]'"
    title = "\\[b]title [$x] [@click=app.quit]"
    _runbook(env, cmd, title)
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        shown = _plain(app.main.query_one(StepDetail))
        assert cmd in shown and title in shown
        await pilot.press("d")  # dry-run: guard title and observed path go through the detail
        await wait_for(pilot, lambda: "observed" in _plain(app.main.query_one(StepDetail)))
        assert f"✓ guard dry-run {title}: passed" in _plain(app.main.query_one(StepDetail))
        app.main.select("weird")
        await pilot.press("r")  # the step runs; its own output (with brackets) reaches the log
        await wait_for(pilot, lambda: any("[b]x" in ln for ln in log_lines(app)), what="log")
        assert app.is_running


async def test_fuzzed_strings_render_literally_in_every_widget(env):
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        detail = app.main.query_one(StepDetail)
        header = app.main.query_one(RunHeader)
        resources = app.main.query_one(ResourcesPanel)
        step = app.engine.rb.step("ok")

        @FUZZ
        @given(
            s=st.one_of(
                st.sampled_from(HOSTILE),
                MARKUPISH,
                st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=30),
            )
        )
        def check(s: str) -> None:
            fake = step.model_copy(update={"id": "x" + s, "title": s, "run": s})
            rec = StepRecord(status="failed", reason=s, message=s, host=s)
            guard = {"ok": False, "title": s, "message": s, "observed": {"path": s}}
            detail.show(fake, rec, 0.0, {"pre": (guard,)})
            shown = _plain(detail)
            assert s in shown and f"$ {s}" in shown and f"observed: path={s}" in shown
            header.set_run(s, s, False)
            header.set_connection(s, s, 1, s, s)
            assert shown_in(s, _plain(header))
            resources.update_sample(s, {"disk": [{"path": s, "error": s}], "gpu_error": s})
            assert f"{s} {s}" in resources.query_one("#disk").visual.plain
            app.notify(s)  # toasts: literal too (a MarkupError would raise here)

        check()
        await pilot.pause()
        assert app.is_running


def shown_in(s: str, plain: str) -> bool:
    return f"run {s} (new) · runbook {s}" in plain and f"host {s} · key {s}" in plain


async def test_confirmation_modal_shows_hostile_strings_literally(env):
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        s = HOSTILE[0] + HOSTILE[1] + HOSTILE[2]
        evidence = ({"ok": True, "title": s, "message": s, "observed": {"size": 1}},)
        app.run_worker(app.confirm(ConfirmRequest("destroy", s, s, s, evidence)), name="c")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the modal")
        await pilot.pause()
        texts = [w.visual.plain for w in app.screen.query("Static")]
        assert any(f"$ {s}" == t for t in texts) and any(s == t for t in texts)
        assert any(f"Destructive step: destroy — {s}" == t for t in texts)
