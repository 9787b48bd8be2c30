"""Host stats: subscribe to the agent's samples and re-watch after reconnects."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from runbook.agent_client import AgentError, ConnectionLost, HostSession
from runbook.events import Event, HostStats
from runbook.transports import TransportError


async def follow_stats(
    session: HostSession,
    host: str,
    paths: list[str],
    emit: Callable[[Event], None],
    wanted: Callable[[], bool],
) -> None:
    """Stream `host`'s samples as HostStats events while `wanted()` (the engine is open and
    `session` is still the host's session)."""
    last_seq = -1

    def on_event(msg: dict[str, Any]) -> None:
        nonlocal last_seq
        if msg.get("event") == "stats" and int(msg.get("seq", -1)) > last_seq:
            last_seq = int(msg["seq"])
            emit(HostStats(host, msg))

    session.subscribe(on_event)
    # Stop when this session is replaced (e.g. the TUI reconnects after trusting a host key):
    # the new session has its own loop.
    while wanted():
        try:
            conn = await session.connection()
            missed = await conn.call("stats.since", seq=last_seq)
            for sample in missed.get("samples", []):
                on_event({"event": "stats", **sample})
            await conn.call("stats.watch", paths=paths, interval_s=2.0)
            await conn.closed.wait()
        except TransportError as exc:
            # a permanent refusal (host key, auth) is not retried in a loop; a new session
            # (e.g. after the operator trusts the key) starts its own stats loop
            if exc.permanent:
                return
            await asyncio.sleep(1.0)
        except (AgentError, ConnectionLost):
            await asyncio.sleep(1.0)
        except asyncio.CancelledError:
            return
