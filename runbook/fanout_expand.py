"""Load-time half of the fan-out: a step with `hosts: [a, b]` becomes one child step per host.

The child of host h (rank r of n) is the step written, interpolated with `${host}` = h,
`${host_rank}` = r and `${host_count}` = n, its id `<id>.<h>` and its `host:` h. Children are
real steps (own record, attempt, job id, log, audit records naming their host and key), listed
right after their fan-out step; the engine runs them together (runbook/engine/fanout.py).
Ranks follow the order of `hosts:`, so a re-run gives every host the same shard.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

HOST_VARS = ("host", "host_rank", "host_count")
INTERNAL_FIELDS = ("fanout_of", "host_rank")  # set by the loader only
CHILD_SEP = "."  # child ids name job ids and log files: [A-Za-z0-9._-] only


def child_id(step_id: str, host: str) -> str:
    return f"{step_id}{CHILD_SEP}{host}"


def host_values(host: str, rank: int, count: int, hosts: Any = None) -> dict[str, str]:
    """The variables of host's child: the host's own `vars:` (from the runbook's `hosts:`
    mapping), then `${host}`, `${host_rank}`, `${host_count}`."""
    from runbook.interpolate import as_text

    config = hosts.get(host) if isinstance(hosts, dict) else None
    own = config.get("vars") if isinstance(config, dict) else None
    out = {k: as_text(v) for k, v in own.items()} if isinstance(own, dict) else {}
    return out | {"host": host, "host_rank": str(rank), "host_count": str(count)}


def parse_hosts(value: Any) -> list[str] | None:
    """`hosts:` as written (after interpolation): a list of names, or one string of names
    separated by commas or blanks (so `--set boxes=a,b` can choose them). None: not usable."""
    if isinstance(value, str):
        return [h for h in re.split(r"[,\s]+", value) if h]
    if isinstance(value, list) and all(isinstance(h, str) for h in value):
        return list(value)
    return None


def raw_fanouts(steps: list[Any]) -> dict[int, Any]:
    """Index -> the fan-out step's raw mapping (deep copies, before any interpolation)."""
    return {
        i: copy.deepcopy(s)
        for i, s in enumerate(steps)
        if isinstance(s, dict) and s.get("hosts") is not None
    }


def expand(
    rb: Any,
    raw: dict[int, Any],
    interpolate: Callable[[Any, tuple[str | int, ...], dict[str, str]], Any],
    validate_step: Callable[[Any, tuple[str | int, ...]], Any],
    problem: Callable[[tuple[str | int, ...], str], None],
    hosts: Any = None,
) -> Any:
    """The runbook with every fan-out step followed by its children. `interpolate(data, path,
    extra_values)` and `validate_step(data, path)` report their problems located at `path`."""
    by_id = {s.id: s for s in rb.steps}
    index = {s.id: i for i, s in enumerate(rb.steps)}
    out = []
    for i, step in enumerate(rb.steps):
        out.append(step)
        stopped = by_id.get(step.stop) if step.stop else None
        if step.hosts is None:
            if stopped is not None and stopped.hosts is not None:
                problem(
                    ("steps", i, "stop"),
                    f"{step.stop!r} runs on several hosts: give this step `hosts:` too "
                    "(it stops the job on each)",
                )
            continue
        if step.destructive:
            problem(
                ("steps", i, "hosts"),
                "a destructive step runs on one box (its confirmation and delete targets are "
                "per box): write one step per host",
            )
            continue
        target = stopped
        if step.stop and target is not None and target.hosts is not None:
            missing = [h for h in step.hosts if h not in target.hosts]
            if missing:
                problem(
                    ("steps", i, "hosts"),
                    f"{step.stop!r} runs no job on {', '.join(missing)}: stop it on its hosts only",
                )
                continue
        n = len(step.hosts)
        for rank, host in enumerate(step.hosts):
            cid = child_id(step.id, host)
            if cid in by_id:
                problem(
                    ("steps", index[cid], "id"),
                    f"step id {cid!r} is taken by the fan-out of {step.id!r} on {host!r}; rename it",
                )
                continue
            data = interpolate(
                copy.deepcopy(raw[i]), ("steps", i), host_values(host, rank, n, hosts)
            )
            data["hosts"] = None
            data["host"] = host
            child = validate_step(data, ("steps", i))
            if child is None:
                continue
            update: dict[str, Any] = {
                "id": cid,
                "fanout_of": step.id,
                "host_rank": rank,
            }
            if target is not None and target.hosts is not None:
                update["stop"] = child_id(target.id, host)
            out.append(child.model_copy(update=update))
    return rb.model_copy(update={"steps": out})
