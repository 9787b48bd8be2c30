"""Guards re-checked inside `job.start`, right before the job is spawned.

A destructive step's evidence is shown to the operator, who may take minutes to confirm; the
files can change meanwhile. The client passes each guard with the observed value it showed
(`expect`); the agent evaluates them all in the same request that launches the job and
refuses (`guards_changed`, nothing spawned, no job dir) when one fails or its evidence differs.
"""

from __future__ import annotations

import json
from typing import Any

from remote_agent.agent.probes import run_probe
from remote_agent.wire.protocol import AgentError, bad

# Their observed values move on their own (free bytes, GPU load, a server's answer): for these
# only the verdict must still hold, not the exact figures.
VOLATILE = frozenset({"disk_free", "gpu_idle", "http_ok"})


def check_launch_guards(guards: Any) -> list[dict[str, Any]]:
    """Evaluate `[{check: {...}, expect?: observed}]`; the results, or AgentError if one moved."""
    if guards is None:
        return []
    if not isinstance(guards, list) or not all(
        isinstance(g, dict) and isinstance(g.get("check"), dict) for g in guards
    ):
        raise bad("args.guards must be a list of {check: {...}, expect?: ...}")
    results, changed = [], False
    for g in guards:
        res = run_probe(g["check"])
        moved = (
            "expect" in g
            and g["check"].get("check") not in VOLATILE
            and res["observed"] != g["expect"]
        )
        changed = changed or moved or not res["ok"]
        results.append({**res, "changed": moved})
    if changed:
        # The message is the results as JSON: the client shows old and new side by side.
        raise AgentError("guards_changed", json.dumps(results))
    return results
