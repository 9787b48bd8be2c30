"""Guards, skip conditions and postconditions shown as what they are: one renderer for every view.

A guard result (runbook/engine/guards.py) carries its phase. A precondition passes (✓) or blocks
(✗); in a dry run one whose input an earlier step produces is pending on that step (⋯). A skip_if
condition holds (the step is skipped) or does not (the step runs: not a failure). A
postcondition is the proof the step did what it says (or its failure). A destructive step's
delete target says how much exactly the agent removes (as it measured it, not a dir entry).
Every text part is passed through runbook/escape.terminal: guard output comes from the box."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rich.text import Text

from eagle_tui.present.values import observed_text
from runbook.escape import terminal
from runbook.units import format_size

PHASES = ("skip_if", "pre", "post")
PHASE_NAMES = {"skip_if": "skip if", "pre": "guard", "post": "proof"}


@dataclass(frozen=True)
class GuardView:
    mark: str
    style: str
    phase: str
    label: str
    verdict: str  # "passed", "blocks", "pending on step X", "holds: skipped", "does not hold"...
    message: str
    observed: str
    dry_run: bool

    def plain(self) -> str:
        """`✓ guard merge verified: passed — verify-merge succeeded in this run`."""
        tag = " (dry-run)" if self.dry_run else ""
        return (
            f"{self.mark} {PHASE_NAMES.get(self.phase, self.phase)}{tag} {self.label}: "
            f"{self.verdict}" + (f" — {self.message}" if self.message else "")
        )


def phase_of(result: Mapping[str, Any], default: str = "pre") -> str:
    return str(result.get("phase") or default)


def removal_text(observed: Any) -> str | None:
    """`removes 7.6 MiB in 12 files` from a delete_target's observed value, when measured."""
    if not isinstance(observed, dict) or observed.get("bytes") is None:
        return None
    files = observed.get("files")
    return f"removes {format_size(observed['bytes'])}" + (
        f" in {files:,} file{'' if files == 1 else 's'}" if isinstance(files, int) else ""
    )


def view(result: Mapping[str, Any], default_phase: str = "pre") -> GuardView:
    phase = phase_of(result, default_phase)
    ok = bool(result.get("ok"))
    label = str(result.get("title") or result.get("check") or "?")
    message = str(result.get("message") or "")
    if result.get("not_evaluated"):  # a dry run that could not reach the host
        mark, style, verdict = "?", "magenta", "not evaluated"
    elif phase == "skip_if" and result.get("pending_on"):
        mark, style, verdict = "⋯", "yellow", f"decided after step {result['pending_on']}"
    elif phase == "skip_if":
        mark, style, verdict = ("↷", "blue", "holds") if ok else ("·", "dim", "does not hold")
    elif result.get("pending_on") and not ok:
        mark, style, verdict = "⋯", "yellow", f"pending on step {result['pending_on']}"
    elif phase == "post":
        mark, style, verdict = ("✓", "green", "proven") if ok else ("✗", "red", "not proven")
    else:
        mark, style, verdict = ("✓", "green", "passed") if ok else ("✗", "red", "blocks")
    removes = (
        removal_text(result.get("observed")) if result.get("check") == "delete_target" else None
    )
    if removes and ok:  # the size is the verdict; the message would only repeat it
        obs = result["observed"]
        verdict = removes if obs.get("kind") != "absent" else "already absent"
        message = f"the agent deletes {obs.get('kind')} {obs.get('target')} (exactly this one)"
    return GuardView(  # labels, messages and observed values may quote the box: escaped
        mark,
        style,
        phase,
        terminal(label),
        terminal(verdict),
        terminal(message),
        terminal(observed_text(result.get("observed"))),
        bool(result.get("dry_run")),
    )


def views(results: Iterable[Mapping[str, Any]], default_phase: str = "pre") -> list[GuardView]:
    return [view(r, default_phase) for r in results]


def rich_lines(results: Iterable[Mapping[str, Any]], indent: str = "  ") -> list[Text]:
    """Two lines per guard: mark, phase, label, verdict and message; then its observed values.
    Every part is literal (rich Text, never markup)."""
    out: list[Text] = []
    for g in views(results):
        head = Text(indent)
        head.append(g.mark, style=g.style)
        head.append(f" {PHASE_NAMES.get(g.phase, g.phase)} ", style="dim")
        if g.dry_run:
            head.append("dry-run ", style="dim italic")
        head.append(g.label, style="bold")
        head.append(": ")
        head.append(g.verdict, style=g.style)
        if g.message:
            head.append(f" — {g.message}")
        out.append(head)
        if g.verdict != "not evaluated":  # nothing was observed
            out.append(Text(f"{indent}    observed: {g.observed}", style="dim"))
    return out


def flatten(by_phase: Mapping[str, Iterable[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One list in phase order, each result tagged with the phase it was stored under."""
    return [{"phase": p, **r} for p in PHASES for r in by_phase.get(p, ())]


def current(results: Iterable[Mapping[str, Any]], status: str) -> list[Mapping[str, Any]]:
    """What still stands: a dry run's marks go once the step runs or is done (the real run has
    overtaken them); before that they stay, each labelled a dry run's, beside any real ones."""
    if status in ("running", "succeeded", "skipped"):
        return [r for r in results if not r.get("dry_run")]
    return list(results)


def summary(results: Iterable[Mapping[str, Any]]) -> Text:
    """The todo list's cell: `✓3` all guards and proofs passed, `✗1/3` one blocks or is not
    proven, `⋯2` two pending; `↷` when the skip condition held. skip_if's misses never count."""
    checked = [g for g in views(results) if g.phase != "skip_if"]
    skips = [g for g in views(results) if g.phase == "skip_if"]
    if skips and all(g.mark == "↷" for g in skips) and not checked:
        return Text("↷", style="blue")
    if not checked:
        return Text("")
    bad = sum(1 for g in checked if g.mark == "✗")
    waiting = sum(1 for g in checked if g.mark == "⋯")
    if bad:
        return Text(f"✗{bad}/{len(checked)}", style="red")
    if waiting:
        return Text(f"⋯{waiting}/{len(checked)}", style="yellow")
    return Text(f"✓{len(checked)}", style="green")
