"""`--auto` output: the todo list with live states, streamed job logs and progress, in plain text
when stdout is not a terminal (CI logs) and as a live Rich display when it is."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from eagle_tui.present import guards as guard_view
from eagle_tui.present.status import ICONS, STYLES, progress_text
from remote_agent.progress import PREFIX as PROGRESS_PREFIX
from runbook.events import (
    PENDING,
    RUNNING,
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
from runbook.units import format_duration


class HeadlessView:
    def __init__(
        self,
        step_titles: dict[str, str],
        console: Console | None = None,
        show_logs: bool = True,
        dry_run: bool = False,
    ) -> None:
        self.dry_run = dry_run  # list every guard with its observed value, under its step
        self.console = console or Console(highlight=False, soft_wrap=True)
        self.live_mode = self.console.is_terminal
        self.titles = step_titles
        self.status = {sid: PENDING for sid in step_titles}
        self.reasons: dict[str, str | None] = {}
        self.started: dict[str, float] = {}
        self.durations: dict[str, float] = {}
        self.progress: dict[str, str] = {}
        self.connection = ""
        self.show_logs = show_logs
        self._partial: dict[str, str] = {}
        self._progress_printed: dict[str, float] = {}
        self._dry_guards: dict[str, list[Text]] = {}
        self.live: Live | None = None

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
            }[event.state]
            cmd = (
                event.command
                if isinstance(event.command, str) or event.command is None
                else " ".join(event.command)
            )
            line = Text(f"{event.state:>9}", style=style) + Text(" ")
            line.append(event.step_id, style="bold")
            line.append(f" on {event.host}")
            if event.destructive:
                line.append(" (destructive: needs confirmation)", style="bold red")
            line.append(f": {cmd or '(guards only)'}")
            if event.why:
                line.append(f"\n          {event.why}", style=style)
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
                        self._print(Text(f"  {event.step_id} ") + Text(g.plain(), style=g.style))
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
                self.connection = f"{event.host}: {event.state} (attempt {event.attempt})" + (
                    f": {event.message}" if event.message else ""
                )
                self._print(Text(self.connection, style="yellow"))
            elif event.state == "connected":
                if self.connection:
                    self._print(Text(f"{event.host}: connected", style="green"))
                self.connection = ""
        elif isinstance(event, Notice):
            style = {"warning": "yellow", "error": "red"}.get(event.level, "dim")
            self._print(Text(event.message, style=style))
        elif isinstance(event, RunFinished):
            self._flush_partials()
        self._refresh()

    def _on_step(self, event: StepChanged) -> None:
        sid, st = event.step_id, event.status
        if sid not in self.status:
            return
        prev = self.status[sid]
        self.status[sid] = st
        self.reasons[sid] = (
            event.reason if not event.message else f"{event.reason}: {event.message}"
        )
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
            tail = f" ({escape(self.reasons[sid] or '')})" if self.reasons[sid] else ""
            self._print(
                Text.from_markup(
                    f"[{STYLES[st]}]{ICONS[st]} {escape(sid)} {st}[/]{tail}"
                    + (f" [dim]{format_duration(dur)}[/]" if dur else "")
                )
            )

    def _log(self, step_id: str, text: str) -> None:
        buf = self._partial.get(step_id, "") + text
        *lines, rest = buf.split("\n")
        self._partial[step_id] = rest
        shown = [
            Text(f"  {step_id} │ ", style="dim") + Text(line)
            for line in lines
            if not line.startswith(PROGRESS_PREFIX)  # machine lines are shown as progress instead
        ]
        if shown:  # one write per chunk: a kill -9 lands before or after it, not inside
            self._print(Text("\n").join(shown))

    def _flush_partial(self, step_id: str) -> None:
        rest = self._partial.pop(step_id, "")
        if rest:
            self._print(Text(f"  {step_id} │ ", style="dim") + Text(rest))

    def _flush_partials(self) -> None:
        for sid in list(self._partial):
            self._flush_partial(sid)

    def summary(self, code: int, audit_path: str, head_seq: int, head_hash: str) -> None:
        table = Table(title="summary", show_header=True, header_style="bold")
        for col in ("", "step", "status", "reason", "duration"):
            table.add_column(col)
        for sid in self.titles:
            st = self.status[sid]
            dur = self.durations.get(sid)
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
        # an --only / selected run can exit 0 with steps never run: say how many remain
        pending = sum(1 for sid in self.titles if self.status[sid] == "pending")
        done = f"selected steps done; {pending} pending" if pending else "all steps done"
        meaning = {
            0: done,
            1: "a step failed or was lost",
            3: "blocked: a guard failed or a confirmation was needed",
        }.get(code, "")
        self.console.print(f"exit {code}: {meaning}")
