"""Issue 15, item 11: search in the full-log viewer: / finds (case-insensitive) from the first
line on screen, n / N go to the next / previous hit, Esc leaves the search box, then the viewer."""

from __future__ import annotations

from pathlib import Path

from eagle_tui.app.screens.main import MainScreen
from eagle_tui.app.widgets.logs.full_log import FullLogScreen

from .helpers import opened, status, wait_for


async def test_search_the_full_log(env):
    env.extra_sets += ["gate_at=0"]
    app = env.app()
    async with app.run_test(size=(100, 30)) as pilot:
        await opened(pilot)
        app.main.select("long")
        await pilot.press("r")
        await wait_for(pilot, lambda: status(app, "long") == "succeeded", timeout=60, what="long")
        lines = open(app.record("long").log_file).read().splitlines()
        hits = [i for i, x in enumerate(lines) if "OF 30" in x.upper()]
        assert len(hits) == 30
        await pilot.press("l")
        await wait_for(pilot, lambda: isinstance(app.screen, FullLogScreen), what="the viewer")
        screen = app.screen
        await wait_for(pilot, lambda: screen.index.line_count == len(lines), what="the index")
        await pilot.press("slash", *"Line 00012", "enter")
        want = lines.index("train line 00012 of 30")
        await wait_for(pilot, lambda: screen.view.match == want, what="the first hit")
        assert screen.view.scroll_offset.y <= want < screen.view.scroll_offset.y + 20  # on screen
        await pilot.press("slash", *"of 30", "enter")  # from the first line on screen
        await wait_for(pilot, lambda: screen.view.match != want, what="the search from the top")
        first = screen.view.match
        assert first in hits and want - 3 <= first < want
        await pilot.press("n")
        nxt = hits[hits.index(first) + 1]
        await wait_for(pilot, lambda: screen.view.match == nxt, what="n: the next hit")
        await pilot.press("N")
        await wait_for(pilot, lambda: screen.view.match == first, what="N: the previous hit")
        await pilot.press("slash", *"00030 OF", "enter")  # the last hit, then n: none below
        last = lines.index("train line 00030 of 30")
        await wait_for(pilot, lambda: screen.view.match == last, what="the last line")
        await pilot.press("n")
        await wait_for(
            pilot,
            lambda: any("no more '00030 OF' below" in n.message for n in app._notifications),
            what="n after the last hit",
        )
        assert screen.view.match == last
        await pilot.press("slash")
        assert screen.query_one("#find").display
        await pilot.press("escape")  # leaves the search box, not the viewer
        assert not screen.query_one("#find").display and isinstance(app.screen, FullLogScreen)
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen), what="esc closes")


async def test_full_log_counts_hits_and_renders_machine_lines(env):
    """Issue 28: the title says `hit k of N`; `@@eagle3` progress/metrics lines read as the live
    pane shows them (`▸ train · 5/30 …`), never raw JSON."""
    env.extra_sets += ["gate_at=0"]
    app = env.app()
    async with app.run_test(size=(100, 30)) as pilot:
        await opened(pilot)
        app.main.select("long")
        await pilot.press("r")
        await wait_for(pilot, lambda: status(app, "long") == "succeeded", timeout=60, what="long")
        lines = open(app.record("long").log_file).read().splitlines()
        assert any(x.startswith("@@eagle3 ") for x in lines)
        await pilot.press("l")
        await wait_for(pilot, lambda: isinstance(app.screen, FullLogScreen), what="the viewer")
        screen = app.screen
        await wait_for(pilot, lambda: screen.index.line_count == len(lines), what="the index")
        shown = [screen.view._line(i)[1] for i in range(len(lines))]
        assert not any(x.startswith("@@eagle3") for x in shown)
        assert any(x.startswith("▸ train · ") for x in shown), shown[:12]
        await pilot.press("slash", *"of 30", "enter")
        title = screen.query_one("#full-log-title")
        await wait_for(pilot, lambda: "'of 30': hit 1 of 30" in str(title.render()), what="count")
        await pilot.press("n")
        await wait_for(pilot, lambda: "'of 30': hit 2 of 30" in str(title.render()), what="n")


async def test_full_log_shows_when_each_line_arrived(env):
    """Issue 28: logs had no timestamps. `t` in the full log adds a column with the arrival time
    of the chunk that brought each line (the mirror's `.times` sidecar); `t` again hides it."""
    import time as _time

    from eagle_tui.app.widgets.logs.full_log import arrival
    from runbook.mirror import ChunkTimes

    env.extra_sets += ["gate_at=0"]
    app = env.app()
    async with app.run_test(size=(100, 30)) as pilot:
        await opened(pilot)
        t0 = _time.time()
        app.main.select("long")
        await pilot.press("r")
        await wait_for(pilot, lambda: status(app, "long") == "succeeded", timeout=60, what="long")
        t1 = _time.time()
        log = app.record("long").log_file
        times = ChunkTimes.read(Path(log))
        size = Path(log).stat().st_size
        assert times.ends and times.ends[-1] == size  # every byte has its chunk's time
        assert times.ends == sorted(set(times.ends))
        assert all(t0 - 1 <= t <= t1 + 1 for t in times.times)
        await pilot.press("l")
        await wait_for(pilot, lambda: isinstance(app.screen, FullLogScreen), what="the viewer")
        screen = app.screen
        n = len(open(log).read().splitlines())
        await wait_for(pilot, lambda: screen.index.line_count == n, what="the index")
        plain = screen.view.render_line(0).text
        await pilot.press("t")
        await pilot.pause()
        title = str(screen.query_one("#full-log-title").render())
        assert "· times" in title
        for y in range(min(n, 10)):
            offset, _ = screen.view._line(y)
            want = arrival(times.at(offset))
            assert want in screen.view.render_line(y).text, (y, want)
        assert arrival(times.at(0)) not in plain
        await pilot.press("t")
        await pilot.pause()
        assert screen.view.render_line(0).text == plain
