"""A host session leaves no agent behind, however it ends: its close cancelled midway (the app
exits while the quit closes the engine), its open cancelled mid-handshake, or a caller that
asks for the connection again after the close (a follow that sees the agent's goodbye).

Each left the local agent running, unreaped, and its transport was finalized after the loop had
closed: "Event loop is closed" (PytestUnraisableExceptionWarning), at worst a crash at exit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runbook.agent_client import ConnectionLost, HostSession
from runbook.transports.local import LocalTransport
from tests.support.leaks import recording_agents, run_and_collect, running


@pytest.mark.parametrize("ticks", [1, 3, 10])
def test_a_cancelled_close_still_reaps_the_agent(tmp_path: Path, monkeypatch, ticks: int):
    started = recording_agents(monkeypatch)

    async def main() -> None:
        session = HostSession("local", LocalTransport(tmp_path / "spool"))
        await session.call("ping")
        closing = asyncio.ensure_future(session.close())
        for _ in range(ticks):  # into the goodbye (or the wait for the agent's exit)
            await asyncio.sleep(0)
        if closing.cancel():
            with pytest.raises(asyncio.CancelledError):
                await closing
        else:  # the close won the race (a quick agent exit): only the longest wait may see that
            assert ticks == 10, "the close finished before a cancel a few ticks in"
            await closing
        assert running(started) == [], "the cancelled close left the agent running"

    assert run_and_collect(main) == []
    assert len(started) == 1


def test_an_open_cancelled_mid_handshake_leaves_no_agent(tmp_path: Path, monkeypatch):
    started = recording_agents(monkeypatch)

    async def main() -> None:
        session = HostSession("local", LocalTransport(tmp_path / "spool"))
        connecting = asyncio.ensure_future(session.connection())
        while not started:  # the agent is started; its hello is not answered yet
            await asyncio.sleep(0)
        connecting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await connecting
        await session.close()
        assert running(started) == [], "the cancelled open left its agent running"

    assert run_and_collect(main) == []


def test_no_new_agent_after_the_close(tmp_path: Path, monkeypatch):
    started = recording_agents(monkeypatch)

    async def main() -> None:
        session = HostSession("local", LocalTransport(tmp_path / "spool"))
        await session.call("ping")
        await session.close()
        with pytest.raises(ConnectionLost):
            await session.call("ping")
        with pytest.raises(ConnectionLost):
            await session.connection()

    assert run_and_collect(main) == []
    assert len(started) == 1, "a call after the close started an agent nobody closes"
    assert running(started) == []


def test_a_cancel_of_the_close_reaches_its_caller_while_the_reader_winds_down():
    """The close waited for its reader task with `await task` inside `except CancelledError:
    pass`, which also swallowed a cancel of the close itself (the 10-tick case above flaked
    under load). The channel here is a stand-in whose reader takes 0.2 s to end once
    cancelled, so the cancel lands in that wait every time."""
    from runbook.agent_client import AgentConnection

    class SlowReader:
        async def readline(self) -> bytes:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await asyncio.sleep(0.2)  # winding down
                raise
            return b""

    class Channel:
        reader = SlowReader()
        closed = False

        async def close(self) -> None:
            self.closed = True

    async def main() -> None:
        channel = Channel()
        conn = AgentConnection(channel)
        conn.start()
        await asyncio.sleep(0)
        closing = asyncio.ensure_future(conn.close())
        await asyncio.sleep(0.05)  # the close waits for the reader now
        assert closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert channel.closed and conn.closed.is_set()
        await asyncio.sleep(0.3)  # the reader's own end, before the loop closes

    asyncio.run(main())
