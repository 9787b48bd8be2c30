"""The Markdown audit: the record of a run one hands to a colleague.

Built from the hash-chained records alone (runbook/audit.py): the outcome, every step's final
state under a heading that is true of it, why steps were skipped or blocked, the confirmations
given and declined, the guards and postconditions (the proof) with their observed values, the
artifacts' hashes, and what changed when the run was resumed."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from eagle_tui.present import guards as guard_view
from runbook.audit import VerifyResult
from runbook.units import format_duration, format_size

RecordT = Mapping[str, Any]
EXIT_MEANING = {
    0: "all steps done",
    1: "a step failed or was lost",
    2: "invalid input",
    3: "blocked: a guard failed or a confirmation was needed",
    130: "interrupted",
}
FINAL = ("succeeded", "failed", "lost", "cancelled", "skipped", "blocked")
SECTIONS = (  # heading, the final statuses it lists
    ("Succeeded steps", ("succeeded",)),
    ("Skipped steps", ("skipped",)),
    ("Failed, lost or cancelled steps", ("failed", "lost", "cancelled")),
    ("Blocked steps", ("blocked",)),
)


def cell(v: Any) -> str:
    return "" if v is None else str(v).replace("|", "\\|").replace("\n", " ")


def table(head: Iterable[str], rows: Iterable[Iterable[Any]]) -> list[str]:
    head = list(head)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return out


def who(rec: RecordT) -> str:
    w = rec.get("who") or {}
    return f"{w.get('user')}@{w.get('host')}"


def final_states(records: Sequence[RecordT]) -> dict[str, RecordT]:
    """Each step's last end-state record (a step re-run after a failure shows its last end)."""
    last: dict[str, RecordT] = {}
    for r in records:
        if r.get("event") == "step.state" and r.get("status") in FINAL and r.get("step"):
            last[str(r["step"])] = r
    return last


def why_text(rec: RecordT) -> str:
    if rec.get("reason") == "already_satisfied":
        held = [g for g in rec.get("guards") or [] if g.get("ok")]
        what = "; ".join(str(g.get("message") or g.get("check")) for g in held)
        return "skip condition held" + (f": {what}" if what else "")
    return " · ".join(str(x) for x in (rec.get("reason"), rec.get("message")) if x)


def header(records: Sequence[RecordT], verify_result: VerifyResult | None) -> list[str]:
    first = records[0]
    lines = [f"# Audit log of run `{first.get('run_id')}`", ""]
    start = next((r for r in records if r.get("event") == "run.started"), None)
    if start:
        rb = start.get("runbook") or {}
        lines += [
            f"- runbook: `{rb.get('name')}` ({rb.get('path')}, sha256 `{str(rb.get('sha256', ''))[:16]}…`)",
            f"- started: {start.get('ts')} by {who(start)}",
        ]
    if verify_result is not None:
        state = "verified" if verify_result.ok else f"NOT VERIFIED: {verify_result.problem}"
        lines.append(
            f"- chain: {verify_result.records} records, head seq {verify_result.head.seq} "
            f"`{verify_result.head.hash}` ({state})"
        )
    return lines


