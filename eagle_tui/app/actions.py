"""What the operator's actions do: each calls an Engine method in an async worker of the app
(named groups, exit_on_error False; failures land in CockpitApp.on_worker_state_changed). The
only logic here is sequencing the operator's own requests (one driver per step; run-all waits
for a step that is already being driven, e.g. a reattached job), never deciding what runs: that
is the engine's. A composed object of the app (`app.actions`), not a mixin: it reaches the app
only through the few members named in `Host`."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from textual.worker import Worker
from textual.worker_manager import WorkerManager

from eagle_tui.app.screens.export import ExportRequest, export_audit
from runbook import audit as audit_mod
from runbook.engine import EXIT_OK, Engine
from runbook.events import BLOCKED, DONE, RUNNING, SKIPPED, TERMINAL_BAD
from runbook.state import StepRecord

STEP_GROUP, AUTO_GROUP, ENGINE_GROUP, GUARDS_GROUP, IO_GROUP = (
    "steps",
    "auto",
    "engine",
    "guards",
    "io",
)


class Host(Protocol):
    """What the actions need of the app: the engine, its workers, toasts, the header note."""

    engine: Engine
    opened: bool
    guards: dict[str, dict[str, tuple[dict[str, Any], ...]]]

    @property
    def workers(self) -> WorkerManager: ...
    @property
    def run_worker(self) -> Callable[..., Worker[Any]]: ...  # App.run_worker, keywords and all
    @property
    def notify(self) -> Callable[..., None]: ...  # App.notify
    def call_from_thread(self, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...
    def record(self, sid: str) -> StepRecord | None: ...
    def set_mode(self, mode: str) -> None: ...
    def ask(self, title: str, body: str, answered: Callable[[bool | None], None]) -> None: ...


class EngineActions:
    def __init__(self, app: Host) -> None:
        self.app = app
        self.driving: dict[str, Worker[Any]] = {}  # the worker driving each step

    @property
    def engine(self) -> Engine:
        return self.app.engine

    def notify(self, message: str, **kwargs: Any) -> None:
        self.app.notify(message, **kwargs)

    def record(self, sid: str) -> StepRecord | None:
        return self.app.record(sid)

    def _work(self, work: Coroutine[Any, Any, Any] | Callable[[], Any], **kwargs: Any) -> Worker:
        return self.app.run_worker(work, exit_on_error=False, **kwargs)

    def _busy(self, sid: str) -> bool:
        w = self.driving.get(sid)
        return w is not None and w.is_running

    def auto_running(self) -> bool:
        return any(w.is_running for w in self.app.workers if w.group == AUTO_GROUP)

    def _refuse_if_busy(self, sid: str) -> bool:
        if not self.app.opened:
            self.notify("the run is still opening", severity="warning")
            return True
        if self.auto_running():
            self.notify(
                "run-all is driving the steps; wait for it or cancel the running job",
                severity="warning",
            )
            return True
        if self._busy(sid):
            self.notify(f"{sid} is already being driven", severity="warning")
            return True
        return False

    def drive_step(self, sid: str) -> None:
        if self._refuse_if_busy(sid):
            return
        self.driving[sid] = self._work(self._run_step(sid), name=f"step:{sid}", group=STEP_GROUP)

    async def _run_step(self, sid: str) -> str:
        status = await self.engine.run_step(sid)
        self._maybe_finish()
        return status

    def drive_all(self, start: str | None, continued: bool = False) -> None:
        if not self.app.opened:
            self.notify("the run is still opening", severity="warning")
            return
        if self.auto_running():
            self.notify("run-all is already running", severity="warning")
            return
        shown = start or "the first step"
        self.app.set_mode(
            f"run-all from {shown} (continued; A stops it)" if continued else f"auto from {shown}"
        )
        self.engine.set_intent(start, None, "cockpit")  # saved before anything runs
        self._work(self._run_all(start), name=f"auto:{shown}", group=AUTO_GROUP)

    async def _run_all(self, start: str | None) -> int | None:
        try:
            # Steps already driven (e.g. a reattached job) finish first; run_all then continues.
            for sid, w in list(self.driving.items()):
                if w.is_running:
                    await w.wait()
                    rec = self.record(sid)
                    if rec is not None and rec.status not in DONE:
                        self.engine.clear_intent(f"{sid} ended {rec.status}")
                        self.notify(
                            f"run-all stopped: {sid} ended {rec.status}", severity="warning"
                        )
                        return None
            if self.engine.state is not None and self.engine.state.intent is None:
                return None  # stopped (A) while waiting for the reattached step
            return await self.engine.run_all(start=start, by="cockpit")
        finally:
            self.app.set_mode("")

    def continue_intent(self) -> None:
        """On opening: a run-all the last cockpit did not finish (quit, kill -9) goes on; one
        given by another driver (`--auto`, whose process died) is only offered: opening a view
        never starts execution on another driver's word."""
        intent = self.engine.state.intent if self.engine.state is not None else None
        if intent is None:
            return
        start = intent.only or intent.start or "the first step"
        if intent.by == "cockpit":
            self.notify(
                f"continuing run-all from {start} (given by the cockpit before the relaunch); "
                "press A to stop it after the running step",
                timeout=12,
            )
            self.drive_all(intent.start, continued=True)
            return

        def answered(yes: bool | None) -> None:
            if yes and intent.only is not None:  # `--only STEP`: that step, not a run-all
                self.engine.clear_intent(f"continued in the cockpit as {intent.only} alone")
                self.drive_step(intent.only)
            elif yes:
                self.drive_all(intent.start, continued=True)
            else:
                self.notify(
                    f"run-all from {start} not continued; nothing was started (a on a step runs "
                    "all from there, A forgets the saved run-all)",
                    timeout=12,
                )

        self.app.ask(
            f"continue run-all from {start}? [y/N]",
            f"A run-all from {start} was given by {intent.by} (eagle-tui run --auto), which is "
            "no longer running. Nothing runs unless you say so: y continues it from the first "
            "step that is not done; n (or Escape) leaves every step as it is.",
            answered,
        )

    def stop_all(self) -> None:
        """Withdraw the run-all intent: the running step finishes (nothing is killed), no next."""
        if not self.engine.clear_intent("stopped by the operator"):
            self.notify("no run-all to stop", severity="warning")
            return
        state = self.engine.state
        running = [s for s, r in state.steps.items() if r.status == RUNNING] if state else []
        self.notify(
            "run-all stopped"
            + (f"; {', '.join(running)} keeps running (x cancels it)" if running else ""),
        )
        self.app.set_mode("")

    def skip_step(self, sid: str, reason: str) -> None:
        if self._refuse_if_busy(sid):
            return
        self.driving[sid] = self._work(
            self._skip(sid, reason), name=f"skip:{sid}", group=STEP_GROUP
        )

    async def _skip(self, sid: str, reason: str) -> None:
        await self.engine.skip(sid, reason)
        self._maybe_finish()

    def retry_step(self, sid: str) -> None:
        if self._refuse_if_busy(sid):
            return
        rec = self.record(sid)
        if rec is not None and rec.status not in TERMINAL_BAD and rec.status != BLOCKED:
            self.notify(
                f"{sid} is {rec.status}: retry is for failed, lost, cancelled or blocked steps",
                severity="warning",
            )
            return
        self.engine.reset(sid)
        self.drive_step(sid)

    def undo_skip(self, sid: str) -> None:
        if self._refuse_if_busy(sid):
            return
        rec = self.record(sid)
        if rec is None or rec.status != SKIPPED:
            self.notify(
                f"{sid} is {rec.status if rec else 'unknown'}: only a skipped step can be unskipped",
                severity="warning",
            )
            return
        self.engine.unskip(sid)
        self.notify(f"{sid} is pending again (skip undone; audited)")

    def cancel_step(self, sid: str) -> None:
        self._work(self.engine.cancel(sid), name=f"cancel:{sid}", group=ENGINE_GROUP)

    def dry_run(self) -> None:
        if not self.app.opened:  # opening waits for the box: say why instead of nothing
            session = self.engine.sessions.get(self.engine.default_host)
            why = session.last_error if session is not None else None
            self.notify(
                "dry-run: the run is still opening"
                + (f": {why} (retrying; q quits)" if why else ""),
                severity="warning",
                timeout=10,
            )
            return
        self._work(self._dry_run(), name="dry-run", group=GUARDS_GROUP, exclusive=True)

    async def _dry_run(self) -> None:
        code = await self.engine.dry_run()
        report = self.engine.dry_report  # blocked: a guard nothing earlier changes; else pending
        blocked = [sid for sid, (state, _) in report.items() if state == "blocked"]
        pending = sum(1 for state, _ in report.values() if state == "pending")
        waits = f"; {pending} pending on earlier steps" if pending else ""
        if self.engine.dry_unreachable:
            hosts = "; ".join(
                f"{h}: {why.removeprefix(h + ': ')}"
                for h, why in self.engine.dry_unreachable.items()
            )
            blocked_too = f"; blocked: {', '.join(blocked)}" if blocked else ""
            self.notify(
                f"dry-run: guards not evaluated, host unreachable ({hosts}){blocked_too}{waits}; "
                "nothing changed",
                severity="error",
                timeout=12,
            )
        elif code == EXIT_OK:
            self.notify(f"dry-run: nothing blocked{waits}; nothing changed")
        else:
            self.notify(
                f"dry-run: would be blocked: {', '.join(blocked)}{waits}; nothing changed",
                severity="warning",
                timeout=8,
            )

    def export(self, req: ExportRequest) -> None:
        store, state = self.engine.store, self.engine.state
        if store is None or state is None:
            self.notify("no audit log yet", severity="warning")
            return
        head = (
            audit_mod.Head(self.engine.audit.head.seq, self.engine.audit.head.hash)
            if self.engine.audit
            else None
        )

        def work() -> None:
            res = export_audit(store.audit_path, head, req)
            self.app.call_from_thread(
                self.notify,
                f"wrote {res.path} ({res.records} records, chain {'verified' if res.chain_ok else 'NOT OK: ' + str(res.problem)})",
                severity="information" if res.chain_ok else "error",
                timeout=8,
            )

        self._work(work, name="export", group=IO_GROUP, thread=True)

    def _maybe_finish(self) -> None:
        """Single-step runs do not go through run_all: finish the run once every step is done."""
        state = self.engine.state
        if (
            state is not None
            and state.all_done()
            and not state.finished
            and not self.auto_running()
        ):
            self.engine.finish(EXIT_OK)
