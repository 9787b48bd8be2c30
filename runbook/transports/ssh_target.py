"""`[user@]host[:port]` targets as text: parsed, and as the `ssh` command an operator types.
No asyncssh here, so the cockpit's and the dry run's messages do not import it."""

from __future__ import annotations

import re
import shlex

from runbook.transports import TransportError


def parse_target(text: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]` (IPv6 as `[addr]:port`) -> (user, host, port)."""
    user, _, rest = text.rpartition("@")
    port: int | None = None
    m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?", rest)
    if m:
        host, p = m.group(1), m.group(2)
        port = int(p) if p else None
    elif rest.count(":") == 1:
        host, p = rest.split(":")
        if not p.isdigit():
            raise TransportError(f"{text!r}: the port must be a number", permanent=True)
        port = int(p)
    else:
        host = rest
    if not host or (port is not None and not 0 < port < 65536):
        raise TransportError(f"{text!r}: expected [user@]host[:port] or an ssh alias", True)
    return user or None, host, port


def ssh_command(target: str) -> str:
    """The `ssh` command line an operator types to try `[user@]host[:port]` by hand."""
    try:
        user, host, port = parse_target(target)
    except TransportError:
        return f"ssh {shlex.quote(target)}"
    dest = f"{user}@{host}" if user else host
    return "ssh " + (f"-p {port} " if port not in (None, 22) else "") + shlex.quote(dest)


def unreachable_hint(name: str, target: str) -> str:
    """What to try when `name` (ssh target `target`) cannot be reached."""
    alias = (
        "" if target != name else f" or an ~/.ssh/config entry `Host {name}` (HostName, User, Port)"
    )
    return (
        f"check that `{ssh_command(target)}` works; name the box with --host user@host:port{alias}"
    )
