"""The Textual cockpit: a view on the engine, never a second executor.

Every operator action calls an Engine method in an async worker (named groups, exit_on_error
False); failures are handled in one place (`on_worker_state_changed`): a notification for the
operator's mistakes, a modal for anything else, never a crash. Engine events arrive through a
listener that posts messages; the engine runs on this app's asyncio loop.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from textual import on
from textual.app import App, SystemCommand
from textual.notifications import SeverityLevel
from textual.reactive import Reactive
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from eagle_tui.app import messages as msg
from eagle_tui.app.actions import (
    AUTO_GROUP,
    ENGINE_GROUP,
    GUARDS_GROUP,
    IO_GROUP,
    STEP_GROUP,
    EngineActions,
)
from eagle_tui.app.messages import message_for
from eagle_tui.app.palette import READABLE_DARK
from eagle_tui.app.port import GuardsByPhase
from eagle_tui.app.quitting import LiveWork, ask_text, live_work
from eagle_tui.app.reachability import Reachability
from eagle_tui.app.screens.confirm import ConfirmScreen
from eagle_tui.app.screens.dialogs import AskScreen, ErrorScreen
from eagle_tui.app.screens.main import ACTIONS, HELP, MainScreen
from eagle_tui.app.trust import HostTrust
from eagle_tui.app.widgets.progress.metrics import Metrics, StepMetrics, scan_metrics
from runbook import audit as audit_mod
from runbook.agent_client import AgentError
from runbook.audit_seal import AuditBreak
from runbook.box_claim import EXIT_LOCKED, DriverLocked
from runbook.engine import EXIT_OK, Confirmation, Confirmer, ConfirmRequest, Engine
from runbook.engine.constants import EXIT_MEANINGS
from runbook.escape import terminal
from runbook.events import (
    BLOCKED,
    DONE,
    RUNNING,
    TERMINAL_BAD,
    Event,
    GuardsEvaluated,
    LogChunk,
    MetricsUpdate,
    ProgressUpdate,
)
from runbook.plan import ordered_steps
from runbook.schema import Runbook
from runbook.state import RunLocked, RunState, StateWriteError, StepRecord, list_runs
from runbook.transports import TransportError, TransportOptions

OPERATOR_ERRORS = (ValueError, KeyError)  # refused actions (e.g. skipping a running step)

# builds the app's engine with the app as its listener and confirmer (eagle_tui/app/launch.py)
EngineFactory = Callable[[Callable[[Event], None], Confirmer], Engine]


class CockpitApp(App[int]):
    CSS_PATH = Path(__file__).parent / "cockpit.tcss"  # absolute: subclasses live elsewhere
    TITLE = "eagle-tui"
    ansi_theme_dark = Reactive(READABLE_DARK, init=False)  # ANSI colour names, readable

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Toasts carry user strings (step ids, paths, errors) and never our markup: literal."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=False)

    def __init__(
        self,
        make_engine: EngineFactory,
        run_id: str,
        *,
        options: TransportOptions | None = None,
        clock: Callable[[], float] = time.time,
        keymap: dict[str, str] | None = None,
        keymap_problems: Iterable[str] = (),
        connect: bool = True,
        reattach: bool = True,
        select: str | None = None,
        export_dir: Path | None = None,
    ) -> None:
        super().__init__()
        self.engine = make_engine(self.engine_listener, self.confirm)  # events + confirmations
        self.run_id = run_id
        self.refusal: str | None = None
        self.options = options
        self.clock = clock
        self.connect = connect
        self.reattach = reattach
        self.initial_selection = select
        self.export_dir = export_dir or Path.cwd()
        self.keymap_problems = list(keymap_problems)
        self.guards: dict[str, dict[str, tuple[dict[str, Any], ...]]] = {}
        self.metrics: dict[str, StepMetrics] = {}
        self.opened = False
        self.closing = False
        self.quit_work: LiveWork | None = None
        self._engine_closed: asyncio.Future[None] | None = None  # the engine's one close
        self.reachability = Reachability()
        self.next_run: str | None = None  # the run picker's choice: run_app opens it next
        self.trust = HostTrust(self)  # unknown host keys: ask, then reconnect trusting
        self.actions = EngineActions(self)  # the operator's commands, a composed object
        self.main = MainScreen(self)  # its port (eagle_tui/app/port.py) onto this app
        if keymap:
            self.set_keymap(keymap)

    # ------------------------------------------------------------------ engine bridge
    def engine_listener(self, event: Event) -> None:
        """Called synchronously by the engine: note what the app keeps, wrap, post; never block
        it. The main screen handles the message first, then it bubbles here (the toasts)."""
        log_file, end = None, 0
        if isinstance(event, (LogChunk, MetricsUpdate, ProgressUpdate)):
            rec = self.record(event.step_id)
            if rec is not None:
                log_file, end = rec.log_file, rec.log_mirror_size
        elif isinstance(event, GuardsEvaluated):  # before the screen shows the step
            self.guards.setdefault(event.step_id, {})[event.phase] = event.results
        self.main.post_message(message_for(event, log_file, end))

    @on(msg.NoticeArrived)
    def _notice(self, m: msg.NoticeArrived) -> None:
        ev = m.event
        levels: dict[str, SeverityLevel] = {"warning": "warning", "error": "error"}
        self.notify(
            terminal(ev.message),  # a notice may quote the box
            severity=levels.get(ev.level, "information"),
        )

    @on(msg.RunFinished)
    def _run_finished(self, m: msg.RunFinished) -> None:
        ev = m.event
        self.notify(
            f"run finished: exit {ev.exit_code} ({EXIT_MEANINGS.get(ev.exit_code, 'see --help')}) "
            f"· audit head seq {ev.audit_seq} {ev.audit_head[:16]}…",
            severity="information" if ev.exit_code == EXIT_OK else "warning",
            timeout=8,
        )

    @on(msg.ConnectionChanged)
    def _connection(self, m: msg.ConnectionChanged) -> None:
        ev = m.event
        if ev.state == "failed" and ev.message:
            if ev.refused_key is not None:  # fields, not the message, say what is offered
                self.trust.offer_trust(ev.host, ev.refused_key, ev.message)
        elif line := self.reachability.update(
            ev.host, ev.state, ev.attempt, ev.message, self._ssh_target(ev.host)
        ):
            self.notify(line, severity="error", timeout=30)

    def _ssh_target(self, host: str) -> str:
        config = self.engine.rb.hosts.get(host)
        return getattr(config, "ssh", None) or host

    # ------------------------------------------------------------------ the screen's port
    # (eagle_tui/app/port.py `Cockpit`, with run_id, export_dir, clock and actions above)
    @property
    def runbook(self) -> Runbook:
        return self.engine.rb  # live: opening may reload it for the re-chosen run

    @property
    def default_host(self) -> str:
        return self.engine.default_host

    def runs(self) -> list[RunState]:
        """This runbook's runs, for the run picker."""
        return list_runs(self.engine.state_dir, self.engine.rb.name)

    def record(self, sid: str) -> StepRecord | None:
        state = self.engine.state
        return state.steps.get(sid) if state is not None else None

    def set_mode(self, mode: str) -> None:
        """The header's note (run-all, follow off)."""
        self.main.set_mode(mode)

    def ask(self, title: str, body: str, answered: Callable[[bool | None], None]) -> None:
        """A yes/no question (no is the default: Escape and n)."""
        self.push_screen(AskScreen(title, body, yes="Yes, continue", no="No"), answered)

    def guards_of(self, sid: str) -> GuardsByPhase:
        return self.guards.get(sid, {})

    def guard_results(self, sid: str) -> list[dict[str, Any]]:
        by_phase = self.guards.get(sid, {})
        if by_phase:
            return [g for phase in ("skip_if", "pre", "post") for g in by_phase.get(phase, ())]
        rec = self.record(sid)
        return list(rec.guards) if rec is not None else []

    def mirror_limit(self, sid: str) -> int | None:
        rec = self.record(sid)
        return rec.log_mirror_size if rec is not None else None

    # ------------------------------------------------------------------ curves
    def metrics_for(self, sid: str) -> Metrics | None:
        """The selected step's curves, scanning its mirror (in a thread) the first time."""
        rec = self.record(sid)
        if rec is None or not rec.log_file:
            return None
        m = self.metrics.get(sid)
        if m is None or m.source != rec.log_file:
            m = self.metrics[sid] = StepMetrics(rec.log_file, rec.log_mirror_size)
            if not m.ready:
                self._scan(sid, m)
        return m.metrics

    def _scan(self, sid: str, m: StepMetrics) -> None:
        def work() -> None:
            records = scan_metrics(m.source or "", m.scan_end)
            self.call_from_thread(self._scanned, sid, m, records)

        self.run_worker(work, name=f"scan:{sid}", group=IO_GROUP, thread=True, exit_on_error=False)

    def _scanned(self, sid: str, m: StepMetrics, records: list[dict[str, Any]]) -> None:
        m.scanned(records)
        if self.metrics.get(sid) is m:
            self.main.curves_changed(sid)

    def add_metrics(
        self, sid: str, record: dict[str, Any], log_file: str | None, mirror_end: int
    ) -> bool:
        m = self.metrics.get(sid)
        if m is None or m.source != log_file:
            if sid != self.main.selected:
                return False  # scanned from the mirror when the step is selected
            self.metrics_for(sid)
            m = self.metrics.get(sid)
            if m is None:
                return False
        return m.add_live(record, mirror_end)

    # ------------------------------------------------------------------ lifecycle
    async def on_mount(self) -> None:
        await self.push_screen(self.main)  # widgets exist before the engine's first event
        for problem in self.keymap_problems:
            self.notify(problem, severity="warning", timeout=10)
        self.run_worker(self._open(), name="open", group=ENGINE_GROUP, exit_on_error=False)

    async def _open(self) -> None:
        self.run_id = await self.engine.open(self.run_id)  # re-chosen under the driver claim
        self.recall_guards()
        self.opened = True
        self.main.refresh_all()
        running = [
            sid
            for sid in ordered_steps(self.engine.rb)
            if (r := self.record(sid)) is not None and r.status == RUNNING and r.job_id
        ]
        first = (
            self.initial_selection
            or (running[0] if running else self.next_step())
            or self.engine.rb.steps[0].id
        )
        self.main.select(first, force=True)  # its detail, log tail and curves from the mirror
        if self.reattach:
            for sid in running:  # the engine follows the job from its saved cursor
                self.actions.drive_step(sid)
            self.actions.continue_intent()  # a run-all the last cockpit did not finish goes on
        if self.connect:
            await self.engine.session(self.engine.default_host)  # stats + connection state now

    def recall_guards(self) -> None:
        """A reopened run shows the guards and proofs its steps were judged by, as recorded in
        its audit (the latest of each phase per step), not "not evaluated yet"; what is
        evaluated from now on replaces them."""
        store = self.engine.store
        if store is None or not store.audit_path.exists():
            return
        steps = set(self.engine.rb.step_ids)
        for record in audit_mod.read_records(store.audit_path):
            sid = record.get("step")
            if record.get("event") != "step.state" or sid not in steps:
                continue
            for key, default in (("guards", "pre"), ("postconditions", "post")):
                results = record.get(key)
                if not isinstance(results, list) or not results:
                    continue
                by_phase: dict[str, list[dict[str, Any]]] = {}
                for r in results:
                    if isinstance(r, dict):
                        by_phase.setdefault(str(r.get("phase") or default), []).append(r)
                for phase, rs in by_phase.items():
                    self.guards.setdefault(sid, {})[phase] = tuple(rs)

    def next_step(self) -> str | None:
        for sid in ordered_steps(self.engine.rb):
            rec = self.record(sid)
            if rec is not None and rec.status not in DONE:
                return sid
        return None

    # ------------------------------------------------------------------ confirmations
    async def confirm(self, req: ConfirmRequest) -> Confirmation | None:
        """The engine's Confirmer: a typed confirmation modal."""
        fut: asyncio.Future[Confirmation | None] = asyncio.get_running_loop().create_future()

        def done(result: Confirmation | None) -> None:
            if not fut.done():
                fut.set_result(result)

        if self.main.is_mounted:
            self.main.select(req.step_id)
        self.push_screen(ConfirmScreen(req, self.engine.rb.step(req.step_id)), done)
        result = await fut
        if result is None:
            self.notify(f"{req.step_id} not confirmed: it stays blocked", severity="warning")
        return result

    # ------------------------------------------------------------------ errors, in one place
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        w = event.worker
        if event.state != WorkerState.ERROR:
            return
        err = w.error
        if isinstance(err, TransportError):
            found = err.host_key
            if found is not None and found.kind == "unknown":
                sid = w.name.split(":", 1)[1] if w.name.startswith("step:") else None
                host = (
                    self.engine.host_of(self.engine.rb.step(sid))
                    if sid
                    else self.engine.default_host
                )
                self.trust.offer_trust(host, found, str(err))
                return
            self.notify(f"{w.name}: {err}", severity="error", timeout=10)
            return
        if w.name == "open":
            if isinstance(err, (RunLocked, DriverLocked)):
                # Another driver holds the run: nothing to show here; the one line naming the
                # holder is printed after exit (run_app), with the documented exit code 4.
                self.refusal = str(err)
                self.exit(EXIT_LOCKED)
                return
            known = (AuditBreak, StateWriteError, AgentError)  # AgentError: spool_unusable
            why = str(err) if isinstance(err, known) else "".join(traceback.format_exception(err))
            self.refusal = str(err) if isinstance(err, known) else None  # printed after exit
            self.push_screen(ErrorScreen("Cannot open the run", why), lambda _: self.exit(2))
            return
        if isinstance(err, OPERATOR_ERRORS):
            self.notify(f"{w.name}: {err}", severity="warning", timeout=6)
            return
        self.push_screen(
            ErrorScreen(f"{w.name} failed", "".join(traceback.format_exception(err))[-3000:])
        )

    # ------------------------------------------------------------------ quitting
    def request_quit(self) -> None:
        """Quit; while a bound step runs, first ask, naming what dies and what survives."""
        if self.closing or isinstance(self.screen, AskScreen):
            return
        work = live_work(self.engine)
        if not work.bound:
            self._start_quit(work)
            return
        title, body = ask_text(work)

        def answered(yes: bool | None) -> None:
            if yes:
                self._start_quit(live_work(self.engine))
            else:
                self.next_run = None  # staying on this run

        self.push_screen(AskScreen(title, body, yes="Quit and kill", no="Keep running"), answered)

    def switch_run(self, run_id: str) -> None:
        """Open another run: quit this one as `q` does (asking first), then run_app opens it."""
        self.next_run = run_id
        self.request_quit()

    def _start_quit(self, work: LiveWork) -> None:
        if not self.closing:
            self.closing = True
            self.quit_work = work  # what the farewell lines report (the state still says running)
            self.run_worker(self._quit(), name="quit", group="quit", exit_on_error=False)

    async def action_quit(self) -> None:
        self.request_quit()

    def action_help_quit(self) -> None:
        """Ctrl+C does not quit (a reflex must not kill bound jobs): say which key does, in plain
        text (Textual's own toast carries markup, which our literal toasts would show raw)."""
        keys = self._keymap.get("quit", "q").split(",")[0]
        self.notify(
            f"Press {keys} (or ctrl+q) to quit; ctrl+c does not quit the cockpit",
            title="Do you want to quit?",
        )

    async def _quit(self) -> None:
        """Stop following jobs (they keep running on the box), release the run, exit."""
        try:
            busy = [
                w
                for w in self.workers
                if w.group in (STEP_GROUP, AUTO_GROUP, GUARDS_GROUP) and w.is_running
            ]
            for w in busy:
                w.cancel()
            if busy:
                await self.workers.wait_for_complete(busy)
            await asyncio.wait_for(asyncio.shield(self._close_engine()), 30)
        finally:
            self.exit(self.exit_code_for_state())

    def _close_engine(self) -> asyncio.Future[None]:
        """The engine's close, once, as a task of its own: the app's exit cancels every worker,
        the quit worker too, and a close cut short leaves agents and the run lock open past
        the loop; on_unmount awaits the same task to its end."""
        if self._engine_closed is None:
            self._engine_closed = asyncio.ensure_future(self.engine.close())
        return self._engine_closed

    async def on_unmount(self) -> None:
        # However the app ends (quit action, test harness, error), let go of the agents and the
        # run lock on this loop; the jobs themselves keep running.
        if self._engine_closed is None and self.engine.closed:
            return  # closed by someone else
        try:
            await asyncio.wait_for(asyncio.shield(self._close_engine()), 30)
        except Exception:  # the app is ending: a failed goodbye must not mask the real exit
            pass

    def exit_code_for_state(self) -> int:
        state = self.engine.state
        if state is None:
            return 0
        statuses = {r.status for r in state.steps.values()}
        if statuses & set(TERMINAL_BAD):
            return 1
        return 3 if BLOCKED in statuses else 0

    def jobs_left_running(self) -> list[str]:
        """The detached steps still running on the box (bound ones die with the cockpit)."""
        return (self.quit_work or live_work(self.engine)).detached

    # ------------------------------------------------------------------ command palette
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        if isinstance(screen, MainScreen):
            for key, action, desc, bid in ACTIONS:
                shown = self._keymap.get(bid, key)  # the user's keymap, if it rebinds this id
                yield SystemCommand(
                    f"{desc} [{shown}]", HELP[action], lambda a=action, s=screen: s.run_action(a)
                )
        yield from super().get_system_commands(screen)
