"""Choose the transport for a host name: `local` (the agent as a subprocess) or ssh."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runbook.transports import Transport, TransportError
from runbook.transports.local import LocalTransport


def local_spool(state_dir: Path) -> Path:  # noqa: ARG001
    """The box's one spool (as over ssh), whatever the state dir: the driver lock lives there."""
    return Path(os.environ.get("EAGLE_TUI_SPOOL") or Path.home() / ".eagle-tui" / "spool")


def make_transport_factory(state_dir: Path, options: Any = None) -> Callable[..., Transport]:
    """`factory(host, config=None)`: `config` is the runbook's HostConfig when `host` names an
    entry of its `hosts:` (ssh target, python, spool); else `host` is the ssh target itself."""

    def factory(host: str, config: Any = None) -> Transport:
        if config is None and host in ("local", "localhost-agent"):
            state_dir.mkdir(parents=True, exist_ok=True)
            return LocalTransport(
                local_spool(state_dir), agent_log=Path(state_dir) / "agent-local.log"
            )
        try:
            from runbook.transports.ssh import SshTransport
        except ImportError as exc:
            raise TransportError(f"ssh transport unavailable: {exc}", permanent=True) from exc
        return SshTransport.from_options(host, state_dir, options, config)

    return factory
