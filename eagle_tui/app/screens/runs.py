"""The run picker (`o`): the runs of this runbook, as `eagle-tui runs` lists them; Enter opens one.

Opening another run is a relaunch on it (the cockpit drives one run at a time): the app quits
the way `q` does (asking first while a bound step runs) and `run_app` opens the chosen run."""

from __future__ import annotations

import datetime

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

from runbook import runs
from runbook.events import RUNNING
from runbook.state import RunState


class RunPickerScreen(ModalScreen[str | None]):
    DEFAULT_CSS = """
    RunPickerScreen { align: center middle; }
    RunPickerScreen > Vertical { width: 95%; height: auto; max-height: 90%;
        border: thick $primary; background: $surface; padding: 0 1; }
    RunPickerScreen .dialog-title { text-style: bold; }
    RunPickerScreen DataTable { height: auto; max-height: 30; }
    """
    BINDINGS = [Binding("escape,q", "close", "Close", id="runs-close")]

    def __init__(self, runs: list[RunState], current: str, runbook: str) -> None:
        super().__init__()
        self.runs, self.current, self.runbook = runs, current, runbook

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(
                f"Runs of {self.runbook} (Enter opens one, Esc closes; every runbook's: "
                "eagle-tui runs)",
                classes="dialog-title",
                markup=False,
            )
            table: DataTable[Text] = DataTable(id="runs-table", cursor_type="row")
            table.add_columns("run", "started (UTC)", "status", "running steps")
            for run in self.runs:
                started = datetime.datetime.fromtimestamp(run.created_at, datetime.timezone.utc)
                live = [sid for sid, r in run.steps.items() if r.status == RUNNING]
                mark = " (open)" if run.run_id == self.current else ""
                table.add_row(
                    Text(run.run_id + mark),
                    Text(started.strftime("%Y-%m-%d %H:%M")),
                    Text(runs.status(run)),  # the wording of `eagle-tui runs`
                    Text(", ".join(live), style="yellow"),
                    key=run.run_id,
                )
            yield table

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.focus()
        ids = [r.run_id for r in self.runs]
        if self.current in ids:
            table.move_cursor(row=ids.index(self.current))

    @on(DataTable.RowSelected)
    def _chosen(self, event: DataTable.RowSelected) -> None:
        self.dismiss(str(event.row_key.value))

    def action_close(self) -> None:
        self.dismiss(None)
