"""The audit is the record: on open, check the run's files against each other and the box.

- The chain must verify, and contain the head the box recorded (`audit.head_get`): dropping the
  tail, or adding records after a driver closed cleanly, is caught by files alone unrewritable.
- A torn last line (a crash mid-append) is cut off and the cut is audited by the caller.
- state.json is sealed by the audit: its head must be in the chain and its step statuses must be
  the ones the audit's last `step.state` records say. A state behind the chain (a crash between
  the append and the save) takes its statuses from the audit.
Anything else raises AuditBreak with one message; `--accept-audit-break` proceeds, audited.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from runbook import audit as audit_mod
from runbook.state import RunState, RunStore, StepRecord

OVERRIDE = "--accept-audit-break"


class AuditBreak(Exception):
    """The run's audit and state disagree; str() is the one line to show."""


@dataclass
class Opened:
    state: RunState | None
    notes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # audit records to add


def repair_torn_tail(path: Path) -> dict[str, Any] | None:
    """Cut a last line without its newline (a crash mid-append); return what was cut."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if not data or data.endswith(b"\n"):
        return None
    cut = data.rfind(b"\n") + 1
    tail = data[cut:]
    try:
        rec = json.loads(tail)
        complete = isinstance(rec, dict) and rec.get("hash") == audit_mod.record_hash(rec)
    except ValueError:
        complete = False
    with open(path, "r+b") as f:
        if complete:  # the record was whole, only its newline was lost
            f.seek(0, os.SEEK_END)
            f.write(b"\n")
        else:
            f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())
    if complete:
        return None
    return {"cut_bytes": len(tail), "cut_text": tail[:200].decode("utf-8", "replace")}


def derived_steps(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each step's last `step.state` record: what the audit says the step's state is."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.get("event") == "step.state" and isinstance(r.get("step"), str):
            out[r["step"]] = r
    return out


def _ts(rec: dict[str, Any]) -> float:
    try:
        return datetime.fromisoformat(str(rec.get("ts")).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def rebuild_state(
    run_id: str, records: list[dict[str, Any]], store: RunStore | None = None
) -> RunState:
    """A state from the audit alone (log cursors restart at 0: the mirror is rewritten)."""
    start = next((r for r in records if r.get("event") == "run.started"), records[0])
    rb = start.get("runbook") or {}
    head = records[-1]
    state = RunState(
        run_id=run_id,
        runbook_name=str(rb.get("name", "")),
        runbook_path=str(rb.get("path", "")),
        runbook_sha256=str(rb.get("sha256", "")),
        vars=dict(start.get("vars") or {}),
        created_at=_ts(start),
        updated_at=_ts(head),
        steps={},
        audit_seq=int(head["seq"]),
        audit_head=str(head["hash"]),
    )
    apply_derived(state, records, store)
    return state


def apply_derived(
    state: RunState, records: list[dict[str, Any]], store: RunStore | None = None
) -> None:
    for sid, r in derived_steps(records).items():
        rec = state.steps.setdefault(sid, StepRecord())
        rec.status = r.get("status") or rec.status  # a record without one keeps the old status
        rec.reason, rec.message = r.get("reason"), r.get("message")
        rec.attempt = int(r.get("attempt") or 0)
        rec.job_id = r.get("job_id")
        if rec.job_id and not rec.log_file and store is not None:
            # the state was saved before the launch record: the job's mirror is at its usual
            # place, and the mirror's own cursor says how far it got (runbook/mirror.py)
            rec.log_file = str(store.log_path(sid, rec.attempt))
            rec.log_remote_offset = rec.log_mirror_size = 0
            host = r.get("host")
            rec.host = rec.host or (host if isinstance(host, str) else None)


def _mismatches(state: RunState, records: list[dict[str, Any]]) -> list[str]:
    out = []
    for sid, r in derived_steps(records).items():
        rec = state.steps.get(sid)
        have = rec.status if rec else None
        if have != r.get("status"):
            out.append(
                f"step {sid!r} is {have!r} in state.json but {r.get('status')!r} in the audit"
            )
    return out


def box_head_problem(records: list[dict[str, Any]], box_head: dict[str, Any]) -> str | None:
    """What is wrong with a verified chain given the head the box recorded, or None.

    Records after a non-clean box head (a crash before the head was pushed) are no problem."""
    seq = records[-1]["seq"] if records else 0
    bseq, bhash = box_head.get("seq"), box_head.get("hash")
    if not isinstance(bseq, int) or bseq > seq:
        return (
            f"the audit ends at seq {seq} but the box recorded head seq {bseq}: "
            "records were dropped from the end"
        )
    empty = (bseq, bhash) == (-1, audit_mod.GENESIS)  # pushed before the run's first record
    if not empty and next((r for r in records if r.get("seq") == bseq), {}).get("hash") != bhash:
        return (
            f"audit record seq {bseq} is not the one the box recorded (hash "
            f"{str(bhash)[:12]}…): the log was rewritten"
        )
    if seq > bseq and box_head.get("clean"):
        return (
            f"{seq - bseq} audit record(s) after seq {bseq}, the head the box recorded when "
            "the last driver closed: they were added outside eagle-tui"
        )
    return None


def missing_head_problem(records: list[dict[str, Any]], spool_id: str | None) -> str | None:
    """The box keeps no head for this run: a problem when its spool is the very one the run
    last opened on (its id unchanged, so not wiped). An opening names the spool only after a
    head for the run was recorded there (Engine.open), so that head was deleted since, and the
    local chain alone is not to be trusted. A wiped spool (another id), or an opening that
    names none (the push failed, or an older version), is no problem: the local chain is."""
    opened = [r for r in records if r.get("event") in ("run.started", "run.resumed")]
    recorded = opened[-1].get("spool_id") if opened else None
    if not recorded or recorded != spool_id:
        return None
    return (
        f"the box keeps no audit head for this run, although its spool is the one the run "
        f"used (spool id {spool_id}): the head was deleted there"
    )


def run_default_host(records: list[dict[str, Any]]) -> str | None:
    """The host whose spool keeps the run's head: the default host its last open recorded."""
    for r in reversed(records):
        if r.get("event") in ("run.started", "run.resumed") and r.get("default_host"):
            return str(r["default_host"])
    return None


