"""Issue 15 item 11, the wording of guard evidence: no "0 field(s) match", no float timestamps,
no "0.01 GiB ... >= 0.00 GiB", no directory entry's 4096 bytes. Real probes on real files."""

from __future__ import annotations

import hashlib
import json
import re
import time

from eagle_tui.present import guards as guard_view
from eagle_tui.present.values import observed_text
from remote_agent.agent.probes import run_probe


def test_probe_messages_read_as_a_person_writes_them(tmp_path):
    data = tmp_path / "merged.jsonl"
    data.write_bytes(b"x" * 10_000_000)
    man = tmp_path / "merged.manifest.json"
    sha = hashlib.sha256(data.read_bytes()).hexdigest()
    man.write_text(json.dumps({"file": data.name, "sha256": sha, "dropped_sources": ["modules"]}))

    plain = run_probe({"check": "manifest", "path": str(man)})
    assert plain["ok"] and "field(s)" not in plain["message"]
    assert plain["message"].endswith("merged.jsonl sha256 matches")
    fields = run_probe(
        {"check": "manifest", "path": str(man), "expect": {"dropped_sources": ["modules"]}}
    )
    assert "dropped_sources as expected, merged.jsonl sha256 matches" in fields["message"]

    size = run_probe({"check": "dir_size", "path": str(tmp_path), "min_bytes": 0})
    assert size["message"].endswith(": 9.5 MiB in 2 files"), size["message"]  # no ">= 0.00 GiB"
    bounded = run_probe({"check": "dir_size", "path": str(data), "min_bytes": 1 << 30})
    assert bounded["message"].endswith("9.5 MiB in 1 file, not within >= 1.0 GiB")

    entry = run_probe({"check": "path_exists", "path": str(tmp_path)})
    assert entry["message"].endswith("exists (a directory)") and "4096" not in entry["message"]
    afile = run_probe({"check": "path_exists", "path": str(data)})
    assert afile["message"].endswith("exists (file, 9.5 MiB)")
    free = run_probe({"check": "disk_free", "path": str(tmp_path), "min_bytes": 200 << 20})
    assert re.search(r"free >= 200\.0 MiB required$", free["message"]), free["message"]


def test_observed_timestamps_are_local_iso_times():
    now = time.time()
    text = observed_text({"run_id": "r", "ended_at": now})
    assert "e+09" not in text and re.search(r"ended_at=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", text)
    line = guard_view.view(
        {"phase": "pre", "check": "step_succeeded", "ok": True, "observed": {"ended_at": now}}
    )
    assert line.plain().startswith("✓ guard step_succeeded: passed")
