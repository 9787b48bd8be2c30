"""The cockpit's main screen: header, todo list, resources, step detail, progress, log/curves.

Every action here is a Binding with a stable id (user keymaps override keys by id; the command
palette lists them). Actions gather the operator's input (selection, reasons, confirmations) and
hand the work to the app, which drives the engine in workers. The screen reaches the app only
through its port (`eagle_tui/app/port.py`), given at construction: it never imports the app."""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import suppress
from typing import TypeVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, TabbedContent, TabPane

from eagle_tui.app import messages as msg
from eagle_tui.app.port import Cockpit, Verbs
from eagle_tui.app.screens.dialogs import AskScreen, ReasonScreen
from eagle_tui.app.screens.export import ExportScreen
from eagle_tui.app.screens.help import HelpScreen
from eagle_tui.app.screens.runs import RunPickerScreen
from eagle_tui.app.widgets.host.header import RunHeader
from eagle_tui.app.widgets.host.resources import ResourcesPanel
from eagle_tui.app.widgets.logs.full_log import FullLogScreen
from eagle_tui.app.widgets.logs.live_log import LiveLog
from eagle_tui.app.widgets.progress.curves import Curves
from eagle_tui.app.widgets.progress.progress import StepProgress
from eagle_tui.app.widgets.steps.detail import StepDetail
from eagle_tui.app.widgets.steps.todo_list import TodoList
from runbook.events import DONE, RUNNING

H = TypeVar("H")


def while_mounted(handler: Callable[[MainScreen, H], None]) -> Callable[[MainScreen, H], None]:
    """An engine event arriving while the app shuts down finds the widgets gone: drop it."""

    @functools.wraps(handler)
    def run(self: MainScreen, message: H) -> None:
        with suppress(NoMatches):
            handler(self, message)

    return run


# (key, action, description, id): the ids are the stable names a user keymap uses.
ACTIONS: list[tuple[str, str, str, str]] = [
    ("r", "run_selected", "Run step", "run-selected"),
    ("n", "run_next", "Run next", "run-next"),
    ("a", "run_all", "Run all from here", "run-all"),
    ("A", "stop_all", "Stop run-all", "stop-all"),
    ("s", "skip", "Skip", "skip"),
    ("u", "undo_skip", "Undo skip", "undo-skip"),
    ("R", "retry", "Retry", "retry"),
    ("x", "cancel_job", "Cancel job", "cancel"),
    ("f", "toggle_follow", "Follow log", "toggle-follow"),
    ("l", "full_log", "Full log", "full-log"),
    ("d", "dry_run", "Dry-run guards", "dry-run"),
    ("e", "export_audit", "Export audit", "export-audit"),
    ("c", "toggle_curves", "Log/curves", "toggle-curves"),
    ("end,ctrl+end", "log_end", "Log: to the end, follow", "log-end"),
    ("home,ctrl+home", "log_home", "Log: to the top", "log-home"),
    ("o", "pick_run", "Open a run", "runs"),
    ("question_mark,f1", "help", "Help", "help"),
    ("q", "quit_app", "Quit", "quit"),
]
# Keys the focused todo list would otherwise take (DataTable binds home/end to its own rows).
PRIORITY = {"log_end", "log_home"}
HELP = {
    "log_end": "Scroll the log pane to its last line and follow it from there",
    "log_home": "Scroll the log pane to its first line (stops following)",
    "run_selected": "Run the selected step (reattaches if it is running)",
    "run_next": "Run the first step that is not done",
    "run_all": "Run every step from the selected one, stopping at confirmations and failures",
    "stop_all": "Withdraw run-all: the running step finishes (nothing is killed), no next step starts",
    "skip": "Skip the selected step (asks for a reason; audited)",
    "undo_skip": "Make an operator-skipped step pending again (audited); it does not run it",
    "pick_run": "List this runbook's runs and open one (quits this one the way q does)",
    "help": "Show every key and what it does",
    "retry": "Make a failed/blocked/cancelled step runnable again and run it",
    "cancel_job": "Cancel the selected running job (asks first; kills its process group)",
    "toggle_follow": "Follow the log tail and the running step, or stop following",
    "full_log": "Page through the selected step's complete log on disk",
    "dry_run": "Evaluate every guard now and show the observed values; changes nothing",
    "export_audit": "Export the audit log as Markdown, JSONL or CSV",
    "toggle_curves": "Switch between the live log and the training curves",
    "quit_app": "Quit; asks first while a bound step runs (it dies); detached jobs keep running",
}


