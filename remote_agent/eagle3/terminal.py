"""What a person in a terminal sees instead of `@@eagle3 {...}` lines: a progress bar per stage,
metrics as short readable lines, and the command's result as a summary.

rich draws it when installed (the operator's machine has it); a box without rich gets a
one-line text bar. Both go to the same stream the JSON lines would have gone to."""

from __future__ import annotations

import atexit
import json
from typing import Any, TextIO


def number(v: Any) -> str:
    """Figures a person reads: 4 significant digits, thousands separators, no 16-digit floats."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if v != 0 and (abs(v) >= 1e9 or abs(v) < 1e-3):
        return f"{v:.4g}"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def pairs(record: dict[str, Any], skip: tuple[str, ...] = ("kind",)) -> str:
    return " · ".join(f"{k} {number(v)}" for k, v in record.items() if k not in skip)


class PlainView:
    """Without rich: `merge [#########.........] 450/1,000 records · 120/s · ETA 4s` in place."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.open_line = False

    def _line(self, text: str) -> None:
        if self.open_line:
            self.stream.write("\n")
            self.open_line = False
        self.stream.write(text + "\n")

    def progress(self, r: dict[str, Any]) -> None:
        done, total = r.get("done") or 0, r.get("total")
        bar = ""
        if total:
            filled = int(30 * min(done / total, 1.0))
            bar = f" [{'#' * filled}{'.' * (30 - filled)}] {number(done)}/{number(total)}"
        else:
            bar = f" {number(done)}"
        rate = f" · {number(r['rate'])}/s" if r.get("rate") else ""
        eta = f" · ETA {duration(r['eta_s'])}" if r.get("eta_s") is not None else ""
        self.stream.write(f"\r{r.get('stage', '')}{bar} {r.get('unit', '')}{rate}{eta}\x1b[K")
        self.open_line = True

    def print(self, text: str) -> None:
        self._line(text)

    def close(self) -> None:
        if self.open_line:
            self.stream.write("\n")
            self.open_line = False
        self.stream.flush()


class RichView:
    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = Console(file=stream, highlight=False)
        self.bars = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[unit]}"),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.tasks: dict[str, Any] = {}
        self.bars.start()

    def progress(self, r: dict[str, Any]) -> None:
        stage = str(r.get("stage", ""))
        rate = f"{number(r['rate'])}/s" if r.get("rate") else ""
        fields: dict[str, Any] = {"unit": str(r.get("unit", "")), "rate": rate}
        if stage not in self.tasks:
            self.tasks[stage] = self.bars.add_task(stage, total=r.get("total"), **fields)
        self.bars.update(
            self.tasks[stage], completed=r.get("done") or 0, total=r.get("total"), **fields
        )

    def print(self, text: str) -> None:
        from rich.text import Text

        self.console.print(Text(text))

    def summary(self, r: dict[str, Any]) -> None:
        from rich.table import Table

        table = Table(title="result", show_header=False, title_justify="left")
        for k, v in r.items():
            if k != "kind":
                shown = json.dumps(v) if isinstance(v, (dict, list)) else number(v)
                table.add_row(str(k), shown)
        self.console.print(table)

    def close(self) -> None:
        self.bars.stop()


_views: dict[int, Any] = {}


def view_for(stream: TextIO) -> Any:
    v = _views.get(id(stream))
    if v is None:
        try:
            v = RichView(stream)
        except ImportError:
            v = PlainView(stream)
        _views[id(stream)] = v
        atexit.register(v.close)
    return v


def show(stream: TextIO, record: dict[str, Any]) -> None:
    v = view_for(stream)
    kind = record.get("kind")
    if kind == "progress":
        v.progress(record)
    elif kind == "result":
        if isinstance(v, RichView):
            v.summary(record)
        else:
            v.print("result: " + pairs(record))
    elif kind == "metrics":
        step = record.get("step")
        head = f"step {number(step)}" if step is not None else "metrics"
        v.print(f"{head} · " + pairs(record, ("kind", "step")))
    else:
        v.print(f"{kind}: " + pairs(record))
