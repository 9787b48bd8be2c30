"""The Markdown audit: the record of a run one hands to a colleague.

Built from the hash-chained records alone (runbook/audit.py), read as the run happened: the
verification (the words `audit verify` says), the outcome and the pipeline's figures (a step's
`result` record, e.g. the evaluate step's accept length), then every event in order (driver
sessions and the ones that ended without a close, operator skips and unskips with their
reasons, starts, ends, confirmations, cancels), then every step's final state under a heading
that is true of it (in the order they ended), why steps were skipped or blocked, the guards and
postconditions (the proof) with their observed values, the artifacts' hashes, and the resumes
that changed something.

Every value, title, message and observed text is data: runbook/escape.md (and md_code for ids)
make sure no newline, `|`, `#`, backquote, bracket or HTML in one starts a heading, row, link,
list item or code block."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from eagle_tui.present import guards as guard_view
from runbook.audit import Verification, VerifyResult, local_only
from runbook.escape import md, md_code
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
    return "" if v is None else md(v)


def table(head: Iterable[str], rows: Iterable[Iterable[Any]]) -> list[str]:
    head = list(head)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return out


def who(rec: RecordT) -> str:
    w = rec.get("who") or {}
    return md(f"{w.get('user')}@{w.get('host')}")


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


def header(records: Sequence[RecordT], verified: Verification | None) -> list[str]:
    first = records[0]
    lines = [f"# Audit log of run {md_code(first.get('run_id'))}", ""]
    start = next((r for r in records if r.get("event") == "run.started"), None)
    if start:
        rb = start.get("runbook") or {}
        lines += [
            f"- runbook: {md_code(rb.get('name'))} ({md(rb.get('path'))}, sha256 "
            f"{md_code(str(rb.get('sha256', ''))[:16])}…)",
            f"- started: {md(start.get('ts'))} by {who(start)}",
        ]
    if verified is not None:  # the very words of `eagle-tui audit verify`
        lines.append(f"- audit verify: {md(verified.summary())}")
    return lines


def result_figures(rec: RecordT) -> str:
    """`accept length 3.21 · lossless yes · prompts 80` from a step's `result` record."""
    res = rec.get("result")
    if not isinstance(res, Mapping):
        return ""
    parts = []
    for k, v in res.items():
        if k in ("kind", "command") or isinstance(v, (dict, list)):
            continue
        shown = ("yes" if v else "no") if isinstance(v, bool) else v
        parts.append(f"{str(k).replace('_', ' ')} {shown}")
    return " · ".join(parts)


def sessions(records: Sequence[RecordT]) -> list[list[RecordT]]:
    """The records of each driver session: from a run.started/run.resumed to the next."""
    out: list[list[RecordT]] = []
    for r in records:
        if r.get("event") in ("run.started", "run.resumed") or not out:
            out.append([])
        out[-1].append(r)
    return out


def unclosed(session: list[RecordT]) -> bool:
    """A session that ended without its driver's run.finished or run.closed: the driver was
    interrupted or killed."""
    return not any(r.get("event") in ("run.finished", "run.closed") for r in session)


def _finished(session: list[RecordT]) -> bool:
    return any(r.get("event") == "run.finished" for r in session)


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
        lines.append(f"- exit {md(code)}: {meaning}")
        lines.append(
            f"- last ended: {md(fin.get('ts'))}"
            + ("; the run is finished" if fin.get("finished") else "; the run can be resumed")
        )
    counts: dict[str, int] = {}
    for r in last.values():
        counts[str(r.get("status"))] = counts.get(str(r.get("status")), 0) + 1
    if counts:
        lines.append("- steps: " + ", ".join(f"{n} {md(s)}" for s, n in sorted(counts.items())))
    for sid, r in _in_order(last):
        figures = result_figures(r)
        if figures:
            lines.append(f"- {md_code(sid)} ({md(r.get('status'))}): {md(figures)}")
    runs = sessions(records)
    cut = [s for s in runs[:-1] if unclosed(s)]
    if len(runs) > 1 or cut:
        lines.append(
            f"- driver sessions: {len(runs)}"
            + (f"; {len(cut)} ended without closing (interrupted or killed)" if cut else "")
        )
    return lines


def _in_order(last: dict[str, RecordT]) -> list[tuple[str, RecordT]]:
    """Steps in the order their final state was recorded (the run's order)."""
    return sorted(last.items(), key=lambda kv: int(kv[1].get("seq") or 0))


def _where(r: RecordT) -> str:
    return str((r.get("where") or {}).get("host") or "local")


