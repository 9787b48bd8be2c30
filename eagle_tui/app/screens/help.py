"""`?` / F1: every key of the main screen (as the user's keymap binds it) and what it does."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: auto; max-width: 95%; height: auto; max-height: 90%;
        border: thick $primary; background: $surface; padding: 0 1; }
    HelpScreen .dialog-title { text-style: bold; }
    HelpScreen DataTable { height: auto; }
    """
    BINDINGS = [Binding("escape,q,question_mark,f1", "close", "Close", id="help-close")]

    def __init__(self, rows: list[tuple[str, str, str]]) -> None:
        """rows: (keys, binding id, what it does)."""
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Label("Keys (Esc, ? or F1 closes)", classes="dialog-title")
            table: DataTable[Text] = DataTable(
                id="help-keys", cursor_type="none", zebra_stripes=True
            )
            # Fitted to the terminal: the description column wraps (rows grow) instead of
            # being cut at the modal's right edge.
            key_w = max(len(r[0]) for r in self.rows) if self.rows else 3
            id_w = max(len(r[1]) for r in self.rows) if self.rows else 2
            room = int(self.app.size.width * 0.95) - key_w - id_w - 14  # borders, padding, cells
            what_w = max(24, min(max((len(r[2]) for r in self.rows), default=20), room))
            table.add_column("key", width=key_w)
            table.add_column("id", width=id_w)
            table.add_column("what it does", width=what_w)
            for row in self.rows:
                table.add_row(*(Text(x) for x in row), height=None)  # literal: never markup
            yield table

    def action_close(self) -> None:
        self.dismiss(None)
