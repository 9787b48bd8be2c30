"""A progress bar for jobs that print eagle3 progress lines: done/total, rate and ETA.

Rate and ETA come from the job's own record (not from the widget's clock), so what is shown is
what the job measured, and snapshots are deterministic."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar

from eagle_tui.present.status import progress_text


class StepProgress(Horizontal):
    DEFAULT_CSS = """
    StepProgress { height: 1; padding: 0 1; display: none; }
    StepProgress.-active { display: block; }
    StepProgress ProgressBar { width: 40; }
    StepProgress Label { width: 1fr; padding-left: 1; }
    """

    def compose(self) -> ComposeResult:
        yield ProgressBar(total=None, show_eta=False, show_percentage=False, id="bar")
        yield Label("", id="progress-text", markup=False)

    def show(self, record: dict[str, Any] | None) -> None:
        if not record:
            self.remove_class("-active")
            return
        self.add_class("-active")
        bar = self.query_one(ProgressBar)
        if record.get("kind") == "result":
            bar.update(total=1, progress=1)
        else:
            total, done = record.get("total"), record.get("done")
            bar.update(total=float(total) if total else None, progress=float(done or 0))
        self.query_one(Label).update(progress_text(record), layout=False)  # fixed 1fr x 1
