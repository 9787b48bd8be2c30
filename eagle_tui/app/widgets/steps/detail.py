"""The selected step's detail: resolved command, guards with their observed values, status,
termination reason and exit code."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from textual.widgets import Static

from eagle_tui.app.format import command_text, duration_text, guard_lines
from eagle_tui.headless import ICONS, STYLES
from runbook.schema import Step
from runbook.state import StepRecord


def detail_markup(
    step: Step, rec: StepRecord, now: float, guards: dict[str, tuple[dict[str, Any], ...]]
) -> str:
    style = STYLES.get(rec.status, "")
    head = (
        f"[{style}]{ICONS.get(rec.status, '?')} {rec.status}[/] [b]{escape(step.id)}[/] — "
        f"{escape(step.title)}" + ("  [b red]destructive[/]" if step.destructive else "")
    )
    facts = []
    if rec.reason:
        facts.append(f"reason [b]{escape(rec.reason)}[/]")
    if rec.exit_code is not None:
        facts.append(f"exit [b]{rec.exit_code}[/]")
    if rec.signal:
        facts.append(f"signal [b]{rec.signal}[/]")
    if rec.attempt:
        facts.append(f"attempt {rec.attempt}")
    if rec.host or step.host:
        facts.append(f"host {escape(rec.host or step.host or '')}")
    dur = duration_text(rec, now)
    if dur:
        facts.append(f"time {dur}")
    lines = [head]
    if facts:
        lines.append("  " + " · ".join(facts))
    if rec.message:
        lines.append(f"  [dim]{escape(rec.message)}[/]")
    cmd = rec.command if rec.command is not None else step.run
    lines.append(f"  [dim]$[/] {escape(command_text(cmd))}")
    shown = False
    for phase in ("skip_if", "pre", "post"):
        results = guards.get(phase)
        if results:
            lines.extend(guard_lines(results, phase))
            shown = True
    if not shown and rec.guards:
        lines.extend(guard_lines(rec.guards, "pre"))
        shown = True
    if not shown:
        n = len(step.preconditions) + len(step.postconditions) + len(step.skip_if)
        lines.append(
            f"  [dim]{n} guard(s), not evaluated yet (dry-run: d)[/]"
            if n
            else "  [dim]no guards[/]"
        )
    return "\n".join(lines)


class StepDetail(Static):
    DEFAULT_CSS = """
    StepDetail { height: auto; max-height: 16; padding: 0 1; }
    """

    _shown = ""

    def show(
        self, step: Step, rec: StepRecord, now: float, guards: dict[str, tuple[dict[str, Any], ...]]
    ) -> None:
        markup = detail_markup(step, rec, now, guards)
        if markup == self._shown:
            return
        # A layout pass costs tens of ms at 160x50: skip it when only a figure changed in place
        # (the running time ticks every second), i.e. same lines, about the same lengths.
        old = self._shown.split("\n")
        new = markup.split("\n")
        same_shape = len(old) == len(new) and all(
            abs(len(a) - len(b)) <= 4 for a, b in zip(old, new, strict=True)
        )
        self._shown = markup
        self.update(markup, layout=not same_shape)
