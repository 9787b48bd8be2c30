"""Issue 15, item 11: an unreachable host is reported promptly: after a few failed attempts one
line names the host, the error and what to do, and the header says "unreachable" with the error
(it showed "connecting (attempt 7)" for 45 s and nothing else)."""

from __future__ import annotations

import socket
import time

from eagle_tui.app.widgets.host.header import RunHeader

from .helpers import RUNBOOKS, Env, wait_for


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


async def test_unreachable_host_says_so_within_seconds(tmp_path):
    (tmp_path / "work").mkdir()
    host = f"nobody@127.0.0.1:{closed_port()}"
    env = Env(tmp_path, RUNBOOKS / "actions.yaml", host=host)
    app = env.app()
    async with app.run_test(size=(160, 30)) as pilot:
        t0 = time.monotonic()
        note = await wait_for(
            pilot,
            lambda: next(
                (n.message for n in app._notifications if "cannot reach" in n.message), None
            ),
            timeout=20,
            what="the unreachable-host line",
        )
        took = time.monotonic() - t0
        assert took < 15, took
        assert host in note and "Connect call failed" in note and "ssh " in note, note
        header = app.screen.query_one(RunHeader)
        text = str(header.render())
        assert "unreachable, retrying" in text and "Connect call failed" in text, text
        assert sum("cannot reach" in n.message for n in app._notifications) == 1  # once
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, timeout=40, what="exit")
