"""Tamper-evident audit log: one JSONL file per run, each record hash-chained to the previous.

    hash = sha256(canonical_json(record without "hash"))      record["prev"] = previous hash

canonical_json = sorted keys, no whitespace, UTF-8. The first record's prev is 64 zeros. `seq`
counts from 0 with no gaps. An edited, dropped, inserted or reordered record breaks the chain
at that point; a dropped *tail* is caught by comparing with the head (seq, hash) recorded outside
the file: the run's state file, the box's spool (`audit.head_set`, checked on every open by
runbook/audit_seal.py), and printed at the end of every run so it can be kept elsewhere.
"""

from __future__ import annotations

import csv
import getpass
import hashlib
import io
import json
import os
import socket
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from runbook.escape import csv_cell

GENESIS = "0" * 64
SCHEMA = "eagle-tui.audit/1"
REDACTED = "***"


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def record_hash(record: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical({k: v for k, v in record.items() if k != "hash"})).hexdigest()


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def actor() -> dict[str, str]:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return {"user": user, "host": socket.gethostname()}


def redact(obj: Any, secrets: Iterable[str]) -> Any:
    """Replace every occurrence of a secret value inside strings, recursively."""
    values = sorted({s for s in secrets if s}, key=len, reverse=True)
    if not values:
        return obj

    def walk(x: Any) -> Any:
        if isinstance(x, str):
            for s in values:
                if s in x:
                    x = x.replace(s, REDACTED)
            return x
        if isinstance(x, dict):
            return {walk(k): walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [walk(v) for v in x]
        return x

    return walk(obj)


@dataclass(frozen=True)
class Head:
    seq: int  # seq of the last record, -1 when empty
    hash: str


class AuditLog:
    """Append-only writer. fsyncs every record: audit entries precede destructive actions."""

    def __init__(self, path: Path, run_id: str, secrets: Iterable[str] = ()) -> None:
        self.path = Path(path)
        self.run_id = run_id
        self.secrets = list(secrets)
        self.head = self._read_head()

    def _read_head(self) -> Head:
        if not self.path.exists():
            return Head(-1, GENESIS)
        last = None
        with open(self.path, "rb") as f:
            for line in f:
                if line.strip():
                    last = line
        if last is None:
            return Head(-1, GENESIS)
        rec = json.loads(last)
        return Head(int(rec["seq"]), rec["hash"])

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        record: dict[str, Any] = {
            "schema": SCHEMA,
            "run_id": self.run_id,
            "seq": self.head.seq + 1,
            "ts": utc_now(),
            "event": event,
            "who": actor(),
            **redact(fields, self.secrets),
            "prev": self.head.hash,
        }
        record["hash"] = record_hash(record)
        line = canonical(record) + b"\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                end = os.lseek(fd, 0, os.SEEK_END)
                try:
                    view = memoryview(line)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                except OSError:
                    os.ftruncate(fd, end)  # no torn record left behind (ENOSPC mid-line)
                    raise
            finally:
                os.close(fd)
        except OSError as exc:
            from runbook.state import write_failed

            raise write_failed(self.path, exc) from None
        self.head = Head(record["seq"], record["hash"])
        return record


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    records: int
    head: Head
    problem: str | None = None
    bad_line: int | None = None
    bad_record: str | None = None


@dataclass(frozen=True)
class Verification:
    """What `audit verify` concluded, in one line every export header repeats word for word.

    `local` is the chain (and the run state's head); `against` says what else it was checked
    against (the head kept on the run's box) or why not; `box_problem` is what that found."""

    local: VerifyResult
    against: str
    box_problem: str | None = None
    box_checked: bool = False

    @property
    def ok(self) -> bool:
        return self.local.ok and self.box_problem is None

    def summary(self) -> str:
        r = self.local
        if not r.ok:
            where = f"line {r.bad_line}: " if r.bad_line else ""
            return f"NOT OK: {where}{r.problem}"
        if self.box_problem:
            return f"NOT OK: {self.box_problem} ({self.against})"
        scope = "ok" if self.box_checked else "ok (local chain only)"
        return (
            f"{scope}: {r.records} records, head seq {r.head.seq} sha256 {r.head.hash}; "
            f"{self.against}"
        )


def local_only(result: VerifyResult, why: str) -> Verification:
    """A verification of the local chain alone (`why`: the box head was not consulted)."""
    return Verification(result, f"box head not checked ({why})")


def iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as f:
        for n, line in enumerate(f, start=1):
            if line.strip():
                yield n, line


def verify(path: Path, expected_head: Head | None = None) -> VerifyResult:
    """Walk the chain; report the first bad record (line number and its text)."""
    prev, seq, count = GENESIS, -1, 0
    run_id = None
    for lineno, line in iter_lines(path):
        problem = None
        try:
            rec = json.loads(line)
        except ValueError:
            rec, problem = {}, "not valid JSON"
        if problem is None and (
            not isinstance(rec, dict) or not {"hash", "prev", "seq"} <= rec.keys()
        ):
            problem = "not an audit record (hash, prev and seq are required)"
        if problem is None:
            if run_id is None:
                run_id = rec.get("run_id")
            if rec.get("run_id") != run_id:
                problem = f"record of another run ({rec.get('run_id')!r}, expected {run_id!r})"
            elif rec["prev"] != prev:
                problem = (
                    f"chain broken: prev is {str(rec['prev'])[:12]}…, expected {prev[:12]}… "
                    "(a record before it was dropped, inserted or reordered)"
                )
            elif rec["seq"] != seq + 1:
                problem = f"sequence gap: seq {rec['seq']}, expected {seq + 1}"
            elif record_hash(rec) != rec["hash"]:
                problem = "record was edited: its hash does not match its content"
        if problem is not None:
            text = line.decode("utf-8", "replace").rstrip("\n")
            return VerifyResult(False, count, Head(seq, prev), problem, lineno, text)
        prev, seq, count = rec["hash"], rec["seq"], count + 1
    head = Head(seq, prev)
    if expected_head is not None and (expected_head.seq, expected_head.hash) != (
        head.seq,
        head.hash,
    ):
        if expected_head.seq > head.seq:
            problem = (
                f"log ends at seq {head.seq} but the recorded head is seq {expected_head.seq}: "
                "records were dropped from the end"
            )
        else:
            problem = (
                f"head is seq {head.seq} {head.hash[:12]}…, recorded head is seq "
                f"{expected_head.seq} {expected_head.hash[:12]}…"
            )
        return VerifyResult(False, count, head, problem)
    return VerifyResult(True, count, head)


def read_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for _, line in iter_lines(path)]


