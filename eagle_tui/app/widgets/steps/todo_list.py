"""The todo list: one row per step (state icon, id, title, duration, guard status, note).

Rows have stable keys (the step ids) and are updated cell by cell: clearing and refilling a
DataTable on every event is O(rows) layout work (textual#5273)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from eagle_tui.app.format import duration_text
from eagle_tui.present import guards as guard_view
from eagle_tui.present.status import ICONS, STYLES
from runbook.escape import terminal
from runbook.events import PENDING, RUNNING, SUCCEEDED
from runbook.state import StepRecord

COLUMNS = ("", "step", "title", "time", "guards", "note")
TITLE_MAX = 44  # the title column's widest (cells)
NOTE_MIN = 10  # the note column's width when it is shown
TITLE_ROOM = 20  # the title cells a note column may not take away
TIME_W = 6  # "59m59s", "12h05m"
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
    return Text(
        terminal(note), style=STYLES.get(rec.status, "dim") if rec.status != SUCCEEDED else "dim"
    )


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
        self._titles: list[str] = []
        self._ids: list[str] = []

    class StepHighlighted(Message):
        """The cursor is on another step (the screen shows it)."""

        def __init__(self, step_id: str) -> None:
            super().__init__()
            self.step_id = step_id

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()  # the screen hears of steps, not of table rows
        if event.row_key.value is not None:
            self.post_message(self.StepHighlighted(str(event.row_key.value)))

    def on_resize(self) -> None:
        self.fit_columns()

    def fit_columns(self) -> None:
        """Share the pane's width with fixed column widths (auto widths follow the cells seen so
        far and cut later ones: "1m00" for "1m00s"): icon, step id, time and guards keep theirs
        (the guards header is never cut to "guar"), the title gets what it needs up to
        TITLE_MAX, the note the rest, when the title keeps TITLE_ROOM cells beside it."""
        if not self._cols:
            return
        step_w = max([len(sid) for sid in self._ids] + [len("step")])
        fixed = {0: 1, 1: step_w, 3: TIME_W, 4: len("guards")}
        pad = 2 * self.cell_padding
        rest = self.scrollable_content_region.width - sum(fixed.values()) - len(COLUMNS) * pad
        want = min(TITLE_MAX, max([len(t) for t in self._titles] + [len("title")]))
        note = NOTE_MIN if rest - NOTE_MIN >= min(want, TITLE_ROOM) else 0
        title = max(1, min(want, rest - note))  # narrower than the pane allows: no h-scroll
        left = rest - title  # the note gets what is left, unless that is too little to read
        widths = {**fixed, 2: title, 5: left if left >= NOTE_MIN else 0}
        changed = False
        for i, width in widths.items():
            col = self.columns[self._cols[i]]
            if col.auto_width or col.width != width:
                col.auto_width, col.width, changed = False, width, True
        if changed:
            self._require_update_dimensions = True  # DataTable re-lays out its columns
            self.refresh()

    def set_steps(self, steps: list[tuple[str, str]]) -> None:
        self._titles = [title for _, title in steps]
        self._ids = [sid for sid, _ in steps]
        for sid, title in steps:
            self.add_row(*self._cells(sid, title, StepRecord(), 0.0, [], False), key=sid)
        self.call_after_refresh(self.fit_columns)  # the step column's width is known now

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
        title_style = "bold" if current else "dim" if rec.status == PENDING else ""
        return [
            icon,
            sid_text,
            Text(terminal(title), style=title_style, overflow="ellipsis", no_wrap=True),
            Text(duration_text(rec, now), style="dim"),
            guard_view.summary(guard_view.current(guards, rec.status)),
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
