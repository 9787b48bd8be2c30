"""The full-log viewer: pages through a step's complete mirror on disk, however large.

Only the viewport is read and rendered (Line API over a sparse `LineIndex`); the index is built
in a thread and grows while the job writes (follow mode). Memory does not depend on log size."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from rich.segment import Segment
from rich.style import Style
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.screen import Screen
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Footer, Input, Static

from eagle_tui.app.widgets.logs.line_index import LineIndex, ScanResult
from eagle_tui.app.widgets.logs.readable import readable
from runbook.mirror import ChunkTimes, TimesScan
from runbook.units import format_size

CACHE_LINES = 4000
SCAN_CHUNK = 256 << 20  # bytes indexed per thread round; the title shows progress in between
SEARCH_PAGE = 5000  # lines read per round of a search
MAX_HITS = 100_000  # a search counts its hits up to this many (the title says "N+")


TIME_WIDTH = 9  # "HH:MM:SS "


def arrival(at: float) -> str:
    """When a line reached this machine, in the operator's local time."""
    return time.strftime("%H:%M:%S", time.localtime(at))


class LogLines(ScrollView, can_focus=True):
    DEFAULT_CSS = """
    LogLines { height: 1fr; background: $surface; }
    """
    BINDINGS = [
        Binding("g,home", "scroll_home", "Top", show=False),
        Binding("G,end", "scroll_end", "Bottom", show=False),
    ]

    def __init__(self, index: LineIndex, **kwargs) -> None:
        super().__init__(**kwargs)
        self.index = index
        self._cache: OrderedDict[int, tuple[int, str]] = OrderedDict()  # line -> (offset, text)
        self._max_width = 0
        self.follow = False
        self.match: int | None = None  # the search hit shown highlighted
        self.times: ChunkTimes | None = None  # shown as a column when set (t)

    class Scrolled(Message):
        """The viewport moved (the title shows which lines are on screen)."""

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if round(old_value) != round(new_value):
            self.post_message(self.Scrolled())

    def reindexed(self, reset: bool = False) -> None:
        if reset:
            self._cache.clear()
        self.virtual_size = Size(self._max_width + self._gutter(), self.index.line_count)
        if self.follow:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        self.refresh()

    def _gutter(self) -> int:
        return (
            len(str(max(self.index.line_count, 1))) + 2 + (0 if self.times is None else TIME_WIDTH)
        )

    def _line(self, n: int) -> tuple[int, str]:
        hit = self._cache.get(n)
        if hit is not None:
            self._cache.move_to_end(n)
            return hit
        page = max(self.size.height, 50)
        widest = self._max_width
        for i, (offset, line) in enumerate(self.index.read_lines_at(n, page)):
            line = readable(line)  # `@@eagle3 {...}` as the live pane shows it, not raw JSON
            self._cache[n + i] = (offset, line)
            widest = max(widest, len(line))
        if widest > self._max_width:  # lets the operator scroll right to the longest line seen
            self._max_width = widest
            self.call_later(self.reindexed)
        while len(self._cache) > CACHE_LINES:
            self._cache.popitem(last=False)
        return self._cache.get(n, (-1, ""))

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        n = scroll_y + y
        width = self.size.width
        if n >= self.index.line_count:
            return Strip.blank(width)
        gutter = self._gutter()
        offset, text = self._line(n)
        # the last line may still be growing: never serve it from the cache
        if n == self.index.line_count - 1:
            self._cache.pop(n, None)
        stamp = ""
        if self.times is not None:
            at = self.times.at(offset) if offset >= 0 else None
            stamp = (arrival(at) if at is not None else "").ljust(TIME_WIDTH)
        width_no = gutter - 2 - (0 if self.times is None else TIME_WIDTH)
        number = Segment(f"{n + 1:>{width_no}}  {stamp}", Style(dim=True))
        style = Style(reverse=True) if n == self.match else None
        body = Strip([Segment(text, style)]).crop_extend(
            scroll_x, scroll_x + max(0, width - gutter), style
        )
        return Strip([number, *body]).simplify()

    def show_match(self, n: int) -> None:
        """Put line `n` a few lines below the top and highlight it."""
        self.match, self.follow = n, False
        self.scroll_to(y=max(0, n - 3), animate=False, immediate=True)
        self.refresh()


