"""One driver per runbook work on the box: the claim the engine holds in the agent's spool.

Taken on the default host before the run id is chosen (so a loser creates nothing), and on every
other host a step uses before that step's first job there (same key: runbook name + work dir);
re-taken on every reconnect (the agent drops it when its connection goes), released at close. Protocol:
`lock.acquire` / `lock.release` / `lock.status` in remote_agent/PROTOCOL.md.
"""

from __future__ import annotations

import os
import secrets
from datetime import datetime, timezone
from typing import Any

from runbook.agent_client import HostSession
from runbook.audit import Head, actor

EXIT_LOCKED = 4
DRIVER_ID = secrets.token_hex(8)  # this process: lets a reconnecting driver take its lock back


class DriverLocked(Exception):
    """Another driver holds the runbook's work on the box; str() is the one line to show."""


def holder_line(name: str, holder: dict[str, Any]) -> str:
    since = holder.get("since")
    when = (
        datetime.fromtimestamp(since, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
        if isinstance(since, (int, float))
        else "?"
    )
    return (
        f"runbook {name!r} in {holder.get('work_dir')!r} is being driven by "
        f"{holder.get('user')}@{holder.get('host')} pid {holder.get('pid')} since {when}; "
        "watch it with `eagle-tui status`, or wait for it to end"
    )


def lock_args(name: str) -> dict[str, Any]:
    # work_dir null: the agent's working directory, where the runbook's relative paths resolve
    return {"name": name, "work_dir": None}


async def claim(call: Any, name: str) -> dict[str, Any]:
    """`call(op, **args)` on the default host's agent; raises DriverLocked naming the holder."""
    who = actor()
    res = await call(
        "lock.acquire",
        **lock_args(name),
        holder={**who, "pid": os.getpid(), "driver_id": DRIVER_ID},
    )
    if not res.get("acquired"):
        raise DriverLocked(holder_line(name, res.get("holder") or {}))
    return res


async def release(call: Any, name: str) -> None:
    await call("lock.release", **lock_args(name))


# ---------------------------------------------------------------------- on a host's session
# Each takes only what it needs (runbook/engine/hosts.py calls them with its sessions).


async def hold(session: HostSession, name: str) -> None:
    """Claim the work on `session`'s box now and on every reconnect of that session."""

    async def reclaim(conn: Any) -> None:
        await claim(conn.call, name)

    if reclaim not in session.on_connect:
        session.on_connect.append(reclaim)
    if session.conn is not None and not session.conn.closed.is_set():
        await reclaim(session.conn)
    else:
        await session.connection()  # runs reclaim


async def box_head(session: HostSession, run_id: str) -> dict[str, Any] | None:
    res = await session.call("audit.head_get", run_id=run_id)
    head = res.get("head")
    return head if isinstance(head, dict) else None


async def push_head(
    session: HostSession | None, run_id: str, head: Head, clean: bool = False
) -> bool:
    """Keep the audit head on the box, where the operator's files cannot rewrite it; False
    when it could not (best effort: the next push records it)."""
    if session is None or session.conn is None or session.conn.closed.is_set():
        return False  # never reconnect just for this: the next push or open records it
    try:
        await session.conn.call(
            "audit.head_set",
            timeout=10,
            run_id=run_id,
            seq=head.seq,
            hash=head.hash,
            clean=clean,
        )
    except Exception:  # noqa: BLE001 - best effort at exit; open() notes a missing head
        return False
    return True