# ------------------------------------------------------------------ exports
CSV_COLUMNS = [
    "seq",
    "ts",
    "event",
    "step",
    "status",
    "reason",
    "exit_code",
    "signal",
    "duration_s",
    "user",
    "host",
    "target",
    "host_key",
    "log_sha256",
    "hash",
]


def _row(rec: Mapping[str, Any]) -> dict[str, Any]:
    where = rec.get("where") or {}
    log = rec.get("log") or {}
    who = rec.get("who") or {}
    return {
        "seq": rec.get("seq"),
        "ts": rec.get("ts"),
        "event": rec.get("event"),
        "step": rec.get("step"),
        "status": rec.get("status"),
        "reason": rec.get("reason"),
        "exit_code": rec.get("exit_code"),
        "signal": rec.get("signal"),
        "duration_s": rec.get("duration_s"),
        "user": who.get("user"),
        "host": who.get("host"),
        "target": where.get("host"),
        "host_key": where.get("host_key"),
        "log_sha256": log.get("sha256"),
        "hash": rec.get("hash"),
    }


def export_jsonl(records: list[dict[str, Any]]) -> str:
    """The records as JSON lines, ASCII only: the same values (hashes verify on the parsed
    records), and no control, C1 or bidi character reaches a terminal it is printed on."""
    return "".join(
        json.dumps(r, sort_keys=True, separators=(",", ":"), ensure_ascii=True) + "\n"
        for r in records
    )


def export_csv(records: list[dict[str, Any]], verification: Verification | None = None) -> str:
    """One row per record; every cell is data (runbook/escape.csv_cell: no formula, one line).
    With `verification`, a first line `# audit verify: ...` says what `audit verify` says."""
    buf = io.StringIO()
    if verification is not None:
        buf.write(f"# audit verify: {csv_cell(verification.summary())}\n")
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in records:
        w.writerow({k: csv_cell(v) for k, v in _row(r).items()})
    return buf.getvalue()
