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

    def show(
        self, step: Step, rec: StepRecord, now: float, guards: dict[str, tuple[dict[str, Any], ...]]
    ) -> None:
        self.update(detail_markup(step, rec, now, guards))
