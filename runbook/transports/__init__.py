"""Transports carry the agent's JSON lines. Only they differ between local and remote."""

from __future__ import annotations

import asyncio
import re
import warnings
from dataclasses import dataclass, replace
from typing import Literal, Protocol

# asyncssh 2.24 still names DSA keys, and cryptography >= 46 warns about that on stderr at
# import: noise in the operator's console (and in one-line refusals), never something to act on.
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh(\..*)?$")

FINGERPRINT_RE = re.compile(r"SHA256:[A-Za-z0-9+/]{43}=?")  # as `ssh-keygen -l` prints it


@dataclass(frozen=True)
class HostKeyRefusal:
    """A refused host key as fields, so a UI never parses the message (issue 19).

    `unknown`: no known_hosts entry; the operator may trust `fingerprint`. `changed`: known_hosts
    holds other keys (`known`); never offered for trust."""

    kind: Literal["unknown", "changed"]
    host: str  # as known_hosts names it: `host` or `[host]:port`
    fingerprint: str  # the key the server presented
    key_type: str  # its algorithm, e.g. "ssh-ed25519"
    known: tuple[str, ...] = ()  # fingerprints known_hosts has for the host (changed only)


class TransportError(Exception):
    """Could not reach the agent. `permanent` errors (auth, host key, config) are never retried."""

    host_key: HostKeyRefusal | None = None  # set by the host-key refusals

    def __init__(self, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class TransportOptions:
    """What the CLI tells the transports, built once from its flags. A UI that trusts a key
    makes a new one (`trusting`); nothing mutates it."""

    known_hosts: str | None = None
    ssh_config: str | None = None
    trust_host: tuple[str, ...] = ()
    python: str | None = None  # `--python`: the box's python for a host not in `hosts:`

    def trusting(self, fingerprint: str) -> TransportOptions:
        if fingerprint in self.trust_host:
            return self
        return replace(self, trust_host=(*self.trust_host, fingerprint))


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
