"""A progress bar for jobs that print eagle3 progress lines: done/total, rate and ETA.

Rate and ETA come from the job's own record (not from the widget's clock), so what is shown is
what the job measured, and snapshots are deterministic."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar

from eagle_tui.present.status import progress_text
from runbook.events import TERMINAL_BAD


class StepProgress(Horizontal):
    DEFAULT_CSS = """
    StepProgress { height: 1; padding: 0 1; display: none; }
    StepProgress.-active { display: block; }
    StepProgress ProgressBar { width: 40; }
    StepProgress Label { width: 1fr; padding-left: 1; }
    StepProgress.-bad Label { color: $error; }
    StepProgress.-bad ProgressBar Bar > .bar--complete { color: $error; }
    """

    def compose(self) -> ComposeResult:
        yield ProgressBar(total=None, show_eta=False, show_percentage=False, id="bar")
        yield Label("", id="progress-text", markup=False)

    def show(self, record: dict[str, Any] | None, status: str | None = None) -> None:
        """`status` is the step's: a job's last progress line is not the step's outcome."""
        if not record:
            self.remove_class("-active")
            return
        self.add_class("-active")
        bad = status in TERMINAL_BAD
        self.set_class(bad, "-bad")
        bar = self.query_one(ProgressBar)
        result = record.get("kind") == "result"
        if result:
            bar.update(total=1, progress=0 if bad else 1)
        else:
            total, done = record.get("total"), record.get("done")
            bar.update(total=float(total) if total else None, progress=float(done or 0))
        text = progress_text(record)
        if bad:  # never "done" on a failed step: say how it ended, and where the job got to
            text = f"step {status}" + ("" if result else f" at {text}")
        self.query_one(Label).update(text, layout=False)  # fixed 1fr x 1
