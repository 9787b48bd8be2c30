"""`--drop ""` (the runbook's unset drop_source, issue 17) drops nothing; a named drop still does."""

from __future__ import annotations

import json

from eagle3_data_helpers import write_records

from remote_agent.eagle3.data.records import iter_records


def test_an_empty_drop_keeps_every_source_and_a_named_one_still_drops(cli, tmp_path):
    a = write_records(tmp_path / "a.jsonl", [("a1", [1, 2, 3], [0, 1, 1])])
    long = write_records(tmp_path / "longctx.jsonl", [("l1", list(range(4, 40)), [1] * 36)])
    for drop, want in (("", {"a1", "l1"}), ("longctx", {"a1"})):
        out = tmp_path / f"m-{drop or 'none'}.jsonl"
        run = cli("merge", a, long, "--out", out, "--drop", drop, "--workers", "1")
        assert run.rc == 0, run.stderr
        assert {r.id for _, _, r in iter_records(out)} == want
        manifest = json.loads(out.with_name(out.stem + ".manifest.json").read_text())
        assert manifest["dropped_sources"] == ([drop] if drop else [])
