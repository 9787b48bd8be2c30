"""What a person in a terminal sees instead of `@@eagle3 {...}` lines: a progress bar per stage,
metrics as short readable lines, and the command's result as a summary.

rich draws it when installed (the operator's machine has it); a box without rich gets a
one-line text bar. Both go to the same stream the JSON lines would have gone to."""

from __future__ import annotations

import atexit
from typing import Any, TextIO

from remote_agent.wire.units import format_size


def number(v: Any) -> str:
    """Figures a person reads: 4 significant digits, thousands separators, no 16-digit floats."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if not isinstance(v, (int, float)):
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


def figure(key: str, v: Any) -> str:
    """One value of a record: byte counts as sizes, nested objects as `k v · k v`, lists short."""
    if isinstance(v, dict):
        shown = (
            f"{k} ({figure(k, x)})" if isinstance(x, dict) else f"{k} {figure(k, x)}"
            for k, x in v.items()
        )
        return " · ".join(shown) or "none"
    if isinstance(v, list):
        return ", ".join(figure(key, x) for x in v[:8]) + (" …" if len(v) > 8 else "") or "none"
    if (
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and (key == "bytes" or key.endswith("_bytes"))
    ):
        return format_size(v)
    return number(v)


def pairs(record: dict[str, Any], skip: tuple[str, ...] = ("kind",)) -> str:
    return " · ".join(f"{k} {figure(k, v)}" for k, v in record.items() if k not in skip)


def count(r: dict[str, Any]) -> str:
    """`450/1,000` or, for a stage counted in bytes, `120.0 MiB/1.2 GiB`."""
    done, total = r.get("done") or 0, r.get("total")
    shown = format_size if r.get("unit") == "bytes" else number
    return f"{shown(done)}/{shown(total)}" if total else shown(done)


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
            bar = f" [{'#' * filled}{'.' * (30 - filled)}] {count(r)}"
        else:
            bar = f" {count(r)}"
        unit = "" if r.get("unit") == "bytes" else f" {r.get('unit', '')}"  # the sizes say it
        rate = f" · {rate_text(r)}" if r.get("rate") else ""
        eta = f" · ETA {duration(r['eta_s'])}" if r.get("eta_s") is not None else ""
        self.stream.write(f"\r{r.get('stage', '')}{bar}{unit}{rate}{eta}\x1b[K")
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
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = Console(file=stream, highlight=False)
        self.bars = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[count]}"),
            TextColumn("{task.fields[unit]}"),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.tasks: dict[str, Any] = {}
        self.closed = False
        self.bars.start()

    def progress(self, r: dict[str, Any]) -> None:
        if self.closed:
            return
        stage = str(r.get("stage", ""))
        rate = rate_text(r) if r.get("rate") else ""
        unit = "" if r.get("unit") == "bytes" else str(r.get("unit", ""))  # the sizes say it
        fields: dict[str, Any] = {"unit": unit, "rate": rate, "count": count(r)}
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

        self.close()  # the bars' final state first, once; the result under it
        table = Table(title="result", show_header=False, title_justify="left")
        for k, v in r.items():
            if k != "kind":
                table.add_row(str(k), figure(k, v))
        self.console.print(table)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.bars.stop()


_views: dict[int, Any] = {}


def rate_text(r: dict[str, Any]) -> str:
    return f"{format_size(r['rate'])}/s" if r.get("unit") == "bytes" else f"{number(r['rate'])}/s"


def view_for(stream: TextIO) -> Any:
    # While its bars run, rich swaps sys.stderr for a proxy of it: the same terminal, one view
    # (a second view there drew its own stale bar again at exit)
    stream = getattr(stream, "rich_proxied_file", stream)
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
