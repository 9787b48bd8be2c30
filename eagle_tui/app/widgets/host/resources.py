"""Disk free for the runbook's watched paths and per-GPU utilisation/memory with sparklines,
from the agent's HostStats samples (`remote_agent/agent/stats.py`: disk[], gpus[] or gpu_error)."""

from __future__ import annotations

from collections import deque
from contextlib import suppress
from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.css.query import NoMatches
from textual.widgets import Label, Static

from eagle_tui.app.literal import lines as join_lines
from eagle_tui.app.literal import markup
from runbook.units import format_size

HISTORY = 60  # samples per sparkline (2 minutes at the agent's 2 s interval)


def bar(frac: float, width: int = 10) -> str:
    frac = min(max(frac, 0.0), 1.0)
    full = int(round(frac * width))
    return "█" * full + "░" * (width - full)


def disk_markup(disk: list[dict[str, Any]]) -> Content:
    if not disk:
        return markup("[dim]disk: no watched paths[/]")
    lines = []
    for d in disk:
        path = d.get("path")
        if d.get("free") is None or not d.get("total"):
            lines.append(
                markup(
                    "[b]$path[/] [$text-error]$why[/]",
                    path=path,
                    why=d.get("error") or "unavailable",
                )
            )
            continue
        used = 1 - d["free"] / d["total"]
        style = "red" if used > 0.95 else "yellow" if used > 0.85 else "green"
        lines.append(
            markup(
                f"[b]$path[/] [{style}]$bar[/] $free free of $total",
                path=path,
                bar=bar(used),
                free=format_size(d["free"]),
                total=format_size(d["total"]),
            )
        )
    return join_lines(lines)


BLOCKS = " ▁▂▃▄▅▆▇█"


def spark(values: list[float], width: int) -> str:
    """A sparkline on a fixed 0-100 scale (Textual's Sparkline scales to min..max, which turns
    memory creeping from 70.1% to 70.3% into a full-height ramp)."""
    out = []
    for v in values[-width:]:
        out.append(BLOCKS[round(min(max(v, 0.0), 100.0) / 100.0 * (len(BLOCKS) - 1))])
    return "".join(out).rjust(width)


class PercentSpark(Static):
    DEFAULT_CSS = """
    PercentSpark { width: 1fr; height: 1; color: $accent; margin-right: 1; }
    """

    def __init__(self, history: deque[float], **kwargs: Any) -> None:
        super().__init__("", **kwargs)
        self.history = history

    def render(self) -> str:
        return spark(list(self.history), max(1, self.size.width))


class GpuRow(Horizontal):
    """`GPU0  87% 101/140G` then sparklines of utilisation and memory use (last 2 minutes)."""

    DEFAULT_CSS = """
    GpuRow { height: 1; }
    GpuRow .gpu-label { width: 22; }
    """

    def __init__(self, index: int, util: deque[float], mem: deque[float]) -> None:
        super().__init__(id=f"gpu-{index}")
        self.index = index
        self.util, self.mem = util, mem  # owned by the panel: they survive the row being rebuilt

    def compose(self) -> ComposeResult:
        yield Label("", classes="gpu-label")
        yield PercentSpark(self.util, id="util")
        yield PercentSpark(self.mem, id="mem")

    def update_gpu(self, g: dict[str, Any]) -> None:
        util = float(g.get("util") or 0.0)
        used, total = g.get("mem_used_mib"), g.get("mem_total_mib")
        mem = f"{used / 1024:.0f}/{total / 1024:.0f}G" if used is not None and total else "mem ?"
        with suppress(NoMatches):  # a row replaced (GPU set changed) or the app shutting down
            self.query_one(Label).update(f"GPU{g.get('index')} {util:3.0f}% {mem}")
            self.query_one("#util", PercentSpark).refresh()
            self.query_one("#mem", PercentSpark).refresh()


class ResourcesPanel(Vertical):
    DEFAULT_CSS = """
    ResourcesPanel { height: auto; max-height: 16; padding: 0 1; }
    ResourcesPanel #disk, ResourcesPanel #gpu-status { height: auto; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.host: str | None = None
        self.samples = 0
        self.history: dict[int, tuple[deque[float], deque[float]]] = {}  # util %, memory %
        self._rows: dict[int, GpuRow] = {}

    def compose(self) -> ComposeResult:
        yield Static("[dim]disk: waiting for the agent's first sample…[/]", id="disk")
        yield Static("", id="gpu-status")
        yield Vertical(id="gpus")

    def update_sample(self, host: str, sample: dict[str, Any]) -> None:
        self.host = host
        self.samples += 1
        self.query_one("#disk", Static).update(disk_markup(sample.get("disk") or []))
        gpus = sample.get("gpus")
        status = self.query_one("#gpu-status", Static)
        box = self.query_one("#gpus", Vertical)
        if not gpus:
            why = (sample.get("gpu_error") or "nvidia-smi lists no GPU").removeprefix("no GPU: ")
            status.update(markup("[b $text-warning]no GPU[/] [dim]($why)[/]", why=why))
            if self._rows:
                box.remove_children()
                self._rows = {}
            return
        status.update(f"{len(gpus)} GPU(s) · util % · memory · [dim]history: util | memory[/]")
        indexes = [int(g["index"]) if g.get("index") is not None else i for i, g in enumerate(gpus)]
        for i, g in zip(indexes, gpus, strict=True):
            util, mem = self.history.setdefault(i, (deque(maxlen=HISTORY), deque(maxlen=HISTORY)))
            util.append(float(g.get("util") or 0.0))
            used, total = g.get("mem_used_mib"), g.get("mem_total_mib")
            mem.append(100.0 * float(used) / float(total) if used is not None and total else 0.0)
        if sorted(self._rows) != sorted(indexes):
            box.remove_children()
            self._rows = {i: GpuRow(i, *self.history[i]) for i in indexes}
            box.mount_all(self._rows.values())
        for i, g in zip(indexes, gpus, strict=True):
            row = self._rows[i]
            if row.is_mounted and row.children:
                row.update_gpu(g)
            else:  # composing: fill it once its label and sparkline exist
                row.call_after_refresh(row.update_gpu, g)
