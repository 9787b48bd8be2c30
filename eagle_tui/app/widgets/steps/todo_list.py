"""The todo list: one row per step (state icon, id, title, duration, guard status, note).

Rows have stable keys (the step ids) and are updated cell by cell: clearing and refilling a
DataTable on every event is O(rows) layout work (textual#5273)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from eagle_tui.app.format import duration_text, guard_summary
from eagle_tui.headless import ICONS, STYLES
from runbook.events import PENDING, RUNNING, SUCCEEDED
from runbook.state import StepRecord

COLUMNS = ("", "step", "title", "time", "guards", "note")
TITLE_WIDTH = 26
NOTES = {
    "already_satisfied": "already done",
    "guards_passed": "",
    "operator_skip": "skipped",
    "precondition_failed": "guard failed",
    "confirmation_required": "needs confirm",
    "requires_unmet": "needs earlier",
    "exit_code": "exit",
    "postcondition_failed": "post failed",
}


def note_text(rec: StepRecord) -> Text:
    """Short: progress while running, why it stopped otherwise (the detail pane has the rest)."""
    if rec.status == RUNNING:
        p = rec.progress or {}
        if p.get("total"):
            return Text(
                f"{100.0 * float(p.get('done') or 0) / float(p['total']):.0f}%", style="cyan"
            )
        return Text("running", style="cyan")
    note = NOTES.get(rec.reason or "", rec.reason or "")
    if rec.reason == "exit_code" and rec.exit_code is not None:
        note = f"exit {rec.exit_code}"
    return Text(note, style=STYLES.get(rec.status, "dim") if rec.status != SUCCEEDED else "dim")


class TodoList(DataTable):
    DEFAULT_CSS = """
    TodoList { height: 1fr; }
    /* Textual's bright-blue cursor row gives its text < 4.5:1; a dark one keeps >= 4.5:1 */
    TodoList > .datatable--cursor, TodoList:focus > .datatable--cursor {
        background: $primary 30%;
    }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self._cols: list[Any] = []

    def on_mount(self) -> None:
        self._cols = [self.add_column(label, key=label or "icon") for label in COLUMNS]

    def set_steps(self, steps: list[tuple[str, str]]) -> None:
        for sid, title in steps:
            self.add_row(*self._cells(sid, title, StepRecord(), 0.0, [], False), key=sid)

    def _cells(
        self,
        sid: str,
        title: str,
        rec: StepRecord,
        now: float,
        guards: list[dict[str, Any]],
        current: bool,
    ) -> list[Any]:
        style = STYLES.get(rec.status, "")
        icon = Text(ICONS.get(rec.status, "?"), style=style)
        sid_text = Text(sid, style="bold cyan" if current else "")
        if len(title) > TITLE_WIDTH:
            title = title[: TITLE_WIDTH - 1] + "…"
        title_style = "bold" if current else "dim" if rec.status == PENDING else ""
        return [
            icon,
            sid_text,
            Text(title, style=title_style),
            Text(duration_text(rec, now), style="dim"),
            guard_summary(guards),
            note_text(rec),
        ]

    def update_step(
        self,
        sid: str,
        title: str,
        rec: StepRecord,
        now: float,
        guards: list[dict[str, Any]],
        current: bool,
    ) -> None:
        cells = self._cells(sid, title, rec, now, guards, current)
        for col, value in zip(self._cols, cells, strict=True):
            self.update_cell(sid, col, value)

    def update_duration(self, sid: str, rec: StepRecord, now: float) -> None:
        self.update_cell(sid, self._cols[3], Text(duration_text(rec, now), style="dim"))

    def select_step(self, sid: str) -> None:
        self.move_cursor(row=self.get_row_index(sid))

    @property
    def selected(self) -> str | None:
        if self.row_count == 0:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return str(key.value) if key.value is not None else None
