"""Runs as the operator names and reads them, shared by the CLI and the cockpit: which run
`--run` / `--new-run` mean (`find_run`, `pick_run_id`) and a run's one-line status
(`run_status`, the wording of `eagle-tui runs` and the cockpit's run picker).

Here, not in `cli.py`, so the cockpit's launcher and run picker need not import the CLI (that
closed an import circle); no Textual import. Run selection is to get its one home in
`runbook/` (docs/ARCHITECTURE.md, phase 2 step 2)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runbook.escape import terminal
from runbook.events import RUNNING
from runbook.loader import RunbookError
from runbook.state import RunState, choose_run_id, latest_run, list_runs


def _warn(msg: str) -> None:
    """As the CLI's errors: the message may quote run ids and step ids, escaped line by line."""
    print("\n".join(terminal(line) for line in msg.split("\n")), file=sys.stderr)


def find_run(state_dir: Path, ref: str | None) -> RunState:
    runs = list_runs(state_dir)
    if not runs:
        raise LookupError(f"no runs in {state_dir}")
    if ref is None:
        return runs[-1]
    matches = [r for r in runs if r.run_id == ref] or [r for r in runs if r.run_id.startswith(ref)]
    if len(matches) != 1:
        raise LookupError(f"{'no' if not matches else 'several'} runs match {ref!r} in {state_dir}")
    return matches[0]


def pick_run_id(state_dir: Path, runbook_name: str, args: argparse.Namespace) -> str:
    """`--run ID` (a prefix will do) opens that run of this runbook; `--new-run` starts one and
    warns about older runs whose steps are still running (the new run does not follow them)."""
    if getattr(args, "run", None) == "latest":  # the latest run, finished or not (`make tui`)
        prior = latest_run(state_dir, runbook_name)
        return prior.run_id if prior is not None else choose_run_id(state_dir, runbook_name)
    if getattr(args, "run", None):
        try:
            run = find_run(state_dir, args.run)
        except LookupError as exc:
            raise RunbookError([f"--run {args.run}: {exc}"]) from None
        if run.runbook_name != runbook_name:
            raise RunbookError(
                [
                    f"--run {args.run}: run {run.run_id} is of runbook {run.runbook_name!r}, "
                    f"not {runbook_name!r}"
                ]
            )
        return run.run_id
    if args.new_run:
        for old in list_runs(state_dir, runbook_name):
            live = [sid for sid, r in old.steps.items() if r.status == RUNNING]
            if live:
                _warn(
                    f"warning: run {old.run_id} still has running steps: {', '.join(live)}; "
                    f"the new run does not follow them (open that run with --run {old.run_id})"
                )
    return choose_run_id(state_dir, runbook_name, args.new_run)


def run_status(run: RunState) -> str:
    if run.finished:
        return f"finished (exit {run.exit_code})"
    counts: dict[str, int] = {}
    for rec in run.steps.values():
        counts[rec.status] = counts.get(rec.status, 0) + 1
    return "unfinished: " + ", ".join(f"{n} {st}" for st, n in counts.items())
