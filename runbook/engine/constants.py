"""Exit codes, names and types shared by the engine's parts."""

from __future__ import annotations

from collections.abc import Callable

from runbook.transports import Transport

TOOL_VERSION = "eagle-tui 0.1.0"
EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_BLOCKED = 0, 1, 2, 3
EXIT_UNREACHABLE = 5  # a dry run could not evaluate a host's guards (4 is EXIT_LOCKED)
LOCAL = "local"

# factory(host) or, for a host named in the runbook's `hosts:`, factory(host, HostConfig)
TransportFactory = Callable[..., Transport]
