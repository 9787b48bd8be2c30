"""Issue 15, item 11: an unreachable host is reported promptly: after a few failed attempts one
line names the host, the error and what to do, and the header says "unreachable" with the error
(it showed "connecting (attempt 7)" for 45 s and nothing else)."""

from __future__ import annotations

import socket
import time

from eagle_tui.app.widgets.host.header import RunHeader
from runbook.transports import TransportOptions

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
        assert host in note and "TCP connection refused" in note, note
        port = host.rsplit(":", 1)[1]  # the hint in ssh's own syntax, the host named once
        assert f"`ssh -p {port} nobody@127.0.0.1` should work" in note, note
        assert note.count(host) == 1 and note.count("cannot reach") == 1, note
        header = app.screen.query_one(RunHeader)
        text = str(header.render())
        assert "unreachable, retrying" in text and "TCP connection refused" in text, text
        assert sum("cannot reach" in n.message for n in app._notifications) == 1  # once
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, timeout=40, what="exit")


async def test_port_that_never_speaks_ssh_names_the_phase(tmp_path):
    """Issue 28 Major 2: the header and the toast name the phase that ran out and its bound
    (a loopback port this test opens accepts TCP and never answers); `d` says the guards were
    not evaluated instead of "nothing blocked"."""
    (tmp_path / "work").mkdir()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    config = tmp_path / "ssh_config"
    config.write_text("Host *\n  ConnectTimeout 1\n")
    host = f"nobody@127.0.0.1:{server.getsockname()[1]}"
    env = Env(tmp_path, RUNBOOKS / "actions.yaml", host=host)
    app = env.app(
        options=TransportOptions(known_hosts=str(tmp_path / "kh"), ssh_config=str(config))
    )
    try:
        async with app.run_test(size=(160, 30)) as pilot:
            header = app.screen.query_one(RunHeader)
            await wait_for(
                pilot,
                lambda: "unreachable, retrying" in str(header.render()),
                timeout=30,
                what="the header to say unreachable",
            )
            text = str(header.render())
            assert "no SSH handshake" in text and "within 1 s (ConnectTimeout)" in text, text
            assert text.count(host) == 1, text  # the host is not repeated inside the error
            note = await wait_for(
                pilot,
                lambda: next(
                    (n.message for n in app._notifications if "cannot reach" in n.message), None
                ),
                what="the toast",
            )
            assert "no SSH handshake" in note and note.count(host) == 1, note
            await pilot.press("d")  # the run cannot open yet: `d` says why, not nothing
            dry = await wait_for(
                pilot,
                lambda: next(
                    (n.message for n in app._notifications if n.message.startswith("dry-run")),
                    None,
                ),
                timeout=30,
                what="the dry run's verdict",
            )
            assert dry.startswith("dry-run: the run is still opening: "), dry
            assert "no SSH handshake" in dry and "nothing blocked" not in dry
            await pilot.press("q")
            await wait_for(pilot, lambda: not app.is_running, timeout=40, what="exit")
    finally:
        server.close()
