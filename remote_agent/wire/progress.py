"""The progress contract: machine-readable progress and metric lines in a job's log.

Jobs (the eagle3 payload, remote_agent/eagle3/progress.py) print them; the engine and the TUI
parse them (runbook/logsplit.py).
Both sides already depend on the agent core, so the contract lives here, stdlib-only.

Every line is `@@eagle3 ` followed by one JSON object with a `kind` key, written to stderr so
stdout stays free for results. Kinds:

- `progress`: stage, done, total (or null), unit, rate (units/s), eta_s (or null)
- `metrics`: training metrics (step, loss, acc, sim_accept_len, ...)
- `result`: the command's final summary (one per command)

Humans read the same log, so each machine line is short and the surrounding prose stays.
"""

from __future__ import annotations

import json
from typing import Any

PREFIX = "@@eagle3 "


def format_record(record: dict[str, Any]) -> str:
    """One machine line (no newline) for a record with a `kind` key."""
    return PREFIX + json.dumps(record, separators=(",", ":"), default=str)


def parse(line: str) -> dict[str, Any] | None:
    """The record carried by a log line, or None for ordinary text (never raises)."""
    if not line.startswith(PREFIX):
        return None
    try:
        record = json.loads(line[len(PREFIX) :])
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("kind"), str) else None