async def fetch_box_head(
    transport: Any, run_id: str, timeout: float = 30
) -> tuple[dict[str, Any] | None, str | None]:
    """(head, the box's spool id): `audit.head_get` over one connection to the box (no
    retries: verify is one look)."""
    from runbook.agent_client import HostSession

    session = HostSession("audit-verify", transport, max_attempts=1)
    try:
        res = await asyncio.wait_for(session.call("audit.head_get", run_id=run_id), timeout)
        spool_id = session.hello.get("spool_id")
    finally:
        await session.close()
    head = res.get("head")
    return (head if isinstance(head, dict) else None), spool_id


FIRST_SAVE = "the driver stopped before its first save"
# what Engine.open appends before its first state save: notes and the run's start
_OPEN_EVENTS = {"run.started", "audit.no_box_head", "audit.repaired", "audit.ahead_of_box"}


def _only_opened(records: list[dict[str, Any]]) -> bool:
    events = [r.get("event") for r in records]
    return events.count("run.started") == 1 and set(events) <= _OPEN_EVENTS


def _load_state(store: RunStore) -> tuple[RunState | None, str | None]:
    try:
        text = store.state_path.read_text()
    except FileNotFoundError:
        return None, "state.json is missing"
    except OSError as exc:
        return None, f"state.json cannot be read ({exc.strerror})"
    if not text.strip():
        return None, "state.json is empty"
    try:
        return RunState.model_validate_json(text), None
    except ValueError:
        return None, "state.json is truncated or not a run state"


