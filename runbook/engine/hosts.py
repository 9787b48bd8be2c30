"""Hosts: a session per box (transport, reconnects), its stats, and the driver claim on it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from runbook import box_claim
from runbook.agent_client import HostSession
from runbook.audit import Head
from runbook.engine.constants import LOCAL, TransportFactory
from runbook.engine.stats import follow_stats
from runbook.events import ConnectionChanged, Event
from runbook.schema import Runbook, Step
from runbook.transports import HostKeyRefusal


class Hosts:
    """The engine's connections. `runbook()` is the run's runbook (its `hosts:` and `watch:`),
    read when needed: opening a run may load it again for the run id chosen under the claim."""

    def __init__(
        self,
        runbook: Callable[[], Runbook],
        default_host: str,
        transports: TransportFactory,
        emit: Callable[[Event], None],
        want_stats: bool = False,
    ) -> None:
        self.runbook = runbook
        self.default_host = default_host
        self.transports = transports
        self.emit = emit
        self.want_stats = want_stats
        self.sessions: dict[str, HostSession] = {}
        self.stats_tasks: list[asyncio.Task] = []
        self.claimed: set[str] = set()  # hosts besides the default one holding the claim
        self.closed = False

    def host_of(self, step: Step) -> str:
        return step.host or self.default_host

    def where(self, host: str) -> dict[str, Any]:
        """What the audit records of a host: transport, host key, the agent's host and boot."""
        session = self.sessions.get(host)
        ep = session.endpoint if session else None
        hello = session.hello if session else {}
        return {
            "transport": ep.transport if ep else ("local" if host == LOCAL else "ssh"),
            "host": host,
            "host_key": ep.host_key if ep else None,
            "agent_host": hello.get("hostname"),
            "agent_user": hello.get("user"),
            "boot_id": hello.get("boot_id"),
        }

    def where_of(self, step: Step) -> dict[str, Any]:
        return self.where(self.host_of(step))

    async def session(self, host: str) -> HostSession:
        if host not in self.sessions:

            def on_status(
                state: str,
                attempt: int,
                message: str | None,
                refused: HostKeyRefusal | None,
                host: str = host,
            ) -> None:
                ep = self.sessions[host].endpoint if host in self.sessions else None
                key = ep.host_key if ep else None
                self.emit(ConnectionChanged(host, state, attempt, message, key, refused))

            rb = self.runbook()
            config = rb.hosts.get(host)
            transport = self.transports(host) if config is None else self.transports(host, config)
            session = self.sessions[host] = HostSession(host, transport, on_status)
            if self.want_stats:
                self.stats_tasks.append(
                    asyncio.ensure_future(
                        follow_stats(
                            session,
                            host,
                            list(rb.watch) or ["/"],
                            self.emit,
                            lambda: not self.closed and self.sessions.get(host) is session,
                        )
                    )
                )
        return self.sessions[host]

    async def reconnect(self, host: str, transports: TransportFactory) -> HostSession:
        """Connect `host` again through another factory (a host key trusted since): its old
        session closes (its jobs keep running), every later session uses the new factory."""
        self.transports = transports
        old = self.sessions.pop(host, None)
        if old is not None:
            await old.close()
        session = await self.session(host)
        await session.connection()
        return session

    async def call(self, host: str, op: str, **args: Any) -> dict[str, Any]:
        return await (await self.session(host)).call(op, **args)

    async def spool_id(self, host: str) -> str | None:
        return (await self.session(host)).hello.get("spool_id")

    # ------------------------------------------------------------------ the driver claim
    async def claim(self) -> None:
        """One driver per work on the default host: taken before the run id is chosen."""
        session = await self.session(self.default_host)
        await box_claim.hold(session, self.runbook().name)

    async def claim_on(self, host: str) -> None:
        """The same claim on another host a step uses, before that step's first job (or
        reattach) there; once per engine and host (the session re-takes it on reconnects)."""
        if host == self.default_host or host in self.claimed:
            return
        await box_claim.hold(await self.session(host), self.runbook().name)
        self.claimed.add(host)

    async def box_head(self, run_id: str) -> dict[str, Any] | None:
        return await box_claim.box_head(await self.session(self.default_host), run_id)

    async def push_head(self, run_id: str, head: Head, clean: bool = False) -> bool:
        """The audit head onto the default host's spool (never reconnecting just for this)."""
        session = self.sessions.get(self.default_host)
        return await box_claim.push_head(session, run_id, head, clean)

    def stop_stats(self) -> None:
        """Closing: no stats loop goes on."""
        self.closed = True
        for t in self.stats_tasks:
            t.cancel()

    async def close(self) -> None:
        """Let go of every connection (the jobs keep running)."""
        for session in self.sessions.values():
            await session.close()
