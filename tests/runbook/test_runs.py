"""Which run (runbook/runs.py): picked before the driver claim, settled under it, loaded once."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from runbook.loader import RunbookError
from runbook.runs import RunbookSource, RunChoice, Selection, find, pick, settle, status
from runbook.state import RunState, RunStore, StepRecord, list_runs

RUNBOOK = """\
name: two
steps:
  - {id: a, title: A, run: "echo ${run_id}"}
  - {id: b, title: B, run: "true"}
"""


def make_run(state_dir: Path, run_id: str, *, finished: bool = False, name: str = "two") -> None:
    now = time.time()
    RunStore(state_dir, run_id).create_dirs()
    RunStore(state_dir, run_id).save(
        RunState(
            run_id=run_id,
            runbook_name=name,
            runbook_path="two.yaml",
            runbook_sha256="0" * 64,
            vars={},
            created_at=now,
            updated_at=now,
            steps={"a": StepRecord(status="succeeded" if finished else "running")},
            finished=finished,
        )
    )


@pytest.fixture
def source(tmp_path: Path) -> RunbookSource:
    path = tmp_path / "two.yaml"
    path.write_text(RUNBOOK)
    return RunbookSource.read(path, {}, tmp_path / "state")


def test_the_default_resumes_the_latest_unfinished_run_else_starts_one(source):
    state = source.state_dir
    fresh = pick(state, "two", RunChoice())
    assert re.fullmatch(r"\d{8}T\d{6}Z-two-[0-9a-f]{4}", fresh)
    make_run(state, "20260101T000000Z-two-aaaa")
    assert pick(state, "two", RunChoice()) == "20260101T000000Z-two-aaaa"
    assert pick(state, "two", RunChoice(new=True)) != "20260101T000000Z-two-aaaa"
    make_run(state, "20260101T000001Z-two-bbbb", finished=True)
    assert pick(state, "two", RunChoice()) not in {
        "20260101T000000Z-two-aaaa",
        "20260101T000001Z-two-bbbb",
    }
    assert pick(state, "two", RunChoice(run="latest")) == "20260101T000001Z-two-bbbb"


def test_a_named_run_is_found_by_prefix_and_must_be_of_this_runbook(source):
    state = source.state_dir
    make_run(state, "20260101T000000Z-two-aaaa")
    make_run(state, "20260101T000000Z-other-cccc", name="other")
    assert pick(state, "two", RunChoice(run="20260101T000000Z-tw")) == "20260101T000000Z-two-aaaa"
    with pytest.raises(RunbookError, match="several runs match"):
        pick(state, "two", RunChoice(run="20260101"))
    with pytest.raises(RunbookError, match="is of runbook 'other'"):
        pick(state, "two", RunChoice(run="20260101T000000Z-other"))
    with pytest.raises(LookupError, match="no runs match"):
        find(state, "nope")


def test_under_the_claim_only_the_default_choice_moves(source):
    """Another driver started a run between the pick and the claim: the default choice resumes
    it; a run the operator named stays; a new run keeps the id already shown."""
    state = source.state_dir
    make_run(state, "20260101T000000Z-two-aaaa", finished=True)
    shown = pick(state, "two", RunChoice())
    make_run(state, "20260101T000002Z-two-dddd")  # the other driver's run
    assert settle(state, "two", RunChoice(), shown) == "20260101T000002Z-two-dddd"
    named = RunChoice(run="20260101T000000Z-two-aaaa")
    assert settle(state, "two", named, "20260101T000000Z-two-aaaa") == "20260101T000000Z-two-aaaa"
    new = pick(state, "two", RunChoice(new=True))
    assert settle(state, "two", RunChoice(new=True), new) == new


def test_the_runbook_file_is_read_once(source):
    """A load for an id the claim moved to comes from the bytes read at first (one sha256)."""
    selection = Selection.before_claim(source, RunChoice())
    assert selection.under_claim() is selection  # nothing moved: not loaded again
    source.path.write_text(RUNBOOK.replace("true", "false"))  # edited after it was read
    make_run(source.state_dir, "20260101T000002Z-two-dddd")
    moved = selection.under_claim()
    assert moved.run_id == "20260101T000002Z-two-dddd"
    assert moved.loaded.sha256 == selection.loaded.sha256
    assert moved.loaded.runbook.step("a").run == "echo 20260101T000002Z-two-dddd"
    assert moved.loaded.runbook.step("b").run == "true"


def test_status_wording(source):
    make_run(source.state_dir, "20260101T000000Z-two-aaaa")
    (run,) = list_runs(source.state_dir)
    assert status(run) == "unfinished: 1 running"
    run.finished, run.exit_code = True, 0
    assert status(run) == "finished (exit 0)"


def test_run_named_headless_opens_that_run_not_the_latest_unfinished(cli):
    """`--auto --run OLD` opens OLD even when a newer run of the runbook is unfinished (the
    id is not chosen again under the claim, as in the cockpit)."""
    rb = cli.runbook(RUNBOOK)
    cli("run", str(rb), "--auto", "--only", "a", check=0)
    cli("run", str(rb), "--auto", "--new-run", "--only", "a", check=0)
    old, new = (r.run_id for r in list_runs(cli.state, "two"))
    cli("run", str(rb), "--auto", "--run", old, check=0)
    after = {r.run_id: r for r in list_runs(cli.state, "two")}
    assert after[old].finished and after[old].steps["b"].status == "succeeded"
    assert not after[new].finished and after[new].steps["b"].status == "pending"


def test_latest_names_the_latest_run_where_a_run_is_looked_up(source):
    """`eagle-tui audit export latest` / `status latest` said "no runs match 'latest'" though
    `run --run latest` takes it."""
    state = source.state_dir
    make_run(state, "20260101T000000Z-two-aaaa")
    make_run(state, "20260101T000001Z-other-cccc", name="other", finished=True)
    assert find(state, "latest").run_id == "20260101T000001Z-other-cccc"
    assert find(state, None).run_id == "20260101T000001Z-other-cccc"
