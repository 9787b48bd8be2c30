"""Which run: the one home for finding, picking and opening a run of a runbook, and its status.

`eagle-tui run` (headless or the cockpit), the cockpit's launcher and its run picker choose here,
before the driver claim, the run the operator is shown (`Selection.before_claim`). The engine settles it
once more under the claim (`Selection.under_claim`, runbook/engine/facade.py `open`): another
driver may have started or finished a run meanwhile. A run the operator named (`--run`, the
picker) is opened as named; "resume the latest unfinished run, else start one" is chosen again,
and a new run keeps the id already shown.

The runbook file is read once (`RunbookSource`): every load of one engine, for the id shown and
for an id the claim moved to, comes from the same bytes (one sha256 in the audit).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

from runbook.events import RUNNING
from runbook.loader import LoadedRunbook, RunbookError, load_text, read_runbook_text
from runbook.state import RunState, latest_run, list_runs, new_run_id, unreadable_runs

LATEST = "latest"  # `--run latest`: the latest run of the runbook, finished or not


@dataclass(frozen=True)
class RunChoice:
    """What the operator asked for (`eagle-tui run` flags; the run picker names an id)."""

    run: str | None = None  # `--run`: an id, a unique prefix, or `latest`
    new: bool = False  # `--new-run`

    @property
    def named(self) -> bool:
        """A run the operator named: opened as named, never chosen again under the claim."""
        return bool(self.run)


@dataclass(frozen=True)
class RunbookSource:
    """A runbook file read once, with its `--set` values and the state dir it runs under."""

    path: Path
    text: str
    overrides: dict[str, str]
    state_dir: Path

    @classmethod
    def read(
        cls, path: Path | str, overrides: dict[str, str], state_dir: Path | str
    ) -> RunbookSource:
        """RunbookError when the file cannot be read or is not UTF-8."""
        return cls(Path(path), read_runbook_text(path), dict(overrides), Path(state_dir))

    @functools.cached_property
    def probe(self) -> LoadedRunbook:
        """Loaded with placeholder ids (RUN_ID, STATE_DIR): its name, steps, hosts and secrets,
        checked before a run is chosen."""
        return load_text(self.text, str(self.path), self.overrides)

    def load(self, run_id: str) -> LoadedRunbook:
        """Loaded for a run: `${run_id}` and `${state_dir}` are that run's."""
        return load_text(self.text, str(self.path), self.overrides, run_id, str(self.state_dir))


# ---------------------------------------------------------------------- finding
def find(state_dir: Path, ref: str | None) -> RunState:
    """The run `ref` names among every runbook's (an id, a unique prefix, or `latest`; None: the
    latest, as with `--run latest`); LookupError says why none."""
    runs = list_runs(state_dir)
    if not runs:
        raise LookupError(f"no runs in {state_dir}")
    if ref in (None, LATEST):  # run ids start with their time, never with "latest"
        return runs[-1]
    matches = [r for r in runs if r.run_id == ref] or [r for r in runs if r.run_id.startswith(ref)]
    if len(matches) != 1:
        raise LookupError(f"{'no' if not matches else 'several'} runs match {ref!r} in {state_dir}")
    return matches[0]


def still_running(state_dir: Path, runbook_name: str) -> list[tuple[str, list[str]]]:
    """Runs of this runbook with steps recorded running: (run id, those steps)."""
    out = []
    for run in list_runs(state_dir, runbook_name):
        live = [sid for sid, r in run.steps.items() if r.status == RUNNING]
        if live:
            out.append((run.run_id, live))
    return out


def status(run: RunState) -> str:
    """One wording for `eagle-tui runs` and the cockpit's run picker."""
    if run.finished:
        return f"finished (exit {run.exit_code})"
    counts: dict[str, int] = {}
    for rec in run.steps.values():
        counts[rec.status] = counts.get(rec.status, 0) + 1
    return "unfinished: " + ", ".join(f"{n} {st}" for st, n in counts.items())


# ---------------------------------------------------------------------- choosing
def pick(state_dir: Path, runbook_name: str, choice: RunChoice) -> str:
    """The run id for `choice`: `--run ID` (a prefix will do) that run of this runbook, `--run
    latest` the latest run finished or not, `--new-run` a new id, else the latest unfinished
    run or a new one. A named run that does not fit raises RunbookError."""
    if choice.run == LATEST:  # `make tui`
        prior = latest_run(state_dir, runbook_name)
        return prior.run_id if prior is not None else _resume_or_new(state_dir, runbook_name)
    if choice.run:
        try:
            run = find(state_dir, choice.run)
        except LookupError as exc:
            raise RunbookError([f"--run {choice.run}: {exc}"]) from None
        if run.runbook_name != runbook_name:
            raise RunbookError(
                [
                    f"--run {choice.run}: run {run.run_id} is of runbook {run.runbook_name!r}, "
                    f"not {runbook_name!r}"
                ]
            )
        return run.run_id
    return _resume_or_new(state_dir, runbook_name, choice.new)


def settle(state_dir: Path, runbook_name: str, choice: RunChoice, shown: str) -> str:
    """Under the driver claim, choose again: a named run stays; a "new run" decision keeps the
    id shown already; else the choice another driver's run may have moved."""
    if choice.named:
        return shown
    fresh = _resume_or_new(state_dir, runbook_name, choice.new)
    return shown if not _started(state_dir, fresh) and not _started(state_dir, shown) else fresh


def _resume_or_new(state_dir: Path, runbook_name: str, new: bool = False) -> str:
    """Resume the latest unfinished run of this runbook (one whose state cannot be read first:
    opening it explains the refusal), else start a new one."""
    if new:
        return new_run_id(runbook_name)
    broken = unreadable_runs(state_dir, runbook_name)
    if broken:
        return broken[-1]
    prior = latest_run(state_dir, runbook_name)
    return prior.run_id if prior is not None and not prior.finished else new_run_id(runbook_name)


def _started(state_dir: Path, run_id: str) -> bool:
    d = Path(state_dir) / "runs" / run_id
    return (d / "state.json").exists() or (d / "audit.jsonl").exists()


# ---------------------------------------------------------------------- opening
@dataclass(frozen=True)
class Selection:
    """A run chosen for a runbook source, and the runbook loaded for its id."""

    source: RunbookSource
    choice: RunChoice
    run_id: str
    loaded: LoadedRunbook

    @classmethod
    def before_claim(cls, source: RunbookSource, choice: RunChoice) -> Selection:
        """Before the claim: the run the operator is shown (RunbookError: a bad `--run`)."""
        run_id = pick(source.state_dir, source.probe.runbook.name, choice)
        return cls(source, choice, run_id, source.load(run_id))

    @classmethod
    def named(cls, source: RunbookSource, run_id: str) -> Selection:
        """A run id already chosen (the run picker's): opened as it is."""
        return cls(source, RunChoice(run=run_id), run_id, source.load(run_id))

    def under_claim(self) -> Selection:
        """Settled under the driver claim (see `settle`); the runbook is loaded again, from
        the same text, only when the id moved."""
        run_id = settle(self.source.state_dir, self.loaded.runbook.name, self.choice, self.run_id)
        if run_id == self.run_id:
            return self
        return replace(self, run_id=run_id, loaded=self.source.load(run_id))
