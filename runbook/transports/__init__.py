"""Transports carry the agent's JSON lines. Only they differ between local and remote."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol


class TransportError(Exception):
    """Could not reach the agent. `permanent` errors (auth, host key, config) are never retried."""

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class Endpoint:
    transport: str  # "local" | "ssh"
    host: str  # "local" or the ssh target as the user wrote it
    host_key: str | None = None  # SHA256 fingerprint of the verified host key (ssh)


class Channel(Protocol):
    """One live connection to an agent: a line reader and writer."""

    reader: asyncio.StreamReader

    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    async def close(self) -> None: ...


class Transport(Protocol):
    endpoint: Endpoint

    async def open(self) -> Channel:
        """Start (or reach) an agent and return a channel to it; raise TransportError."""
        ...

    async def close(self) -> None: ...
