"""Live training curves: loss, per-position accuracy and simulated acceptance length.

Redraws are coalesced (at most every REDRAW_S): a metrics line per training step would otherwise
re-render three plots per step. textual-plotext needs `refresh()` on the widget after new data
(textual-plotext#11)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.widgets import Static
from textual_plotext import PlotextPlot

from eagle_tui.app.widgets.progress.metrics import Metrics, Series

REDRAW_S = 0.5


def _plot(
    widget: PlotextPlot,
    title: str,
    series: dict[str, Series],
    ylim: tuple[float, float] | None = None,
) -> None:
    plt = widget.plt
    plt.clear_data()
    plt.clear_figure()
    plt.title(title)
    for label, s in series.items():
        if s.x:
            plt.plot(s.x, s.y, label=label, marker="hd")
    if ylim is not None:
        plt.ylim(*ylim)
    widget.refresh()


class Curves(Vertical):
    DEFAULT_CSS = """
    Curves { height: 1fr; }
    Curves #curves-status { height: 1; padding: 0 1; }
    Curves Horizontal { height: 1fr; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.metrics: Metrics | None = None
        self._dirty = False

    def compose(self) -> ComposeResult:
        yield Static("[dim]no training metrics for this step[/]", id="curves-status")
        with Horizontal():
            yield PlotextPlot(id="plot-loss")
            yield PlotextPlot(id="plot-acc")
            yield PlotextPlot(id="plot-accept")

    def on_mount(self) -> None:
        self.set_interval(REDRAW_S, self._redraw, name="curves-redraw")

    def show(self, metrics: Metrics | None) -> None:
        self.metrics = metrics
        self._dirty = True
        self._redraw()

    def changed(self) -> None:
        self._dirty = True

    def _redraw(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        m = self.metrics
        status = self.query_one("#curves-status", Static)
        if m is None or m.count == 0:
            status.update("[dim]no training metrics for this step[/]")
            empty: dict[str, Series] = {}
            for pid, title in (
                ("loss", "loss"),
                ("acc", "accuracy by position"),
                ("accept", "sim accept len"),
            ):
                _plot(self.query_one(f"#plot-{pid}", PlotextPlot), title, empty)
            return
        last = m.last
        facts = [
            f"{k} {last[k]:.4g}" if isinstance(last.get(k), float) else f"{k} {last[k]}"
            for k in ("step", "loss", "sim_accept_len", "lr", "tokens_per_s")
            if k in last
        ]
        if m.skipped:  # the run goes on past them; the operator still needs to know
            facts.append(f"{m.skipped} steps skipped (NaN/inf gradient)")
        status.update(Content(f"{m.count:,} metrics records · " + " · ".join(facts)))
        _plot(self.query_one("#plot-loss", PlotextPlot), "loss", {"loss": m.loss})
        _plot(
            self.query_one("#plot-acc", PlotextPlot),
            "accuracy by position",
            {f"acc{k}": s for k, s in sorted(m.acc.items())[:8]},
            (0.0, 1.0),
        )
        _plot(self.query_one("#plot-accept", PlotextPlot), "sim accept len", {"accept": m.accept})
