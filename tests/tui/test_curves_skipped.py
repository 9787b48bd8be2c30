"""The trainer skips a step whose gradient is NaN/inf and goes on (drafter/train/finite.py); the
cockpit's curves say how many it skipped over the run, so the operator sees it at a glance."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import Static

from eagle_tui.app.widgets.progress.curves import Curves
from eagle_tui.app.widgets.progress.metrics import Metrics


class _Host(App):
    def compose(self) -> ComposeResult:
        yield Curves()


async def test_skipped_steps_are_summed_and_shown():
    m = Metrics()
    for step, skipped in ((10, 0), (20, 1), (30, 0), (40, 2)):
        rec = {"kind": "metrics", "step": step, "loss": 2.0, "acc_k": [0.5]}
        if skipped:
            rec["skipped_nonfinite"] = skipped
        m.add(rec)
    assert m.skipped == 3
    app = _Host()
    async with app.run_test() as pilot:
        curves = app.query_one(Curves)
        curves.show(m)
        await pilot.pause()
        text = str(curves.query_one("#curves-status", Static).render())
        assert "3 steps skipped (NaN/inf gradient)" in text
        clean = Metrics()  # a clean run says nothing of it
        clean.add({"kind": "metrics", "step": 1, "loss": 1.0})
        curves.show(clean)
        await pilot.pause()
        assert "skipped" not in str(curves.query_one("#curves-status", Static).render())
