"""Disk free for the runbook's watched paths and per-GPU utilisation/memory with sparklines,
from the agent's HostStats samples (`remote_agent/stats.py`: disk[], gpus[] or gpu_error)."""

from __future__ import annotations

from collections import deque
from typing import Any

from rich.markup import escape
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Sparkline, Static

from runbook.units import format_size

HISTORY = 60  # samples per sparkline (2 minutes at the agent's 2 s interval)


def bar(frac: float, width: int = 10) -> str:
    frac = min(max(frac, 0.0), 1.0)
    full = int(round(frac * width))
    return "█" * full + "░" * (width - full)


def disk_markup(disk: list[dict[str, Any]]) -> str:
    if not disk:
        return "[dim]disk: no watched paths[/]"
    lines = []
    for d in disk:
        path = escape(str(d.get("path")))
        if d.get("free") is None or not d.get("total"):
            lines.append(f"[b]{path}[/] [red]{escape(str(d.get('error') or 'unavailable'))}[/]")
            continue
        used = 1 - d["free"] / d["total"]
        style = "red" if used > 0.95 else "yellow" if used > 0.85 else "green"
        lines.append(
            f"[b]{path}[/] [{style}]{bar(used)}[/] {format_size(d['free'])} free of "
            f"{format_size(d['total'])}"
        )
    return "\n".join(lines)


class GpuRow(Horizontal):
    DEFAULT_CSS = """
    GpuRow { height: 1; }
    GpuRow .gpu-label { width: 34; }
    GpuRow Sparkline { width: 1fr; height: 1; }
    """

    def __init__(self, index: int) -> None:
        super().__init__(id=f"gpu-{index}")
        self.index = index
        self.util: deque[float] = deque(maxlen=HISTORY)

    def compose(self) -> ComposeResult:
        yield Label("", classes="gpu-label")
        yield Sparkline([], summary_function=max)

    def update_gpu(self, g: dict[str, Any]) -> None:
        util = float(g.get("util") or 0.0)
        self.util.append(util)
        used, total = g.get("mem_used_mib"), g.get("mem_total_mib")
        mem = f"{used / 1024:.0f}/{total / 1024:.0f}G" if used is not None and total else "mem ?"
        self.query_one(Label).update(f"GPU{g.get('index')} {util:3.0f}% {mem}")
        self.query_one(Sparkline).data = list(self.util)


class ResourcesPanel(Vertical):
    DEFAULT_CSS = """
    ResourcesPanel { height: auto; max-height: 16; padding: 0 1; }
    ResourcesPanel #disk, ResourcesPanel #gpu-status { height: auto; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.host: str | None = None
        self.samples = 0

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
        if gpus is None:
            status.update(
                f"[yellow]no GPU[/] [dim]({escape(str(sample.get('gpu_error') or 'no data'))})[/]"
            )
            box.remove_children()
            return
        status.update(
            f"{len(gpus)} GPU(s) · util % · memory"
            if gpus
            else "[yellow]no GPU[/] [dim](none listed)[/]"
        )
        rows = {r.index: r for r in box.query(GpuRow)}
        wanted = [int(g.get("index") or i) for i, g in enumerate(gpus)]
        if sorted(rows) != sorted(wanted):
            box.remove_children()
            rows = {i: GpuRow(i) for i in wanted}
            box.mount_all(rows.values())
            # rows compose on mount: fill them after they exist
            self.call_after_refresh(self._fill, rows, gpus, wanted)
            return
        self._fill(rows, gpus, wanted)

    def _fill(self, rows: dict[int, GpuRow], gpus: list[dict[str, Any]], wanted: list[int]) -> None:
        for i, g in zip(wanted, gpus, strict=True):
            if rows[i].is_mounted:
                rows[i].update_gpu(g)
