"""Choose the transport for a host name: `local` (the agent as a subprocess) or ssh."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runbook.transports import Transport, TransportError, TransportOptions
from runbook.transports.local import LocalTransport


def local_spool(state_dir: Path) -> Path:  # noqa: ARG001
    """The box's one spool (as over ssh), whatever the state dir: the driver lock lives there."""
    return Path(os.environ.get("EAGLE_TUI_SPOOL") or Path.home() / ".eagle-tui" / "spool")


@dataclass(frozen=True)
class HostTransports:
    """`factory(host, config=None)`: `config` is the runbook's HostConfig when `host` names an
    entry of its `hosts:` (ssh target, python, spool); else `host` is the ssh target itself.
    Frozen like its options: a UI that trusts a key swaps in `dataclasses.replace(f, options=..)`."""

    state_dir: Path
    options: TransportOptions = field(default_factory=TransportOptions)

    def __call__(self, host: str, config: Any = None) -> Transport:
        if config is None and host in ("local", "localhost-agent"):
            self.state_dir.mkdir(parents=True, exist_ok=True)
            return LocalTransport(
                local_spool(self.state_dir), agent_log=Path(self.state_dir) / "agent-local.log"
            )
        try:
            from runbook.transports.ssh import SshTransport
        except ImportError as exc:
            raise TransportError(f"ssh transport unavailable: {exc}", permanent=True) from exc
        return SshTransport.from_options(host, self.state_dir, self.options, config)


def make_transport_factory(
    state_dir: Path, options: TransportOptions | None = None
) -> HostTransports:
    return HostTransports(Path(state_dir), options or TransportOptions())
