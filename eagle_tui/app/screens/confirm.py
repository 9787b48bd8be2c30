"""Typed confirmation for destructive steps: shows the prompt, the command, what the guards
observed (paths, sizes, counts: what will be changed or deleted), and proceeds only when the
operator types the step id exactly. The engine audits the decision with what was shown."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from eagle_tui.app.format import command_text
from eagle_tui.app.literal import lines as join_lines
from eagle_tui.app.literal import markup
from eagle_tui.present import guards as guard_view
from runbook.engine import Confirmation, ConfirmRequest
from runbook.escape import terminal
from runbook.schema import Step


def evidence_markup(req: ConfirmRequest) -> Content:
    """The guards as evaluated before asking (eagle_tui/present/guards.py: one renderer)."""
    lines = [Content.from_rich_text(t) for t in guard_view.rich_lines(req.evidence, indent="")]
    return join_lines(lines) if lines else markup("[dim](this step has no guards)[/]")


class ConfirmScreen(ModalScreen[Confirmation | None]):
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 100; max-width: 95%; height: auto; max-height: 90%;
        border: thick $error; background: $surface; padding: 1 2; }
    ConfirmScreen #confirm-title { text-style: bold; color: $error; }
    ConfirmScreen #confirm-evidence { height: auto; max-height: 18; margin: 1 0; }
    ConfirmScreen Horizontal { height: auto; align-horizontal: right; }
    ConfirmScreen Button { margin-left: 2; }
    """
    BINDINGS = [Binding("escape", "refuse", "Do not run", id="confirm-refuse")]

    def __init__(self, req: ConfirmRequest, step: Step | None = None) -> None:
        super().__init__()
        self.req = req
        self.step = step

    def compose(self) -> ComposeResult:
        r = self.req
        with Vertical():
            yield Label(
                markup("Destructive step: $sid — $title", sid=r.step_id, title=r.title),
                id="confirm-title",
            )
            yield Static(terminal(r.prompt), id="confirm-prompt", markup=False)
            yield Static(markup("[dim]$$[/] $v", v=command_text(r.command)), id="confirm-command")
            yield Label("What the guards observed (what will be changed or deleted):")
            with VerticalScroll(id="confirm-evidence"):
                yield Static(evidence_markup(r))
            yield Label(
                markup(
                    "Type the step id [b]$sid[/] to run it; Escape does not run it.", sid=r.step_id
                )
            )
            yield Input(id="confirm-input")  # empty: the word to type is the label above
            with Horizontal():
                yield Button("Do not run", id="confirm-no")
                yield Button("Run it", id="confirm-yes", variant="error", disabled=True)

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @on(Input.Changed, "#confirm-input")
    def _typed(self, event: Input.Changed) -> None:
        self.query_one("#confirm-yes", Button).disabled = event.value != self.req.step_id

    @on(Input.Submitted, "#confirm-input")
    def _submitted(self, event: Input.Submitted) -> None:
        if event.value == self.req.step_id:
            self.dismiss(Confirmation("typed", typed=event.value))
        else:
            self.notify(f"type {self.req.step_id} exactly to run it", severity="warning")

    @on(Button.Pressed, "#confirm-yes")
    def _yes(self) -> None:
        value = self.query_one(Input).value
        if value == self.req.step_id:
            self.dismiss(Confirmation("typed", typed=value))

    @on(Button.Pressed, "#confirm-no")
    def _no(self) -> None:
        self.dismiss(None)

    def action_refuse(self) -> None:
        self.dismiss(None)
