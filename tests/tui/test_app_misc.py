"""Keymaps and the command palette, central worker-error handling, the host-key trust hook."""

from __future__ import annotations

import asyncio

from textual.command import CommandPalette

from eagle_tui.app.screens.dialogs import AskScreen, ErrorScreen
from eagle_tui.app.screens.main import ACTIONS
from runbook.events import ConnectionChanged, HostStats
from runbook.transports import Endpoint, HostKeyRefusal, TransportError
from runbook.transports.local import LocalTransport

from .helpers import SIZE, Events, opened, status, wait_for

FP = "SHA256:" + "Zm9vYmFyYmF6" * 3 + "abcdefg"


async def test_user_keymap_rebinds_by_id(env):
    path = env.root / "config" / "eagle-tui" / "keymap.toml"
    path.parent.mkdir(parents=True)
    path.write_text('run-selected = "g"\nbogus-id = "z"\n')
    app = env.app(keymap_paths=None)  # the default location: $XDG_CONFIG_HOME/eagle-tui
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        assert any("bogus-id" in n.message for n in app._notifications)
        await pilot.press("r")  # no longer bound
        await pilot.pause()
        assert status(app, "ok") == "pending"
        await pilot.press("g")
        await wait_for(pilot, lambda: status(app, "ok") == "succeeded", what="ok via the new key")


async def test_every_action_is_in_the_command_palette(env):
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        titles = [c.title for c in app.get_system_commands(app.main)]
        for key, _action, desc, _bid in ACTIONS:
            assert f"{desc} [{key}]" in titles
        assert all(b.id for b in app.main.BINDINGS)
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), what="the palette")
        await pilot.press(*"Dry-run", "enter")  # palette commands run the same actions
        await wait_for(
            pilot, lambda: any("dry-run:" in n.message for n in app._notifications), what="dry-run"
        )


async def test_worker_errors_become_notifications_or_a_modal_never_a_crash(env):
    app = env.app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot)
        app.main.select("long")
        await pilot.press("r")
        await wait_for(pilot, lambda: status(app, "long") == "running", what="long to run")
        # an operator mistake the engine refuses (bypassing the screen's own check): a warning
        app.run_worker(app.engine.skip("long", "why not"), name="skip:long", exit_on_error=False)
        await wait_for(
            pilot,
            lambda: any("cancel it first" in n.message for n in app._notifications),
            what="the refusal",
        )

        async def boom() -> None:
            raise RuntimeError("unexpected failure inside a worker")

        app.run_worker(boom(), name="boom", exit_on_error=False)
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorScreen), what="the error modal")
        await pilot.press("escape")
        assert app.is_running and app.screen is app.main
        app.main.select("long")
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, AskScreen), what="cancel question")
        await pilot.press("y")
        await wait_for(pilot, lambda: status(app, "long") == "cancelled", what="cancelled")


class RefusingTransport:
    """Refuses like the SSH transport does an unknown host, until its fingerprint is trusted
    through the CLI options (`--trust-host`), which the app replaces when the operator agrees."""

    def __init__(self, inner: LocalTransport, options) -> None:
        self.inner, self.options = inner, options
        self.endpoint = Endpoint("ssh", "gpu-box", host_key=None)

    async def open(self):
        if FP not in self.options.trust_host:
            err = TransportError(
                f"gpu-box: unknown host key {FP} (not in known_hosts); to trust it: --trust-host {FP}",
                permanent=True,
            )
            err.host_key = HostKeyRefusal("unknown", "gpu-box", FP, "ssh-ed25519")
            raise err
        self.endpoint = Endpoint("ssh", "gpu-box", host_key=FP)
        return await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()


async def test_unknown_host_key_is_asked_about_then_trusted(env):
    env.host = "gpu-box"
    holder = {}

    def factory(host: str, config=None) -> RefusingTransport:  # the real factory's signature
        return RefusingTransport(LocalTransport(env.root / "spool"), holder["app"].options)

    app = holder["app"] = env.app(transports=factory)
    events = Events(app)
    async with app.run_test(size=SIZE) as pilot:
        # the run opens only once the box is reached (the driver claim is taken there)
        ask = await wait_for(
            pilot, lambda: isinstance(app.screen, AskScreen) and app.screen, what="trust question"
        )
        assert FP in ask.body
        old = app.engine.sessions["gpu-box"]
        old_stats = list(app.engine._stats_tasks)
        await pilot.press("y")
        await opened(pilot)
        await wait_for(
            pilot, lambda: events.of(HostStats), what="stats over the trusted connection"
        )
        assert app.options.trust_host == (FP,)
        assert app.engine.sessions["gpu-box"] is not old
        connected = [e for e in events.of(ConnectionChanged) if e.state == "connected"]
        assert connected and connected[-1].host_key == FP
        assert "● connected" in str(app.main.query_one("#header").render())
        # the refused session's stats loop ends instead of retrying forever (engine change)
        await wait_for(
            pilot, lambda: all(t.done() for t in old_stats), what="the old stats loop to end"
        )
        await pilot.press("r")
        await wait_for(
            pilot, lambda: status(app, "ok") == "succeeded", what="a step on the trusted host"
        )
        await asyncio.sleep(0)


async def test_a_run_driven_elsewhere_exits_4_with_one_line(env):
    """Issue 15: no modal to dismiss (it was a blank screen, then a silent exit): the app exits
    4 at once and run_app prints the refusal, which names the holder's pid."""
    import os

    from runbook.state import RunStore

    app = env.app()
    other = RunStore(env.state, app.run_id)
    other.lock()  # another eagle-tui process drives this run
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: not app.is_running, what="the app to exit")
            assert not isinstance(app.screen, ErrorScreen)
        assert app.return_value == 4  # locked: the same exit code as a second headless driver
        assert "another eagle-tui process" in app.refusal
        assert f"pid {os.getpid()}" in app.refusal
    finally:
        other.unlock()


async def test_a_full_spool_at_open_is_one_line_not_a_traceback(env):
    """The box's spool is full when the cockpit opens the run (its driver lock cannot be
    written): the error modal says so in one line, and the app exits 2 when it is closed."""
    import subprocess

    import pytest

    from remote_agent.agent.spool import Spool

    spool = env.root / "spool"
    spool.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(spool)]).returncode:
        pytest.skip("needs root to mount a tmpfs")
    try:
        Spool(spool).ensure()  # the agent was here before, while there was room
        with open(spool / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass
        app = env.app()
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, ErrorScreen), what="the modal")
            body = app.screen.body
            assert "No space left on device" in body and "Traceback" not in body, body
            assert len(body.strip().splitlines()) == 1, body
            await pilot.press("escape")
            await wait_for(pilot, lambda: not app.is_running, what="the app to exit")
        assert app.return_value == 2
    finally:
        subprocess.run(["umount", "-l", str(spool)])