def event_text(r: RecordT, prev: RecordT | None = None) -> str | None:
    """One event of the story, or None for bookkeeping (intents, head notes); `prev` is the
    opening record before a resume (what it changed)."""
    ev, sid = r.get("event"), md_code(r.get("step"))
    status, reason, message = r.get("status"), r.get("reason"), r.get("message")
    if ev == "step.state":
        if status == "running":
            return f"{sid} started (attempt {md(r.get('attempt'))}) on {md(_where(r))}"
        if status == "succeeded":
            how = "skip condition held" if reason == "already_satisfied" else reason or "ran"
            tail = ", ".join(
                x
                for x in (
                    f"exit {md(r.get('exit_code'))}" if r.get("exit_code") is not None else "",
                    _duration(r),
                )
                if x
            )
            figures = result_figures(r)
            return f"{sid} succeeded ({md(how)}{', ' + tail if tail else ''})" + (
                f": {md(figures)}" if figures else ""
            )
        if status == "skipped" and reason == "operator_skip":
            return f"operator skipped {sid}: {md(message)}"
        if status == "skipped":
            return f"{sid} skipped: {md(why_text(r))}"
        if status == "pending" and reason == "operator_unskip":
            return f"operator unskipped {sid}" + (f": {md(message)}" if message else "")
        if status == "pending" and reason == "operator_retry":
            return f"operator reset {sid} to retry it"
        if status in ("failed", "lost", "cancelled", "blocked"):
            return f"{sid} {md(status)}: {md(why_text(r))}"
        return None
    if ev == "step.confirmed":
        return f"confirmation given for {sid} ({md(r.get('mode'))})"
    if ev == "step.cancel_requested":
        return f"operator asked to cancel {sid}"
    if ev == "run.started":
        return f"driver started the run ({who(r)})"
    if ev == "run.resumed":
        what = resume_changes(r, prev)
        return f"driver resumed the run ({who(r)})" + (f": {md(what)}" if what else "")
    if ev == "run.finished":
        code = r.get("exit_code")
        return f"driver stopped: exit {md(code)} ({EXIT_MEANING.get(code, 'see the steps')})"  # type: ignore[arg-type]
    if ev == "audit.break_accepted":
        return f"audit break accepted with {md(r.get('flag'))}: {md(r.get('problem'))}"
    if ev == "audit.repaired":
        return f"audit repaired: {md(r.get('what'))}"
    return None


def story(records: Sequence[RecordT]) -> list[str]:
    """Every event in order; where a driver session ended without a close, that is said."""
    rows: list[tuple[Any, Any, str]] = []
    runs = sessions(records)
    opened: RecordT | None = None
    for n, session in enumerate(runs):
        for r in session:
            if r.get("event") == "run.closed" and not _finished(session):
                rows.append((r.get("seq"), r.get("ts"), "driver closed (jobs keep running)"))
                continue
            text = event_text(r, opened)
            if r.get("event") in ("run.started", "run.resumed"):
                opened = r
            if text:
                rows.append((r.get("seq"), r.get("ts"), text))
        if n < len(runs) - 1 and unclosed(session):
            rows.append(
                (
                    "",
                    session[-1].get("ts"),
                    "driver ended without closing the run (interrupted or killed); "
                    "the next driver resumed it",
                )
            )
    if not rows:
        return []
    out = ["", "## What happened, in order", "", "| seq | at | what |", "|---|---|---|"]
    out += [f"| {cell(seq)} | {cell(ts)} | {what} |" for seq, ts, what in rows]
    return out


def step_tables(last: dict[str, RecordT]) -> list[str]:
    lines: list[str] = []
    for heading, statuses in SECTIONS:
        rows = [r for _, r in _in_order(last) if r.get("status") in statuses]
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
                        _where(r),
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
    for sid, r in _in_order(last):
        phase = "skip_if" if r.get("reason") == "already_satisfied" else "pre"
        results = [{"phase": phase, **g} for g in r.get("guards") or []]
        results += [{"phase": "post", **g} for g in r.get("postconditions") or []]
        if not results:
            continue
        if not lines:
            lines += ["", "## Guards and proofs", ""]
        lines.append(f"### {md_code(sid)} ({md(r.get('status'))})")
        lines.append("")
        for g in guard_view.views(results):
            lines.append(f"- {md(g.plain())}")
            lines.append(f"  - observed: {md(g.observed)}")
        lines.append("")
    return lines[:-1] if lines else lines


def artifacts(last: dict[str, RecordT]) -> list[str]:
    rows = [
        (sid, a.get("path"), a.get("sha256") or "(not hashed)", _size(a.get("size")))
        for sid, r in _in_order(last)
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


def resume_changes(r: RecordT, prev: RecordT | None) -> str:
    """What a resume changed: variables (old -> new) and the runbook, or '' for nothing."""
    changes = []
    if prev is not None:
        changes = [
            f"{k}: {a} -> {b}"
            for k, a, b in vars_changed(prev.get("vars") or {}, r.get("vars") or {})
        ]
        old_sha = (prev.get("runbook") or {}).get("sha256")
        new_sha = (r.get("runbook") or {}).get("sha256")
        if old_sha != new_sha:
            changes.append(f"runbook sha256 {str(old_sha)[:12]}… -> {str(new_sha)[:12]}…")
    elif r.get("changed"):
        changes = [f"changed: {', '.join(map(str, r['changed']))}"]
    return "; ".join(changes)


def resumes(records: Sequence[RecordT]) -> list[str]:
    """The resumes that changed something: who, when, which variables (old -> new), the
    runbook. Resumes that changed nothing are in the story only."""
    lines: list[str] = []
    prev: RecordT | None = None
    for r in records:
        if r.get("event") not in ("run.started", "run.resumed"):
            continue
        what = resume_changes(r, prev) if r.get("event") == "run.resumed" else ""
        if what:
            if not lines:
                lines += ["", "## Resumes that changed something", ""]
            lines.append(f"- {md(r.get('ts'))} by {who(r)}: {md(what)}")
        prev = r
    return lines


def export_markdown(
    records: Sequence[RecordT], verified: Verification | VerifyResult | None = None
) -> str:
    if not records:
        return "# Audit log\n\n(empty)\n"
    if isinstance(verified, VerifyResult):
        verified = local_only(verified, "only the local chain was given")
    last = final_states(records)
    lines = header(records, verified)
    lines += outcome(records, last)
    lines += story(records)
    lines += step_tables(last)
    lines += earlier_blocks(records, last)
    lines += confirmations(records)
    lines += guard_sections(last)
    lines += artifacts(last)
    lines += resumes(records)
    return "\n".join(lines) + "\n"
