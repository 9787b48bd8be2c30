"""Audit log: the hash chain catches every edit, drop, insertion and reordering."""

from __future__ import annotations

import json

import pytest

from eagle_tui.present.audit_md import export_markdown
from runbook.audit import (
    AuditLog,
    Head,
    canonical,
    export_csv,
    read_records,
    record_hash,
    verify,
)


@pytest.fixture
def log(tmp_path):
    a = AuditLog(tmp_path / "audit.jsonl", "run-1", secrets=["s3cr3t-value"])
    a.append("run.started", runbook={"name": "demo", "path": "demo.yaml", "sha256": "ab" * 32})
    for i, status in enumerate(["running", "succeeded", "running", "failed", "running"]):
        a.append(
            "step.state",
            step=f"s{i // 2}",
            status=status,
            reason=None if status != "failed" else "exit_code",
            exit_code=None if status == "running" else (0 if status == "succeeded" else 3),
            command=["echo", "token=s3cr3t-value"],
            where={"host": "local"},
        )
    a.append("step.confirmed", step="s2", mode="typed", typed="s2", prompt="delete?")
    return a


def lines(path):
    return path.read_text().splitlines()


def write(path, rows):
    path.write_text("".join(r + "\n" for r in rows))


def test_clean_log_verifies_against_its_head(log):
    res = verify(log.path, log.head)
    assert res.ok and res.records == 7 and res.head == log.head


def test_secrets_are_redacted(log):
    assert "s3cr3t-value" not in log.path.read_text()
    assert read_records(log.path)[1]["command"] == ["echo", "token=***"]


def test_edit_is_detected(log):
    rows = lines(log.path)
    rec = json.loads(rows[3])
    rec["exit_code"] = 0
    rows[3] = canonical(rec).decode()
    write(log.path, rows)
    res = verify(log.path, log.head)
    assert not res.ok and res.bad_line == 4 and "edited" in res.problem


def test_edit_with_recomputed_hash_breaks_the_next_link(log):
    rows = lines(log.path)
    rec = json.loads(rows[3])
    rec["status"] = "succeeded"
    rec["hash"] = record_hash(rec)
    rows[3] = canonical(rec).decode()
    write(log.path, rows)
    res = verify(log.path, log.head)
    assert not res.ok and res.bad_line == 5 and "chain broken" in res.problem


def test_drop_is_detected(log):
    rows = lines(log.path)
    del rows[2]
    write(log.path, rows)
    res = verify(log.path)
    assert not res.ok and res.bad_line == 3


def test_insert_is_detected(log):
    rows = lines(log.path)
    fake = json.loads(rows[2])
    fake["status"] = "succeeded"  # a forged record that chains correctly onto its predecessor...
    fake["hash"] = record_hash(fake)
    rows.insert(2, canonical(fake).decode())
    write(log.path, rows)
    res = verify(log.path)
    assert not res.ok and res.bad_line == 4  # ...cannot be followed by the genuine one


def test_reorder_is_detected(log):
    rows = lines(log.path)
    rows[2], rows[3] = rows[3], rows[2]
    write(log.path, rows)
    res = verify(log.path)
    assert not res.ok and res.bad_line == 3 and res.bad_record == rows[2]


def test_dropped_tail_needs_the_external_head(log):
    rows = lines(log.path)
    write(log.path, rows[:-2])
    assert verify(log.path).ok  # a bare chain cannot know it was cut...
    res = verify(log.path, log.head)  # ...the recorded head can
    assert not res.ok and "dropped from the end" in res.problem


def test_appending_continues_the_chain(log):
    again = AuditLog(log.path, "run-1")
    again.append("run.resumed")
    assert verify(log.path, again.head).ok and again.head.seq == 7


def test_record_of_another_run_is_refused(log, tmp_path):
    other = AuditLog(tmp_path / "other.jsonl", "run-2")
    other.append("run.started")
    rows = lines(log.path)
    write(log.path, lines(other.path) + rows[1:])
    assert not verify(log.path).ok


def test_exports(log):
    recs = read_records(log.path)
    md = export_markdown(recs, verify(log.path, log.head))
    assert "## Succeeded steps" in md and "| s0 | ran | 0 |" in md
    assert "## Failed, lost or cancelled steps" in md and "| s1 | failed | exit_code | 3 |" in md
    assert "| s1 |" not in md.split("## Succeeded steps")[1].split("##")[0]  # true headings
    assert "## Confirmations given" in md and "| s2 | typed |" in md
    assert "- audit verify: ok (local chain only): " in md  # never "verified" unchecked
    csv_text = export_csv(recs)
    assert csv_text.splitlines()[0].startswith("seq,ts,event,step,status")
    assert len(csv_text.splitlines()) == 1 + len(recs)


def test_empty_log_has_the_genesis_head(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.touch()
    assert verify(path, Head(-1, "0" * 64)).ok
    assert not verify(path, Head(0, "ab" * 32)).ok
