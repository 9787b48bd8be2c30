"""`--auto` output: the todo list with live states, streamed job logs and progress, in plain text
when stdout is not a terminal (CI logs) and as a live Rich display when it is."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from eagle_tui.app.widgets.logs.feed import read_tail
from eagle_tui.present import guards as guard_view
from eagle_tui.present.status import ICONS, STYLES, progress_text
from remote_agent.wire.progress import PREFIX as PROGRESS_PREFIX
from runbook.engine.constants import EXIT_INTERRUPTED, EXIT_MEANINGS, EXIT_OK
from runbook.escape import log_line, terminal
from runbook.events import (
    DONE,
    PENDING,
    RUNNING,
    SUCCEEDED,
    TERMINAL_BAD,
    ConnectionChanged,
    DryRunStep,
    Event,
    GuardsEvaluated,
    LogChunk,
    Notice,
    ProgressUpdate,
    RunFinished,
    RunStarted,
    StepChanged,
)
from runbook.logsplit import LineClip
from runbook.state import StepRecord
from runbook.units import format_duration

FAILURE_TAIL = 20  # lines of a failed step's log shown with --quiet


class HeadlessView:
    def __init__(
        self,
        step_titles: dict[str, str],
        console: Console | None = None,
        show_logs: bool = True,
        dry_run: bool = False,
    ) -> None:
        self.dry_run = dry_run  # list every guard with its observed value, under its step
        self.dry_run_done = False  # the dry run evaluated every step (its verdict is whole)
        self.console = console or Console(highlight=False, soft_wrap=True)
        self.live_mode = self.console.is_terminal
        self.titles = {sid: terminal(t) for sid, t in step_titles.items()}  # box-free, yet
        # a title may carry bidi or control characters: shown escaped like job output
        self.status = {sid: PENDING for sid in step_titles}
        self.reasons: dict[str, str | None] = {}
        self.started: dict[str, float] = {}
        self.durations: dict[str, float] = {}
        self.progress: dict[str, str] = {}
        self.connection = ""
        self.show_logs = show_logs
        self._partial: dict[str, LineClip] = {}  # each step's line in progress, bounded
        self._progress_printed: dict[str, float] = {}
        self._dry_guards: dict[str, list[Text]] = {}
        self.live: Live | None = None
        self.replaying = False  # a resumed run's states, replayed as it opens: earlier news
        # the engine's records (log file per step), for a failed step's log path and tail
        self.record_of: Callable[[str], StepRecord | None] = lambda sid: None
        self._guards_said: set[str] = set()  # steps whose blocking guard lines were printed

    # -------------------------------------------------------------- lifecycle
    def __enter__(self) -> HeadlessView:
        if self.live_mode:
            self.live = Live(
                self._render(), console=self.console, refresh_per_second=8, transient=True
            )
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)
            self.live = None
        self._flush_partials()

    def _print(self, renderable: Any) -> None:
        if self.live is not None:
            self.live.console.print(renderable)
        else:
            self.console.print(renderable)

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._render())

    def _render(self) -> Any:
        table = Table.grid(padding=(0, 1))
        for sid, title in self.titles.items():
            st = self.status[sid]
            dur = self.durations.get(sid)
            if st == RUNNING and sid in self.started:
                dur = time.monotonic() - self.started[sid]
            extra = self.progress.get(sid, "") if st == RUNNING else (self.reasons.get(sid) or "")
            table.add_row(
                Text(ICONS[st], style=STYLES[st]),
                Text(sid, style="bold" if st == RUNNING else ""),
                Text(title, style="dim" if st == PENDING else ""),
                Text(format_duration(dur) if dur else "", style="dim"),
                Text(extra, style="dim"),
            )
        parts: list[Any] = [table]
        if self.connection:
            parts.append(Text(self.connection, style="yellow"))
        return Group(*parts)

    # -------------------------------------------------------------- events
    def __call__(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self.replaying = event.resumed  # until the CLI says the run is open (`opened`)
            how = "resumed" if event.resumed else "new"
            self._print(
                Text.from_markup(
                    f"[bold]eagle-tui[/] ▸ run [bold]{escape(event.run_id)}[/] ({how}) · "
                    f"runbook {escape(event.runbook)} · state {escape(event.state_dir)}"
                )
            )
        elif isinstance(event, StepChanged):
            self._on_step(event)
        elif isinstance(event, DryRunStep):
            style = {
                "done": "green",
                "satisfied": "green",
                "would run": "cyan",
                "pending": "dim",
                "blocked": "yellow",
                "not evaluated": "magenta",
            }[event.state]
            cmd = (
                event.command
                if isinstance(event.command, str) or event.command is None
                else " ".join(event.command)
            )
            line = Text(f"{event.state:>13}", style=style) + Text(" ")
            line.append(event.step_id, style="bold")
            line.append(f" on {event.host}")
            if event.destructive:
                line.append(" (destructive: needs confirmation)", style="bold red")
            line.append(f": {terminal(cmd or '(guards only)')}")
            if event.why:
                line.append(f"\n              {terminal(event.why)}", style=style)
            self._print(line)
            for guard_line in self._dry_guards.pop(event.step_id, []):  # evaluated first
                self._print(guard_line)
        elif isinstance(event, GuardsEvaluated):
            results = [{"phase": event.phase, **r} for r in event.results]
            if self.dry_run:
                self._dry_guards.setdefault(event.step_id, []).extend(
                    guard_view.rich_lines(results, indent="      ")
                )
            else:  # a live run prints only what stops a step: a blocking guard, a failed proof
                for g in guard_view.views(results):
                    if g.mark == "✗":
                        self._print(
                            Text(f"  {event.step_id} ") + Text(terminal(g.plain()), style=g.style)
                        )
                        self._guards_said.add(event.step_id)
        elif isinstance(event, LogChunk):
            if self.show_logs:
                self._log(event.step_id, event.text)
        elif isinstance(event, ProgressUpdate):
            text = progress_text(event.record)
            self.progress[event.step_id] = text
            now = time.monotonic()
            if not self.live_mode and now - self._progress_printed.get(event.step_id, 0.0) >= 2.0:
                self._progress_printed[event.step_id] = now
                self._print(Text(f"  {event.step_id} ⋯ {text}", style="cyan"))
        elif isinstance(event, ConnectionChanged):
            # "failed" is not printed: whoever gets the error reports it once (the CLI's
            # `error:` line, or the step's `lost` reason), so one refusal reads as one message.
            # A first connection that keeps failing is shown like a reconnect.
            if event.state == "reconnecting" or (event.state == "connecting" and event.message):
                said = (event.message or "").removeprefix(f"{event.host}: ")  # the host once
                self.connection = f"{event.host}: {event.state} (attempt {event.attempt})" + (
                    f": {terminal(said)}" if said else ""
                )
                self._print(Text(self.connection, style="yellow"))
            elif event.state == "connected":
                if self.connection:
                    self._print(Text(f"{event.host}: connected", style="green"))
                self.connection = ""
        elif isinstance(event, Notice):
            style = {"warning": "yellow", "error": "red"}.get(event.level, "dim")
            self._print(Text(terminal(event.message), style=style))
        elif isinstance(event, RunFinished):
            self._flush_partials()
        self._refresh()

    def opened(self) -> None:
        """The run is open: what follows happens now (not a replay of earlier sessions)."""
        self.replaying = False

    def _on_step(self, event: StepChanged) -> None:
        sid, st = event.step_id, event.status
        if sid not in self.status:
            return
        if self.replaying:  # a state from an earlier session: said as such, once
            self.status[sid] = st
            self.reasons[sid] = (
                event.reason if not event.message else f"{event.reason}: {event.message}"
            )
            if st != PENDING:
                why = f" ({escape(self.reasons[sid] or '')})" if self.reasons[sid] else ""
                self._print(
                    Text.from_markup(
                        f"[dim]{ICONS[st]} {escape(sid)} {st} in an earlier session{why}[/]"
                    )
                )
            return
        prev = self.status[sid]
        self.status[sid] = st
        why = event.reason if not event.message else f"{event.reason}: {event.message}"
        self.reasons[sid] = terminal(why) if why else why  # messages quote the box
        if st == RUNNING:
            self.started[sid] = time.monotonic()
            self.progress.pop(sid, None)
            self._print(
                Text.from_markup(f"[cyan]▶[/] [bold]{escape(sid)}[/] {escape(self.titles[sid])}")
            )
        elif prev != st or st != PENDING:
            if sid in self.started:
                self.durations[sid] = time.monotonic() - self.started.pop(sid)
            if st == PENDING and prev == PENDING:
                return
            self._flush_partial(sid)
            dur = self.durations.get(sid)
            shown = self.reasons[sid] or ""
            if sid in self._guards_said and event.reason:  # the guard lines above said why
                shown = event.reason
            self._guards_said.discard(sid)
            tail = f" ({escape(shown)})" if shown else ""
            self._print(
                Text.from_markup(
                    f"[{STYLES[st]}]{ICONS[st]} {escape(sid)} {st}[/]{tail}"
                    + (f" [dim]{format_duration(dur)}[/]" if dur else "")
                )
            )
            if st in TERMINAL_BAD:
                self._failure_log(sid)
            elif st == SUCCEEDED:
                self._removed(sid)

    def _removed(self, sid: str) -> None:
        """A delete says what it removed: the engine's evidence for each target it measured
        (`delete_target`: the resolved path, bytes and files) as the guards showed it."""
        rec = self.record_of(sid)
        for g in rec.guards if rec is not None else []:
            removes = guard_view.removal_text(g.get("observed")) if g.get("ok") else None
            if g.get("check") == "delete_target" and removes:
                target = g["observed"].get("target")
                self._print(
                    Text(
                        f"  {sid} {removes.replace('removes', 'removed', 1)}: {terminal(str(target))}"
                    )
                )

    def _failure_log(self, sid: str) -> None:
        """Where a failed step's whole log is; with --quiet (its lines were not streamed) also
        its last lines, so the failure can be read without opening the file."""
        rec = self.record_of(sid)
        if rec is None or not rec.log_file:
            return
        if not self.show_logs:
            lines, partial = read_tail(rec.log_file, rec.log_mirror_size, FAILURE_TAIL)
            shown = [*lines, partial] if partial else lines
            if shown:
                self._print(Text(f"  last {len(shown)} lines of {sid}'s log:", style="dim"))
                self._print(
                    Text("\n").join(
                        Text(f"  {sid} │ ", style="dim") + Text(log_line(x)) for x in shown
                    )
                )
        self._print(Text(f"  {sid} log: {terminal(str(rec.log_file))}", style="dim"))

    def _log(self, step_id: str, text: str) -> None:
        clip = self._partial.setdefault(step_id, LineClip())
        shown = [
            self._log_text(step_id, line)
            for line in clip.feed(text)
            if not line.startswith(PROGRESS_PREFIX)  # machine lines are shown as progress instead
        ]
        if shown:  # one write per chunk: a kill -9 lands before or after it, not inside
            self._print(Text("\n").join(shown))

    @staticmethod
    def _log_text(step_id: str, line: str) -> Text:
        return Text(f"  {step_id} │ ", style="dim") + Text(log_line(line))

    def _flush_partial(self, step_id: str) -> None:
        clip = self._partial.pop(step_id, None)
        rest = clip.flush() if clip is not None else None
        if rest:
            self._print(self._log_text(step_id, rest))

    def _flush_partials(self) -> None:
        for sid in list(self._partial):
            self._flush_partial(sid)

    def summary(
        self,
        code: int,
        audit_path: str,
        head_seq: int,
        head_hash: str,
        records: Mapping[str, StepRecord] | None = None,
    ) -> None:
        """The closing table and the exit line. `records`: the run's state, for the durations
        of steps that ran in earlier sessions."""
        table = Table(title="summary", show_header=True, header_style="bold")
        for col in ("", "step", "status", "reason", "duration"):
            table.add_column(col)
        for sid in self.titles:
            st = self.status[sid]
            dur = self.durations.get(sid)
            rec = (records or {}).get(sid)
            if dur is None and rec is not None and rec.started_at and rec.ended_at:
                dur = rec.ended_at - rec.started_at  # ran in an earlier session
            table.add_row(
                Text(ICONS[st], style=STYLES[st]),
                sid,
                Text(st, style=STYLES[st]),
                self.reasons.get(sid) or "",
                format_duration(dur) if dur else "",
            )
        self.console.print(table)
        self.console.print(f"audit: {audit_path}")
        self.console.print(f"audit head: seq {head_seq} sha256 {head_hash}")
        self.console.print(f"exit {code}: {self.exit_meaning(code)}")

    def exit_meaning(self, code: int) -> str:
        """With `--only`/`--from` exit 0 leaves other steps pending: "all steps done" would lie."""
        pending = [sid for sid, st in self.status.items() if st not in DONE]
        if code == EXIT_OK and pending:
            return f"selected steps done; {len(pending)} pending ({', '.join(pending)})"
        if code == EXIT_INTERRUPTED:
            running = [sid for sid, st in self.status.items() if st == RUNNING]
            return EXIT_MEANINGS[code] + (
                f"; still running on the box: {', '.join(running)} (run the same command "
                "again to reattach)"
                if running
                else "; nothing was left running"
            )
        return EXIT_MEANINGS.get(code, "")