class FullLogScreen(Screen[None]):
    DEFAULT_CSS = """
    FullLogScreen #full-log-title { height: 1; background: $panel; padding: 0 1; }
    FullLogScreen #find { display: none; }
    """
    BINDINGS = [
        Binding("escape,q", "close", "Close", id="full-log-close"),
        Binding("f", "toggle_follow", "Follow", id="full-log-follow"),
        Binding("slash", "search", "Search", id="full-log-search"),
        Binding("n", "find(1)", "Next", id="full-log-next"),
        Binding("N", "find(-1)", "Previous", id="full-log-previous"),
        Binding("t", "toggle_times", "Times", id="full-log-times"),
    ]

    def __init__(
        self, path: Path | str, label: str, limit: Callable[[], int | None] | None = None
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self.label = label
        self.limit = limit or (lambda: None)
        self.index = LineIndex(self.path)
        self.view = LogLines(self.index, id="full-log")
        self._scanning = False
        self.needle = ""
        self.hits: list[int] | None = None  # the needle's lines, once counted (the title says)

    def compose(self) -> ComposeResult:
        yield Static(self._title(), id="full-log-title", markup=False)
        yield self.view
        yield Input(placeholder="search (Enter finds; n/N next/previous; Esc cancels)", id="find")
        yield Footer()

    def on_mount(self) -> None:
        self.view.focus()
        self._rescan()
        self.set_interval(0.5, self._rescan, name="full-log-follow")

    def _title(self) -> str:
        n = self.index.line_count
        top = self.view.scroll_offset.y
        first = min(top + 1, n) if n else 0
        last = min(top + self.view.scrollable_content_region.height, n)
        follow = " · following" if self.view.follow else ""
        if self.view.times is not None:
            follow += " · times" if self.view.times.ends else " · no arrival times recorded"
        found = ""
        if self.needle and self.hits is not None:
            at = self.view.match
            nth = self.hits.index(at) + 1 if at in self.hits else None
            more = "+" if len(self.hits) >= MAX_HITS else ""
            found = f" · {self.needle!r}: " + (
                f"hit {nth:,} of {len(self.hits):,}{more}"
                if nth
                else f"{len(self.hits):,}{more} hits"
            )
        return (
            f"{self.label} · lines {first:,}–{last:,} of {n:,} · "
            f"{format_size(self.index.scanned)}{follow}{found}"
        )

    def _rescan(self) -> None:
        if not self._scanning:
            self._scanning = True
            self._scan()

    @work(thread=True, group="log-index", exit_on_error=False)
    def _scan(self) -> None:
        res: ScanResult | None = None
        times: TimesScan | None = None
        try:
            limit = self.limit()
            res = self.index.scan(limit, max_bytes=SCAN_CHUNK)
            if self.view.times is not None:  # only what was appended since the last round
                times = self.view.times.scan(limit)
        finally:
            try:
                self.app.call_from_thread(self._scanned, res, times)
            except RuntimeError:  # the app is shutting down
                pass

    def _scanned(self, res: ScanResult | None, times: TimesScan | None = None) -> None:
        self._scanning = False
        if times is not None and self.view.times is not None:
            if res is not None and res.reset:  # the mirror was cut back: its times were too
                self.view.times = ChunkTimes(self.path)
            else:
                self.view.times.apply(times)
            if times.ends or times.reset:
                self.view.refresh()
        if res is not None and self.index.apply(res):
            self.view.reindexed(res.reset)
            if res.reset or res.end - res.start >= SCAN_CHUNK:
                self._rescan()  # more to index: keep going without waiting for the timer
        self.query_one("#full-log-title", Static).update(self._title())

    def on_log_lines_scrolled(self) -> None:
        self.query_one("#full-log-title", Static).update(self._title())

    def action_close(self) -> None:
        find = self.query_one("#find", Input)
        if find.display:  # Esc leaves the search box first
            find.display = False
            self.view.focus()
            return
        self.dismiss(None)

    # ------------------------------------------------------------------ search (/ then n/N)
    def action_search(self) -> None:
        find = self.query_one("#find", Input)
        find.value, find.display = "", True
        find.focus()

    @on(Input.Submitted, "#find")
    def _submitted(self, event: Input.Submitted) -> None:
        event.input.display = False
        self.view.focus()
        self.needle = event.value
        self.hits = None
        if self.needle:
            top = self.view.scroll_offset.y
            self._find(self.needle, top, 1)  # from the first line on screen
            self._count(self.needle)

    def action_find(self, direction: int) -> None:
        if not self.needle:
            self.notify("search with / first", severity="warning")
            return
        here = self.view.match if self.view.match is not None else self.view.scroll_offset.y
        self._find(self.needle, here + direction, direction)

    @work(thread=True, group="log-search", exclusive=True, exit_on_error=False)
    def _find(self, needle: str, start: int, direction: int) -> None:
        """Page through the index (never the whole file in memory), case-insensitively."""
        low, count = needle.lower(), self.index.line_count
        n = start
        while 0 <= n < count:
            first = n if direction > 0 else max(0, n - SEARCH_PAGE + 1)
            lines = self.index.read_lines(first, min(SEARCH_PAGE, count - first))
            order = range(len(lines)) if direction > 0 else range(len(lines) - 1, -1, -1)
            for i in order:
                if (direction > 0 and first + i < n) or (direction < 0 and first + i > n):
                    continue
                if low in lines[i].lower():
                    self.app.call_from_thread(self._found, first + i)
                    return
            n = first + len(lines) if direction > 0 else first - 1
            if not lines:
                break
        where = "below" if direction > 0 else "above"
        self.app.call_from_thread(self.notify, f"no more {needle!r} {where}", severity="warning")

    @work(thread=True, group="log-count", exclusive=True, exit_on_error=False)
    def _count(self, needle: str) -> None:
        """Every line with the needle (up to MAX_HITS), paged like the search."""
        low, count, hits, n = needle.lower(), self.index.line_count, [], 0
        while n < count and len(hits) < MAX_HITS:
            lines = self.index.read_lines(n, min(SEARCH_PAGE, count - n))
            if not lines:
                break
            hits += [n + i for i, line in enumerate(lines) if low in line.lower()]
            n += len(lines)
        self.app.call_from_thread(self._counted, needle, hits[:MAX_HITS])

    def _counted(self, needle: str, hits: list[int]) -> None:
        if needle == self.needle:
            self.hits = hits
            self.query_one("#full-log-title", Static).update(self._title())

    def _found(self, n: int) -> None:
        self.view.show_match(n)
        self.query_one("#full-log-title", Static).update(self._title())

    def action_toggle_times(self) -> None:
        """A column with when each line arrived (the time of the chunk that brought it)."""
        self.view.times = None if self.view.times else ChunkTimes.read(self.path, self.limit())
        self.view.reindexed()
        self.query_one("#full-log-title", Static).update(self._title())

    def action_toggle_follow(self) -> None:
        self.view.follow = not self.view.follow
        if self.view.follow:
            self.view.scroll_end(animate=False, immediate=True, x_axis=False)
        self.query_one("#full-log-title", Static).update(self._title())