def check_run(
    store: RunStore,
    box_head: dict[str, Any] | None,
    accept_break: bool = False,
    spool_id: str | None = None,
) -> Opened:
    """Verify the run's audit and state before resuming; see the module docstring."""
    where = store.dir
    opened = Opened(None)
    have_audit = store.audit_path.exists() and store.audit_path.stat().st_size > 0
    if not have_audit:
        pushed = box_head is not None and box_head.get("seq") != -1  # -1: pushed before record 0
        if pushed or store.state_path.exists():
            problem = "its audit log is missing or empty" + (
                f" but the box recorded head seq {box_head.get('seq')}" if box_head else ""
            )
            return _broken(store, problem, accept_break, opened, records=[])
        return opened  # a new run
    torn = repair_torn_tail(store.audit_path)
    if torn:
        opened.notes.append(("audit.repaired", {"what": "torn last record cut", **torn}))
    result = audit_mod.verify(store.audit_path)
    records = audit_mod.read_records(store.audit_path) if result.ok else []
    if not result.ok:
        return _broken(
            store, f"audit line {result.bad_line}: {result.problem}", accept_break, opened, records
        )
    by_seq = {r["seq"]: r for r in records}
    head = result.head
    if box_head is None:
        problem = missing_head_problem(records, spool_id)
        if problem:
            return _broken(store, problem, accept_break, opened, records)
        opened.notes.append(("audit.no_box_head", {"local_head": {"seq": head.seq}}))
    else:
        problem = box_head_problem(records, box_head)
        if problem:
            return _broken(store, problem, accept_break, opened, records)
        if head.seq > box_head["seq"]:
            extra = head.seq - box_head["seq"]
            opened.notes.append(
                ("audit.ahead_of_box", {"box_seq": box_head["seq"], "records": extra})
            )
    state, why = _load_state(store)
    if state is None and not store.state_path.exists() and _only_opened(records):
        # a driver killed between the run's first audit record and its first save: nothing ran
        opened.notes.append(("state.rederived", {"why": "state.json missing: " + FIRST_SAVE}))
        opened.state = rebuild_state(store.run_id, records, store)
        return opened
    if state is None:
        return _broken(store, str(why), accept_break, opened, records)
    in_chain = by_seq.get(state.audit_seq, {}).get("hash") == state.audit_head
    if not in_chain:
        return _broken(
            store,
            f"state.json's audit head (seq {state.audit_seq}) is not in the audit log",
            accept_break,
            opened,
            records,
            state,
        )
    if state.audit_seq == head.seq:
        bad = _mismatches(state, records)
        if bad:
            return _broken(
                store,
                "state.json was edited: " + "; ".join(bad),
                accept_break,
                opened,
                records,
                state,
            )
    else:
        opened.notes.append(
            ("state.rederived", {"state_seq": state.audit_seq, "audit_seq": head.seq})
        )
        apply_derived(state, records, store)
    del where
    opened.state = state
    return opened


def _broken(
    store: RunStore,
    problem: str,
    accept: bool,
    opened: Opened,
    records: list[dict[str, Any]],
    state: RunState | None = None,
) -> Opened:
    if not accept:
        raise AuditBreak(
            f"{store.dir}: refusing to resume run {store.run_id}: {problem}. Inspect it with "
            f"`eagle-tui audit export {store.run_id}`; to resume anyway, deliberately, run again "
            f"with {OVERRIDE} (recorded in the audit), or start afresh with --new-run"
        )
    opened.notes.append(("audit.break_accepted", {"problem": problem, "flag": OVERRIDE}))
    if state is None:
        state, _ = _load_state(store)
    if state is None and records:
        state = rebuild_state(store.run_id, records, store)
    elif state is not None and records:
        apply_derived(state, records, store)
    opened.state = state
    return opened


def audit_status(state_dir: Path, run_id: str, step_id: str) -> str | None:
    """What another run's audit says of a step (None if its chain does not verify): a
    `step_succeeded` guard with `within:` trusts this, not that run's state.json."""
    path = Path(state_dir) / "runs" / run_id / "audit.jsonl"
    if not path.exists() or not audit_mod.verify(path).ok:
        return None
    rec = derived_steps(audit_mod.read_records(path)).get(step_id)
    return rec.get("status") if rec else None
