"""The selected step's live log: a bounded tail, rebuilt from the on-disk mirror, then fed by
the engine's LogChunk events, with no gap and no repeated line.

Byte positions make that exact: every chunk message carries the mirror's size right after the
engine wrote the chunk (`mirror_end`). Rebuilding reads the mirror up to the engine's confirmed
size at that moment and remembers it; later chunks at or below it are already on screen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip
from textual.widgets import Log

from eagle_tui.app.widgets.logs.feed import LogFeed, read_tail
from eagle_tui.app.widgets.logs.readable import is_progress, readable
from runbook.escape import terminal
from runbook.mirror import resume_point

MAX_LINES = 5000  # scrollback kept in the widget
MAX_BATCH = 2000  # lines per flush: ~20k lines/s shown in full; beyond, skipped with a marker
FLUSH_S = 0.1  # 50-100 ms batches: per-line writes cost ~1 ms each; each flush also re-lays out the scrolled screen


class LiveLog(Log):
    DEFAULT_CSS = """
    LiveLog { height: 1fr; }
    """

    def __init__(self, max_lines: int = MAX_LINES, **kwargs: Any) -> None:
        super().__init__(max_lines=max_lines, auto_scroll=True, **kwargs)
        self.feed = LogFeed(min(MAX_BATCH, max_lines))
        self.step: str | None = None
        self.source: str | None = None  # the mirror file shown (one per attempt)
        self.upto = 0  # mirror bytes already represented in the pane
        self.shown_lines = 0  # lines written into the widget since the last rebuild

    def on_mount(self) -> None:
        self.set_interval(FLUSH_S, self.flush, name="log-flush")

    # Log asks for `rich_style` once per rendered line, and each lookup walks every ancestor's
    # styles: look it up once per frame instead (styles cannot change while a frame renders).
    _frame_style: Style | None = None
    _rendering = False

    @property
    def rich_style(self) -> Style:
        if not self._rendering:
            return super().rich_style
        if self._frame_style is None:
            self._frame_style = super().rich_style
        return self._frame_style

    def render_lines(self, crop: Region) -> list[Strip]:
        self._rendering, self._frame_style = True, None
        try:
            return super().render_lines(crop)
        finally:
            self._rendering, self._frame_style = False, None

    @property
    def follow(self) -> bool:
        return self.auto_scroll

    def set_follow(self, on: bool) -> None:
        self.auto_scroll = on
        if on:
            self.flush()
            self.scroll_end(animate=False, immediate=True, x_axis=False)

    def show(self, step: str | None, log_file: str | None, mirror_size: int) -> None:
        """Show `step`'s log from the mirror (everything the engine has confirmed so far)."""
        self.clear()
        self.feed.reset()
        self.shown_lines = 0
        self.step, self.source, self.upto = step, log_file, 0
        if step is None or not log_file:
            return
        # Where the mirror durably ends (a resumed engine continues exactly there), not the
        # state file's older cursor: lines between the two were shown once already.
        mirror_size = resume_point(Path(log_file), 0, mirror_size)[1]
        lines, partial = read_tail(log_file, mirror_size, self.max_lines or MAX_LINES)
        self.upto = mirror_size
        self.feed.partial = partial
        if lines:
            self._write(lines)
        if self.follow:
            # Rebuilt before the pane has its final size (opening, a reattach): Log only scrolls
            # when already at the end, so pin the end once the layout is known.
            self.call_after_refresh(self.scroll_end, animate=False, x_axis=False)

    def on_chunk(self, step: str, text: str, log_file: str | None, mirror_end: int) -> None:
        if step != self.step:
            return  # another step's log: it is on disk, shown when that step is selected
        if log_file != self.source:  # a new attempt began: its mirror starts empty
            self.clear()
            self.feed.reset()
            self.shown_lines = 0
            self.source, self.upto = log_file, 0
        if mirror_end <= self.upto:
            return  # already read from the mirror when the pane was rebuilt
        self.upto = mirror_end
        self.feed.feed(text)

    def end_of_job(self, step: str) -> None:
        if step == self.step:
            self.feed.flush_partial()
            self.flush()

    def flush(self) -> None:
        lines = self.feed.take()
        if lines:
            self._write(lines)

    def _write(self, lines: list[str]) -> None:
        # progress records are the bar above the pane, not lines of it (the full log keeps them);
        # lines are escaped already; a record's fields are JSON-decoded again: escape them too
        shown = [terminal(readable(x)) for x in lines if not is_progress(x)]
        self.shown_lines += len(shown)
        self.write_lines(shown)
