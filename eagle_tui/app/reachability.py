"""When a host cannot be reached: the agent client retries for ever (a box that reboots comes
back), but after a few failed attempts the operator gets one line saying which host, the error,
and what to do, instead of a bare "connecting (attempt 7)"."""

from __future__ import annotations

from dataclasses import dataclass, field

from runbook.transports.ssh_target import ssh_command

UNREACHABLE_AFTER = 3  # failed attempts before the operator is told


def error_of(message: str | None) -> str | None:
    """The transport's error without the retry schedule ("…; retrying in 2.9s")."""
    if not message:
        return None
    return message.rsplit("; retrying in ", 1)[0]


@dataclass
class Reachability:
    failures: dict[str, int] = field(default_factory=dict)
    told: set[str] = field(default_factory=set)

    def update(
        self, host: str, state: str, attempt: int, message: str | None, target: str | None = None
    ) -> str | None:
        """Feed one ConnectionChanged; returns the line to show once per outage, else None.
        `target`: the ssh target the host name stands for (the hint's `ssh` command)."""
        if state == "connected":
            self.failures.pop(host, None)
            self.told.discard(host)
            return None
        if state not in ("connecting", "reconnecting") or not message:
            return None  # an attempt starting, or a final failure (shown by its own path)
        self.failures[host] = attempt
        if attempt < UNREACHABLE_AFTER or host in self.told:
            return None
        self.told.add(host)
        who, err = host, error_of(message) or ""
        head, _, rest = err.partition(": ")
        if rest and (head == host or head.startswith(f"{host} (")):  # the host said once
            who, err = head, rest
        return (
            f"cannot reach {who} after {attempt} attempts: {err}. Still retrying. Check the "
            f"address, port and network (`{ssh_command(target or host)}` should work), "
            "or press q to quit."
        )
