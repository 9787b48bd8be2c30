"""`eagle-tui run RUNBOOK` without --auto: choose or resume the run exactly like the headless
path (runbook/runs.py), build the engine with the cockpit as its listener and confirmer, and
run the app."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

from eagle_tui.app.app import CockpitApp
from eagle_tui.app.keymap import load_keymap
from eagle_tui.app.quitting import farewell, live_work
from eagle_tui.app.screens.main import ACTIONS
from runbook.engine import Confirmer, Engine
from runbook.events import Event
from runbook.runs import RunbookSource, RunChoice, Selection
from runbook.state import default_state_dir
from runbook.transports import TransportOptions
from runbook.transports.factory import make_transport_factory

BINDING_IDS = {bid for *_, bid in ACTIONS}


def build_app(
    args: argparse.Namespace,
    state_dir: Path,
    overrides: dict[str, str],
    secrets: dict[str, str],
    *,
    clock: Callable[[], float] = time.time,
    keymap_paths: list[Path] | None = None,
    run_id: str | None = None,
    transports=None,
    options: TransportOptions | None = None,
    selection: Selection | None = None,
) -> CockpitApp:
    """The cockpit on `selection` (the CLI's); else on `run_id` as named, else on the run the
    flags choose (runbook/runs.py)."""
    options = options or TransportOptions()
    chosen = selection or _choose(args, state_dir, overrides, run_id)

    def make_engine(listener: Callable[[Event], None], confirmer: Confirmer) -> Engine:
        return Engine(
            chosen.loaded,
            state_dir,
            transports=transports or make_transport_factory(state_dir, options),
            confirmer=confirmer,  # the app's typed-confirmation modal
            secrets=secrets,
            default_host=args.host,
            listeners=[listener],
            stats=True,
            accept_audit_break=getattr(args, "accept_audit_break", False),
            selection=chosen,  # chosen again under the driver claim unless named
        )

    keymap, problems = load_keymap(BINDING_IDS, keymap_paths)
    select = getattr(args, "from", None) or getattr(args, "only", None)
    return CockpitApp(
        make_engine,
        chosen.run_id,
        options=options,
        clock=clock,
        keymap=keymap,
        keymap_problems=problems,
        select=select,
    )


def _choose(
    args: argparse.Namespace, state_dir: Path, overrides: dict[str, str], run_id: str | None
) -> Selection:
    source = RunbookSource.read(args.runbook, overrides, state_dir)
    if run_id is not None:
        return Selection.named(source, run_id)
    choice = RunChoice(getattr(args, "run", None), bool(getattr(args, "new_run", False)))
    return Selection.before_claim(source, choice)


def reattach_command(args: argparse.Namespace, state_dir: Path, run_id: str) -> str:
    """The command that opens this run again as it was opened: the same state dir (when not
    the default), host, variables and ssh files, so pasting it works."""
    argv = ["eagle-tui", "run", str(args.runbook), "--run", run_id]
    if Path(state_dir).resolve() != default_state_dir().resolve():
        argv += ["--state-dir", str(state_dir)]
    for flag, value in (
        ("--host", getattr(args, "host", None)),
        ("--python", getattr(args, "python", None)),
        ("--ssh-config", getattr(args, "ssh_config", None)),
        ("--known-hosts", getattr(args, "known_hosts", None)),
    ):
        if value:
            argv += [flag, value]
    for assignment in getattr(args, "set", None) or []:
        argv += ["--set", assignment]
    return shlex.join(argv)


def run_app(
    args: argparse.Namespace,
    state_dir: Path,
    overrides: dict[str, str],
    secrets: dict[str, str],
    selection: Selection,
    options: TransportOptions | None = None,
) -> int:
    while True:
        app = build_app(args, state_dir, overrides, secrets, selection=selection, options=options)
        code = app.run()
        if app.refusal:
            print(app.refusal, file=sys.stderr)
        relaunch = reattach_command(args, state_dir, app.run_id)
        for line in farewell(app.quit_work or live_work(app.engine), relaunch):
            print(line)
        if app.engine.audit is not None:
            head = app.engine.audit.head
            print(f"run {app.run_id} · audit head seq {head.seq} sha256 {head.hash}")
        if app.next_run is None or app.refusal:
            return int(code if code is not None else app.return_code or 0)
        run_id = app.next_run  # the run picker's choice (`o`)
        print(f"opening run {run_id}")
        # the runbook file as it is now (it may have been edited since), for the chosen run
        selection = Selection.named(RunbookSource.read(args.runbook, overrides, state_dir), run_id)
