"""Small modals: ask a yes/no question, ask for a reason, show an error."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{ width: 90; max-width: 95%; height: auto; border: thick $primary;
    background: $surface; padding: 1 2; }}
{name} .dialog-title {{ text-style: bold; }}
{name} Horizontal {{ height: auto; align-horizontal: right; margin-top: 1; }}
{name} Button {{ margin-left: 2; }}
"""


class AskScreen(ModalScreen[bool]):
    """Yes/no. `y` answers yes, `n`/Escape no."""

    DEFAULT_CSS = _CSS.format(name="AskScreen")
    BINDINGS = [
        Binding("escape,n", "answer(False)", "No", id="ask-no"),
        Binding("y", "answer(True)", "Yes", id="ask-yes"),
    ]

    def __init__(self, title: str, body: str, yes: str = "Yes", no: str = "No") -> None:
        super().__init__()
        self.title_text, self.body, self.yes, self.no = title, body, yes, no

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Static(self.body, markup=False)
            with Horizontal():
                yield Button(f"{self.no} (n)", id="ask-no-button")
                yield Button(f"{self.yes} (y)", id="ask-yes-button", variant="warning")

    def on_mount(self) -> None:
        self.query_one("#ask-no-button", Button).focus()

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "ask-yes-button")


class ReasonScreen(ModalScreen[str | None]):
    """Ask for a non-empty reason (skips are audited with it). Escape gives None."""

    DEFAULT_CSS = _CSS.format(name="ReasonScreen")
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="reason-cancel")]

    def __init__(self, title: str, body: str) -> None:
        super().__init__()
        self.title_text, self.body = title, body

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Static(self.body, markup=False)
            yield Input(placeholder="reason (required)", id="reason-input")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.dismiss(event.value.strip())
        else:
            self.notify("a reason is required", severity="warning")

    def action_cancel(self) -> None:
        self.dismiss(None)


class ErrorScreen(ModalScreen[None]):
    DEFAULT_CSS = _CSS.format(name="ErrorScreen").replace("$primary", "$error")
    BINDINGS = [Binding("escape,enter", "close", "Close", id="error-close")]

    def __init__(self, title: str, body: str) -> None:
        super().__init__()
        self.title_text, self.body = title, body

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Static(self.body, markup=False)
            with Horizontal():
                yield Button("Close", id="error-close-button")

    def action_close(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed)
    def _pressed(self) -> None:
        self.dismiss(None)
