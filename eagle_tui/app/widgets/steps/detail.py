"""The selected step's detail: resolved command, guards with their observed values, status,
termination reason and exit code."""

from __future__ import annotations

import os
from typing import Any

from textual.content import Content
from textual.widgets import Static

from eagle_tui.app.format import command_text, duration_text
from eagle_tui.app.literal import lines as join_lines
from eagle_tui.app.literal import markup
from eagle_tui.present import guards as guard_view
from eagle_tui.present.status import ICONS, STYLES
from runbook.events import RUNNING
from runbook.schema import Step
from runbook.state import StepRecord
from runbook.units import format_duration


def detail_markup(
    step: Step, rec: StepRecord, now: float, guards: dict[str, tuple[dict[str, Any], ...]]
) -> Content:
    style = STYLES.get(rec.status, "")
    head = markup(
        f"[{style}]$icon $status[/] [b]$sid[/] — $title"
        + ("  [b red]destructive[/]" if step.destructive else ""),
        icon=ICONS.get(rec.status, "?"),
        status=rec.status,
        sid=step.id,
        title=step.title,
    )
    facts: list[Content] = []
    if rec.reason:
        facts.append(markup("reason [b]$v[/]", v=rec.reason))
    if rec.exit_code is not None:
        facts.append(markup("exit [b]$v[/]", v=rec.exit_code))
    if rec.signal:
        facts.append(markup("signal [b]$v[/]", v=rec.signal))
    if rec.attempt:
        facts.append(markup("attempt $v", v=rec.attempt))
    if rec.host or step.host:
        facts.append(markup("host $v", v=rec.host or step.host or ""))
    dur = duration_text(rec, now)
    if dur:
        facts.append(markup("time $v", v=dur))
    if rec.status == RUNNING and rec.log_file:
        facts.append(markup("$v", v=last_output(rec.log_file, now)))
    lines = [head]
    if facts:
        lines.append(Content("  ") + Content(" · ").join(facts))
    if rec.message:
        lines.append(markup("  [dim]$v[/]", v=rec.message))
    cmd = rec.command if rec.command is not None else step.shown_command
    lines.append(markup("  [dim]$$[/] $v", v=command_text(cmd)))
    results = guard_view.current(
        guard_view.flatten(guards) or [{"phase": "pre", **g} for g in rec.guards], rec.status
    )
    lines.extend(Content.from_rich_text(t) for t in guard_view.rich_lines(results))
    if not results:
        n = len(step.preconditions) + len(step.postconditions) + len(step.skip_if)
        lines.append(
            markup(f"  [dim]{n} guard(s), not evaluated yet (dry-run: d)[/]")
            if n
            else markup("  [dim]no guards[/]")
        )
    return join_lines(lines)


def last_output(log_file: str, now: float) -> str:
    """`last output 35s ago`: a silent job shows it is silent. The mirror is appended as each
    chunk arrives, so its mtime is when the job last wrote (as this client received it)."""
    try:
        st = os.stat(log_file)
    except OSError:
        return "no output yet"
    if st.st_size == 0:
        return "no output yet"
    ago = now - st.st_mtime
    return "last output just now" if ago < 1 else f"last output {format_duration(ago)} ago"


class StepDetail(Static):
    DEFAULT_CSS = """
    StepDetail { height: auto; max-height: 16; padding: 0 1; }
    """

    _shown: tuple[str, tuple[Any, ...]] = ("", ())

    def show(
        self, step: Step, rec: StepRecord, now: float, guards: dict[str, tuple[dict[str, Any], ...]]
    ) -> None:
        content = detail_markup(step, rec, now, guards)
        key = (content.plain, tuple(content.spans))  # Content's == compares the text only
        if key == self._shown:
            return
        # A layout pass costs tens of ms at 160x50: skip it when only a figure changed in place
        # (the running time ticks every second), i.e. same lines, about the same lengths.
        old = self._shown[0].split("\n")
        new = content.plain.split("\n")
        same_shape = len(old) == len(new) and all(
            abs(len(a) - len(b)) <= 4 for a, b in zip(old, new, strict=True)
        )
        self._shown = key
        self.update(content, layout=not same_shape)