# The footer shows bindings in order and cuts what does not fit: how to quit, get help and read
# the whole log come first; the log pane's Home/End are in the help, not the footer.
FOOTER_FIRST = ("quit_app", "help", "full_log")
NOT_IN_FOOTER = {"log_end", "log_home"}


class MainScreen(Screen[None]):
    BINDINGS = [
        Binding(k, a, d, id=i, tooltip=HELP[a], priority=a in PRIORITY, show=a not in NOT_IN_FOOTER)
        for k, a, d, i in sorted(ACTIONS, key=lambda x: x[1] not in FOOTER_FIRST)
    ]

    def __init__(self, cockpit: Cockpit) -> None:
        super().__init__(id="main")
        self.cockpit = cockpit  # the data shown here (records, guards, metrics, the clock)
        self.selected: str | None = None
        self.follow = True

    @property
    def actions(self) -> Verbs:
        """Where the operator's commands go."""
        return self.cockpit.actions

    def compose(self) -> ComposeResult:
        yield RunHeader(id="header")
        with Horizontal(id="body"):
            with Vertical(id="left"):
                yield TodoList(id="steps")
                yield ResourcesPanel(id="resources")
            with Vertical(id="right"):
                yield StepDetail(id="detail")
                yield StepProgress(id="progress")
                with TabbedContent(id="views"):
                    with TabPane("Log", id="tab-log"):
                        yield LiveLog(id="live-log")
                    with TabPane("Curves", id="tab-curves"):
                        yield Curves(id="curves")
        yield Footer()

    def on_mount(self) -> None:
        app = self.cockpit
        todo = self.query_one(TodoList)
        todo.set_steps([(s.id, s.title) for s in app.runbook.steps])
        self.query_one(RunHeader).default_host = app.default_host
        self.query_one(RunHeader).set_run(app.run_id, app.runbook.name, False)
        self.set_interval(1.0, self._tick, name="durations")
        todo.focus()

    # ------------------------------------------------------------------ view updates
    def refresh_step(self, sid: str) -> None:
        app = self.cockpit
        rec = app.record(sid)
        if rec is None:
            return
        step = app.runbook.step(sid)
        guards = app.guard_results(sid)
        self.query_one(TodoList).update_step(
            sid, step.title, rec, app.clock(), guards, rec.status == RUNNING
        )
        if sid == self.selected:
            self.query_one(StepDetail).show(step, rec, app.clock(), app.guards_of(sid))

    def refresh_all(self) -> None:
        for sid in self.cockpit.runbook.step_ids:
            self.refresh_step(sid)

    def _tick(self) -> None:
        app = self.cockpit
        for sid in app.runbook.step_ids:
            rec = app.record(sid)
            if rec is not None and rec.status == RUNNING:
                if sid == self.selected:
                    self.refresh_step(sid)  # its row and the detail's running time
                else:
                    self.query_one(TodoList).update_duration(sid, rec, app.clock())

    def select(self, sid: str, move_cursor: bool = True, force: bool = False) -> None:
        """`force`: show it even if it is already the selection (the run has just opened: the
        row highlighted before the state was read showed nothing yet)."""
        if move_cursor:
            self.query_one(TodoList).select_step(sid)  # posts RowHighlighted -> show()
        if force or sid != self.selected:
            self.show(sid)

    def show(self, sid: str) -> None:
        app = self.cockpit
        self.selected = sid
        rec = app.record(sid)
        if rec is None:
            return
        self.refresh_step(sid)
        self.query_one(StepProgress).show(rec.progress, rec.status)
        self.query_one(LiveLog).show(sid, rec.log_file, rec.log_mirror_size)
        self.query_one(Curves).show(app.metrics_for(sid))

    @on(TodoList.StepHighlighted)
    def _highlighted(self, event: TodoList.StepHighlighted) -> None:
        if event.step_id != self.selected:
            self.show(event.step_id)

    # ------------------------------------------------------------------ engine events
    # Each kind its own handler; the app handles what is not the screen's (toasts, host trust)
    # when the message bubbles on. While the app shuts down, widgets may already be gone.
    @on(msg.LogArrived)
    @while_mounted
    def _log(self, m: msg.LogArrived) -> None:
        ev = m.event
        self.query_one(LiveLog).on_chunk(ev.step_id, ev.text, m.log_file, m.mirror_end)

    @on(msg.StepChanged)
    @while_mounted
    def _step_changed(self, m: msg.StepChanged) -> None:
        ev, app = m.event, self.cockpit
        self.refresh_step(ev.step_id)
        if ev.status == RUNNING and self.follow and ev.step_id != self.selected:
            self.select(ev.step_id)
        elif ev.step_id == self.selected:
            rec = app.record(ev.step_id)
            if ev.status != RUNNING:
                self.query_one(LiveLog).end_of_job(ev.step_id)
            elif rec is not None and rec.log_file != self.query_one(LiveLog).source:
                self.show(ev.step_id)  # a new attempt: its own log and curves
            if rec is not None:
                self.query_one(StepProgress).show(rec.progress, rec.status)

    @on(msg.ProgressArrived)
    @while_mounted
    def _progress(self, m: msg.ProgressArrived) -> None:
        ev = m.event
        if ev.step_id == self.selected:
            rec = self.cockpit.record(ev.step_id)
            self.query_one(StepProgress).show(ev.record, rec.status if rec else None)
        self.refresh_step(ev.step_id)

    @on(msg.MetricsArrived)
    @while_mounted
    def _metrics(self, m: msg.MetricsArrived) -> None:
        ev = m.event
        if (
            self.cockpit.add_metrics(ev.step_id, ev.record, m.log_file, m.mirror_end)
            and ev.step_id == self.selected
        ):
            self.query_one(Curves).changed()

    @on(msg.GuardsArrived)
    @while_mounted
    def _guards(self, m: msg.GuardsArrived) -> None:
        self.refresh_step(m.event.step_id)

    @on(msg.HostStatsArrived)
    @while_mounted
    def _stats(self, m: msg.HostStatsArrived) -> None:
        if m.event.host == self.cockpit.default_host:
            self.query_one(ResourcesPanel).update_sample(m.event.host, m.event.sample)

    @on(msg.ConnectionChanged)
    @while_mounted
    def _connection(self, m: msg.ConnectionChanged) -> None:
        ev = m.event
        self.query_one(RunHeader).set_connection(
            ev.host, ev.state, ev.attempt, ev.message, ev.host_key
        )

    @on(msg.RunStarted)
    @while_mounted
    def _run_started(self, m: msg.RunStarted) -> None:
        self.query_one(RunHeader).set_run(m.event.run_id, m.event.runbook, m.event.resumed)

    @on(msg.RunFinished)
    @while_mounted
    def _run_finished(self, m: msg.RunFinished) -> None:
        self.query_one(RunHeader).set_mode("")

    def curves_changed(self, sid: str) -> None:
        if sid == self.selected and self.is_mounted:
            with suppress(NoMatches):  # a scan finishing while the app shuts down
                self.query_one(Curves).show(self.cockpit.metrics_for(sid))

    def set_mode(self, mode: str) -> None:
        """Header note (auto mode, follow off); safe while the app shuts down."""
        if self.is_mounted:
            with suppress(NoMatches):
                self.query_one(RunHeader).set_mode(mode)

    # ------------------------------------------------------------------ actions
    def _need_selection(self) -> str | None:
        if self.selected is None:
            self.notify("select a step first", severity="warning")
        return self.selected

    def action_run_selected(self) -> None:
        if (sid := self._need_selection()) is not None:
            self.actions.drive_step(sid)

    def action_run_next(self) -> None:
        sid = self.cockpit.next_step()
        if sid is None:
            self.notify("every step is done")
            return
        self.select(sid)
        self.actions.drive_step(sid)

    def action_run_all(self) -> None:
        if (sid := self._need_selection()) is not None:
            self.actions.drive_all(sid)

    def action_stop_all(self) -> None:
        self.actions.stop_all()

    def action_skip(self) -> None:
        sid = self._need_selection()
        if sid is None:
            return
        rec = self.cockpit.record(sid)
        if rec is not None and (rec.status in DONE or rec.status == RUNNING):
            self.notify(f"{sid} is {rec.status}: nothing to skip", severity="warning")
            return

        def done(reason: str | None) -> None:
            if reason:
                self.actions.skip_step(sid, reason)

        leaves = self.cockpit.runbook.step(sid).skipping_leaves
        body = "The reason is written to the audit log."
        if leaves:  # the runbook says what a skip of this step leaves on the box
            body = f"Skipping it leaves {leaves}.\n{body}"
        self.app.push_screen(ReasonScreen(f"Skip {sid}?", body), done)

    def action_undo_skip(self) -> None:
        if (sid := self._need_selection()) is not None:
            self.actions.undo_skip(sid)

    def action_pick_run(self) -> None:
        app = self.cockpit

        def done(run_id: str | None) -> None:
            if run_id and run_id != app.run_id:
                app.switch_run(run_id)

        self.app.push_screen(RunPickerScreen(app.runs(), app.run_id, app.runbook.name), done)

    def action_help(self) -> None:
        keymap = self.app._keymap  # the user's keymap, where it rebinds an id
        rows = [(keymap.get(bid, key), bid, HELP[action]) for key, action, _, bid in ACTIONS]
        rows.append(("ctrl+p", "", "Command palette: every action above, by name"))
        self.app.push_screen(HelpScreen(rows))

    def action_retry(self) -> None:
        if (sid := self._need_selection()) is not None:
            self.actions.retry_step(sid)

    def action_cancel_job(self) -> None:
        sid = self._need_selection()
        if sid is None:
            return
        rec = self.cockpit.record(sid)
        if rec is None or rec.status != RUNNING:
            self.notify(f"{sid} is not running", severity="warning")
            return

        def done(yes: bool | None) -> None:
            if yes:
                self.actions.cancel_step(sid)

        self.app.push_screen(
            AskScreen(
                f"Cancel {sid}?",
                f"Job {rec.job_id} on {rec.host or 'local'}: its whole process group gets TERM, then KILL "
                "after a grace period. The step ends as cancelled.",
                yes="Cancel the job",
                no="Keep it running",
            ),
            done,
        )

    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        self.query_one(LiveLog).set_follow(self.follow)
        self.query_one(RunHeader).set_mode("" if self.follow else "log follow off")

    def action_log_end(self) -> None:
        self.follow = True
        self.query_one(LiveLog).set_follow(True)  # flushes and scrolls to the last line
        self.query_one(RunHeader).set_mode("")

    def action_log_home(self) -> None:
        self.follow = False
        log = self.query_one(LiveLog)
        log.set_follow(False)
        log.scroll_home(animate=False, immediate=True)
        self.query_one(RunHeader).set_mode("log follow off")

    def action_full_log(self) -> None:
        sid = self._need_selection()
        if sid is None:
            return
        rec = self.cockpit.record(sid)
        if rec is None or not rec.log_file:
            self.notify(f"{sid} has no log yet", severity="warning")
            return
        label = f"{sid} · attempt {rec.attempt} · {rec.log_file.rsplit('/', 1)[-1]}"
        self.app.push_screen(
            FullLogScreen(rec.log_file, label, limit=lambda: self.cockpit.mirror_limit(sid))
        )

    def action_dry_run(self) -> None:
        self.actions.dry_run()

    def action_export_audit(self) -> None:
        def done(req) -> None:
            if req is not None:
                self.actions.export(req)

        self.app.push_screen(ExportScreen(self.cockpit.run_id, self.cockpit.export_dir), done)

    def action_toggle_curves(self) -> None:
        tabs = self.query_one(TabbedContent)
        tabs.active = "tab-curves" if tabs.active == "tab-log" else "tab-log"

    def action_quit_app(self) -> None:
        self.cockpit.request_quit()
