"""Exit codes, names and types shared by the engine's parts."""

from __future__ import annotations

from collections.abc import Callable

from runbook.transports import Transport

TOOL_VERSION = "eagle-tui 0.1.0"
EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_BLOCKED = 0, 1, 2, 3
EXIT_UNREACHABLE = 5  # a dry run could not evaluate a host's guards (4 is EXIT_LOCKED)
LOCAL = "local"
EXIT_INTERRUPTED = 130  # SIGINT/SIGTERM (128 + 2)

# What each exit code means, in one place (headless summary, cockpit toast, docs)
EXIT_MEANINGS = {
    EXIT_OK: "all steps done",
    EXIT_FAILED: "a step failed or was lost",
    EXIT_INVALID: "invalid input, or the state or audit cannot be trusted",
    EXIT_BLOCKED: "blocked: a guard failed or a confirmation was needed",
    4: "another driver holds this runbook's work on the box",
    EXIT_UNREACHABLE: "a host was unreachable: its guards were not evaluated",
    EXIT_INTERRUPTED: "interrupted (Ctrl+C or SIGTERM)",
}

# factory(host) or, for a host named in the runbook's `hosts:`, factory(host, HostConfig)
TransportFactory = Callable[..., Transport]