def outcome(records: Sequence[RecordT], last: dict[str, RecordT]) -> list[str]:
    fin = next((r for r in reversed(records) if r.get("event") == "run.finished"), None)
    lines = ["", "## Outcome", ""]
    if fin is None:
        lines.append("- not finished: no `run.finished` record (the run is going, or was stopped)")
    else:
        code = fin.get("exit_code")
        meaning = (
            EXIT_MEANING.get(code, "see the steps") if isinstance(code, int) else "see the steps"
        )
        lines.append(f"- exit {code}: {meaning}")
        lines.append(
            f"- last ended: {fin.get('ts')}"
            + ("; the run is finished" if fin.get("finished") else "; the run can be resumed")
        )
    counts: dict[str, int] = {}
    for r in last.values():
        counts[str(r.get("status"))] = counts.get(str(r.get("status")), 0) + 1
    if counts:
        lines.append("- steps: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return lines


def step_tables(last: dict[str, RecordT]) -> list[str]:
    lines: list[str] = []
    for heading, statuses in SECTIONS:
        rows = [r for r in last.values() if r.get("status") in statuses]
        if not rows:
            continue
        lines += ["", f"## {heading}", ""]
        if statuses == ("succeeded",):
            lines += table(
                ("step", "how", "exit", "duration", "host", "log sha256", "finished"),
                (
                    (
                        r.get("step"),
                        "skip condition held"
                        if r.get("reason") == "already_satisfied"
                        else r.get("reason") or "ran",
                        r.get("exit_code"),
                        _duration(r),
                        (r.get("where") or {}).get("host") or "local",
                        ((r.get("log") or {}).get("sha256") or "")[:16],
                        r.get("ts"),
                    )
                    for r in rows
                ),
            )
        else:
            lines += table(
                ("step", "status", "why", "exit", "signal", "duration", "at"),
                (
                    (
                        r.get("step"),
                        r.get("status"),
                        why_text(r),
                        r.get("exit_code"),
                        r.get("signal"),
                        _duration(r),
                        r.get("ts"),
                    )
                    for r in rows
                ),
            )
    return lines


def _duration(r: RecordT) -> str:
    d = r.get("duration_s")
    return "" if d is None else format_duration(float(d))


def confirmations(records: Sequence[RecordT]) -> list[str]:
    given = [r for r in records if r.get("event") == "step.confirmed"]
    declined = [
        r
        for r in records
        if r.get("event") == "step.state" and r.get("reason") == "confirmation_required"
    ]
    lines: list[str] = []
    if given:
        lines += ["", "## Confirmations given", ""]
        lines += table(
            ("step", "mode", "by", "at", "shown"),
            ((r.get("step"), r.get("mode"), who(r), r.get("ts"), r.get("prompt")) for r in given),
        )
    if declined:
        lines += ["", "## Confirmations declined or not given", ""]
        lines += table(
            ("step", "by", "at", "what happened"),
            ((r.get("step"), who(r), r.get("ts"), r.get("message")) for r in declined),
        )
    return lines


def earlier_blocks(records: Sequence[RecordT], last: dict[str, RecordT]) -> list[str]:
    """Blocks a step got past later (its final state is listed above): when, why, what then.
    Declined confirmations have their own table."""
    rows = [
        (r.get("step"), r.get("ts"), why_text(r), last[str(r["step"])].get("status"))
        for r in records
        if r.get("event") == "step.state"
        and r.get("status") == "blocked"
        and r.get("reason") != "confirmation_required"
        and str(r.get("step")) in last
        and last[str(r["step"])] is not r
    ]
    if not rows:
        return []
    return ["", "## Blocked earlier", "", *table(("step", "at", "why", "then"), rows)]


def guard_sections(last: dict[str, RecordT]) -> list[str]:
    """Per step: the guards its last end evaluated, then its postconditions (the proof)."""
    lines: list[str] = []
    for sid, r in last.items():
        phase = "skip_if" if r.get("reason") == "already_satisfied" else "pre"
        results = [{"phase": phase, **g} for g in r.get("guards") or []]
        results += [{"phase": "post", **g} for g in r.get("postconditions") or []]
        if not results:
            continue
        if not lines:
            lines += ["", "## Guards and proofs", ""]
        lines.append(f"### `{sid}` ({r.get('status')})")
        lines.append("")
        for g in guard_view.views(results):
            lines.append(f"- {g.plain()}")
            lines.append(f"  - observed: {g.observed}")
        lines.append("")
    return lines[:-1] if lines else lines


def artifacts(last: dict[str, RecordT]) -> list[str]:
    rows = [
        (sid, a.get("path"), a.get("sha256") or "(not hashed)", _size(a.get("size")))
        for sid, r in last.items()
        for a in r.get("artifacts") or []
    ]
    return (
        ["", "## Artifacts", "", *table(("step", "path", "sha256", "size"), rows)] if rows else []
    )


def _size(v: Any) -> str:
    return format_size(v) if isinstance(v, (int, float)) else ""


def _shown(values: Mapping[str, Any], key: str) -> str:
    return json.dumps(values[key]) if key in values else "(unset)"


def vars_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(name, old, new) of every variable that differs, values as JSON."""
    keys = sorted(set(old) | set(new))
    return [(k, _shown(old, k), _shown(new, k)) for k in keys if old.get(k) != new.get(k)]


def resumes(records: Sequence[RecordT]) -> list[str]:
    """Each resume: who, when, and which variables changed (old -> new), or the runbook."""
    lines: list[str] = []
    prev: RecordT | None = None
    for r in records:
        if r.get("event") not in ("run.started", "run.resumed"):
            continue
        if r.get("event") == "run.resumed":
            if not lines:
                lines += ["", "## Resumes", ""]
            changes = []
            if prev is not None:
                changes = [
                    f"`{k}`: {a} -> {b}"
                    for k, a, b in vars_changed(prev.get("vars") or {}, r.get("vars") or {})
                ]
                old_sha = (prev.get("runbook") or {}).get("sha256")
                new_sha = (r.get("runbook") or {}).get("sha256")
                if old_sha != new_sha:
                    changes.append(f"runbook sha256 {str(old_sha)[:12]}… -> {str(new_sha)[:12]}…")
            elif r.get("changed"):
                changes = [f"changed: {', '.join(r['changed'])}"]
            what = "; ".join(changes) if changes else "nothing changed"
            lines.append(f"- {r.get('ts')} by {who(r)}: {what}")
        prev = r
    return lines


def export_markdown(records: Sequence[RecordT], verify_result: VerifyResult | None = None) -> str:
    if not records:
        return "# Audit log\n\n(empty)\n"
    last = final_states(records)
    lines = header(records, verify_result)
    lines += outcome(records, last)
    lines += step_tables(last)
    lines += earlier_blocks(records, last)
    lines += confirmations(records)
    lines += guard_sections(last)
    lines += artifacts(last)
    lines += resumes(records)
    return "\n".join(lines) + "\n"
