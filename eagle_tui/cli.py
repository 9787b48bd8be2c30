"""`eagle-tui`: validate, run (TUI or --auto), status, audit export/verify.

Exit codes: 0 all done; 1 a step failed or was lost; 2 invalid input, or the state dir cannot be
written, or the run's audit and state disagree; 3 blocked (a guard failed, or a confirmation was
needed and not given); 4 another driver holds this runbook's work on the box; 5 (--dry-run) a
host could not be reached, so its guards were not evaluated; 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import signal
import sys
from pathlib import Path
from typing import Any

from rich.text import Text

from eagle_tui import __version__
from remote_agent.wire.atomic_write import write_atomic
from runbook import audit as audit_mod
from runbook import audit_seal, runs
from runbook.agent_client import AgentError
from runbook.audit_seal import AuditBreak
from runbook.box_claim import EXIT_LOCKED, DriverLocked
from runbook.engine import (
    EXIT_BLOCKED,
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    Engine,
    headless_confirmer,
)
from runbook.escape import terminal
from runbook.events import BLOCKED, RUNNING, TERMINAL_BAD
from runbook.loader import RunbookError, load_runbook, parse_overrides, read_secrets
from runbook.runs import RunbookSource, RunChoice, Selection
from runbook.secret_guard import refuse_raw_secrets
from runbook.state import RunLocked, RunState, StateWriteError, default_state_dir, list_runs
from runbook.transports import FINGERPRINT_RE, TransportError, TransportOptions
from runbook.transports.factory import make_transport_factory

FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def _err(msg: str) -> None:
    """Errors quote the box (its messages, paths, output): escaped line by line."""
    print("\n".join(terminal(line) for line in msg.split("\n")), file=sys.stderr)


def _state_dir(args: argparse.Namespace) -> Path:
    return Path(args.state_dir) if args.state_dir else default_state_dir()


# ---------------------------------------------------------------------- validate
def cmd_validate(args: argparse.Namespace) -> int:
    try:
        loaded = load_runbook(args.runbook, parse_overrides(args.set or []))
    except RunbookError as exc:
        for p in exc.problems:
            _err(p)
        return EXIT_INVALID
    for warning in loaded.warnings:  # a lint (runbook/shell_code.py), not a refusal
        _err(warning)
    rb = loaded.runbook
    guards = sum(len(s.preconditions) + len(s.postconditions) + len(s.skip_if) for s in rb.steps)
    destructive = [s.id for s in rb.steps if s.destructive]
    print(
        f"{args.runbook}: ok: runbook {rb.name!r}, {len(rb.steps)} steps, {guards} guards, "
        f"destructive: {', '.join(destructive) or 'none'}"
    )
    return EXIT_OK


# ---------------------------------------------------------------------- run
async def _run_headless(args: argparse.Namespace, engine: Engine, view, run_id: str) -> int:
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    interrupted = False

    def on_signal() -> None:
        nonlocal interrupted
        interrupted = True
        if main is not None:
            main.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    code = EXIT_FAILED
    try:
        if args.dry_run:
            await engine.open_readonly()
            code = await engine.dry_run()
            view.dry_run_done = True
        else:
            await engine.open(run_id)
            view.opened()
            code = await engine.run_all(start=getattr(args, "from"), only=args.only)
    except asyncio.CancelledError:
        if not interrupted:
            raise
        if args.dry_run:
            said = "interrupted: dry run stopped; nothing changed"
        elif engine.state is None:  # still connecting or opening: nothing was started
            said = "interrupted before the run opened; nothing was started or changed"
        else:
            said = (
                "interrupted: jobs keep running on the box; run the same command again to reattach"
            )
        view.console.print(said)
        code = 130
    except TransportError as exc:
        _err(f"error: {exc}")
        code = EXIT_FAILED
    except AgentError as exc:  # the box refused what opening a run needs (spool_unusable)
        _err(f"error: {exc.message}")
        code = EXIT_FAILED
    except (DriverLocked, RunLocked) as exc:
        _err(f"locked: {exc}")
        code = EXIT_LOCKED
    except (AuditBreak, StateWriteError) as exc:
        _err(f"error: {exc}")
        code = EXIT_INVALID
    except OSError as exc:  # a log mirror on a full disk: the same one line
        if exc.errno not in FULL_DISK:
            raise
        _err(f"error: {exc.filename or engine.state_dir}: cannot write: {exc.strerror}")
        code = EXIT_INVALID
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        try:
            await engine.close()
        except StateWriteError as exc:
            if code != EXIT_INVALID:  # one line: the first write that failed says it all
                _err(f"error: {exc}")
            code = EXIT_INVALID
    return code


def transport_options(args: argparse.Namespace) -> TransportOptions:
    """The transports' options, built once from the flags (the Namespace stops here)."""
    return TransportOptions(
        known_hosts=args.known_hosts,
        ssh_config=args.ssh_config,
        trust_host=tuple(args.trust_host or ()),
        python=args.python,
    )


def cmd_run(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args)
    try:
        overrides = parse_overrides(args.set or [])
        source = RunbookSource.read(args.runbook, overrides, state_dir)  # the file, read once
        probe = source.probe
        for flag, sid in (("--from", getattr(args, "from")), ("--only", args.only)):
            if sid is not None and sid not in probe.runbook.step_ids:
                raise RunbookError(
                    [f"{flag} {sid}: no such step (steps: {', '.join(probe.runbook.step_ids)})"]
                )
        for sid in args.yes or []:
            if sid != "*" and sid not in probe.runbook.step_ids:
                raise RunbookError([f"--yes {sid}: no such step"])
        if args.python is not None and not args.python.strip():
            raise RunbookError(["--python: expected the path of a python on the box"])
        bad = [fp for fp in args.trust_host or [] if not FINGERPRINT_RE.fullmatch(fp)]
        if bad:
            raise RunbookError(
                [f"--trust-host {fp}: expected SHA256:<43 characters>" for fp in bad]
            )
        secrets = read_secrets(probe.runbook)
        refuse_raw_secrets(probe, secrets, overrides)  # the value never enters state or box
        choice = RunChoice(args.run, args.new_run)
        if choice.new:  # the new run does not follow older runs' running steps: say so
            for old, live in runs.still_running(state_dir, probe.runbook.name):
                _err(
                    f"warning: run {old} still has running steps: {', '.join(live)}; "
                    f"the new run does not follow them (open that run with --run {old})"
                )
        selection = Selection.before_claim(source, choice)
    except RunbookError as exc:
        for p in exc.problems:
            _err(p)
        return EXIT_INVALID
    options = transport_options(args)

    if not args.auto and not args.dry_run:
        from eagle_tui.app.launch import run_app  # imported only for the TUI

        return run_app(args, state_dir, overrides, secrets, selection, options=options)

    loaded = selection.loaded
    from eagle_tui.headless import HeadlessView

    view = HeadlessView(
        {s.id: s.title for s in loaded.runbook.steps},
        show_logs=not args.quiet,
        dry_run=args.dry_run,
    )
    engine = Engine(
        loaded,
        state_dir,
        transports=make_transport_factory(state_dir, options),
        confirmer=headless_confirmer(args.yes or [], loaded.runbook.auto_confirm),
        secrets=secrets,
        default_host=args.host,
        listeners=[view],
        accept_audit_break=args.accept_audit_break,
        selection=selection,  # chosen again under the driver claim (runbook/runs.py)
    )

    view.record_of = lambda sid: engine.state.steps.get(sid) if engine.state else None

    async def go() -> int:
        return await _run_headless(args, engine, view, selection.run_id)

    with view:
        code = asyncio.run(go())
    if engine.store is not None and engine.audit is not None:
        view.summary(
            code,
            str(engine.store.audit_path),
            engine.audit.head.seq,
            engine.audit.head.hash,
            records=engine.state.steps if engine.state is not None else None,
        )
    elif args.dry_run:
        print(
            dry_run_verdict(engine.dry_report, engine.dry_unreachable)
            if view.dry_run_done
            else f"dry run: stopped before every step was evaluated (exit {code}); nothing changed"
        )
    return code


def dry_run_verdict(
    report: dict[str, tuple[str, str]], unreachable: dict[str, str] | None = None
) -> str:
    """The dry run's last line: unreachable hosts, every blocked step and why, or that nothing
    is blocked (only when every guard was evaluated)."""
    blocked = [f"{sid} ({why})" for sid, (state, why) in report.items() if state == "blocked"]
    pending = [sid for sid, (state, _) in report.items() if state == "pending"]
    unevaluated = [sid for sid, (state, _) in report.items() if state == "not evaluated"]
    waits = f"; {len(pending)} pending on earlier steps" if pending else ""
    parts = []
    if unreachable:
        parts.append(
            f"guards of {len(unevaluated)} step(s) not evaluated: "
            + ", ".join(f"{h} unreachable" for h in unreachable)
        )
    if blocked:
        parts.append(f"blocked: {'; '.join(blocked)}")
    if not parts:
        parts.append("nothing blocked")
    return f"dry run: {'; '.join(parts)}{waits}; nothing changed"


# ---------------------------------------------------------------------- status
def cmd_status(args: argparse.Namespace) -> int:
    try:
        run = runs.find(_state_dir(args), args.run)
    except LookupError as exc:
        _err(str(exc))
        return EXIT_INVALID
    if args.json:  # for scripts: the statuses are in the JSON; 0 means it was printed
        # ASCII JSON: the same values, and no control or bidi character reaches the terminal
        print(json.dumps(run.model_dump(mode="json"), indent=1, ensure_ascii=True))
        return EXIT_OK
    code = status_exit_code(run)
    import time

    from rich.console import Console
    from rich.table import Table

    from eagle_tui.present.status import ICONS, STYLES, progress_text
    from runbook.units import format_duration

    age = format_duration(max(0.0, time.time() - run.updated_at))
    attached = driver_attached(_state_dir(args) / "runs" / run.run_id)
    running = [sid for sid, r in run.steps.items() if r.status == RUNNING]
    table = Table(
        title=Text(terminal(f"run {run.run_id} · runbook {run.runbook_name}")), header_style="bold"
    )
    for col in ("", "step", "status", "reason", "attempt", "exit", "duration", "progress"):
        table.add_column(col, overflow="fold")  # ids are never cut with "…", even when piped
    for sid, rec in run.steps.items():
        dur = (rec.ended_at - rec.started_at) if rec.started_at and rec.ended_at else None
        table.add_row(  # every cell literal (Text) and escaped: messages quote the box
            ICONS.get(rec.status, "?"),
            Text(terminal(sid)),
            Text(rec.status, style=STYLES.get(rec.status, "")),
            Text(terminal((rec.reason or "") + (f": {rec.message}" if rec.message else ""))),
            str(rec.attempt or ""),
            "" if rec.exit_code is None else str(rec.exit_code),
            format_duration(dur) if dur else "",
            Text(
                terminal(
                    (
                        progress_text(rec.progress)
                        + (f" (as of {age} ago)" if rec.status == RUNNING and not attached else "")
                    )
                    if rec.progress
                    else "",
                )
            ),
        )
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    if running and not attached:  # the figures stopped when the driver did
        print(
            f"no driver is attached: the state was last written {age} ago; the progress and ETA "
            f"of {', '.join(running)} are as of then (`eagle-tui run RUNBOOK --run {run.run_id}` "
            "reattaches)"
        )
    print(f"audit head: seq {run.audit_seq} sha256 {run.audit_head}")
    return code


def driver_attached(run_dir: Path) -> bool:
    """Whether an eagle-tui process holds the run's lock now (RunStore.lock: flock)."""
    import fcntl
    import os

    try:
        fd = os.open(run_dir / "lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock taken here
    return False


def status_exit_code(run: RunState) -> int:
    """As `run` exits: 1 when a step failed, was lost or cancelled; 3 when one is blocked; else 0."""
    statuses = {r.status for r in run.steps.values()}
    if statuses & set(TERMINAL_BAD):
        return EXIT_FAILED
    return EXIT_BLOCKED if BLOCKED in statuses else EXIT_OK


# ---------------------------------------------------------------------- runs
def cmd_runs(args: argparse.Namespace) -> int:
    """Every run in the state dir, oldest first: id, runbook, started, status, running steps."""
    import datetime

    from rich.console import Console
    from rich.table import Table

    listed = list_runs(_state_dir(args))
    if not listed:
        print(f"no runs in {_state_dir(args)}")
        return EXIT_OK
    table = Table(header_style="bold")
    for col in ("run", "runbook", "started (UTC)", "status", "running steps"):
        table.add_column(col, overflow="fold")  # ids are never cut, even when piped
    for run in listed:
        started = datetime.datetime.fromtimestamp(run.created_at, datetime.timezone.utc)
        live = [sid for sid, r in run.steps.items() if r.status == RUNNING]
        table.add_row(
            Text(run.run_id),
            Text(run.runbook_name),
            started.strftime("%Y-%m-%d %H:%M"),
            runs.status(run),
            Text(", ".join(live), style="yellow"),
        )
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    return EXIT_OK


# ---------------------------------------------------------------------- audit
def _run_coroutine(make: Any) -> Any:
    """asyncio.run, also when called from a running loop (the cockpit calls main in-process)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def _box_head_check(args: argparse.Namespace, run: RunState, path: Path) -> tuple[str, str | None]:
    """Check the verified chain against the head kept on the run's box: (what it was checked
    against, the problem or None). An unreachable box is said, not an error."""
    if args.offline:
        return "box head not checked (--offline)", None
    records = audit_mod.read_records(path)
    host = audit_seal.run_default_host(records)
    if host is None:
        return "box head not checked (the audit names no host)", None
    config = None
    try:  # a host named in the runbook's `hosts:` needs its entry (ssh target, spool)
        config = load_runbook(run.runbook_path, dict(run.vars)).runbook.hosts.get(host)
    except (RunbookError, OSError, ValueError):
        pass
    try:
        options = TransportOptions(known_hosts=args.known_hosts, ssh_config=args.ssh_config)
        transport = make_transport_factory(_state_dir(args), options)(
            host, *([config] if config is not None else [])
        )
        head, spool_id = _run_coroutine(lambda: audit_seal.fetch_box_head(transport, run.run_id))
    except Exception as exc:  # noqa: BLE001 - any failure to reach the box is reported as such
        return f"box head not checked: {host} not reachable ({exc})", None
    if head is None:
        against = f"the box {host} has no head for this run"
        problem = audit_seal.missing_head_problem(records, spool_id)
        return (against, problem) if problem else (f"{against} (local chain only)", None)
    against = f"checked against the head on {host}: seq {head.get('seq')}" + (
        " (clean close)" if head.get("clean") else ""
    )
    return against, audit_seal.box_head_problem(records, head)


def verification(args: argparse.Namespace, run: RunState, path: Path) -> audit_mod.Verification:
    """What `audit verify` concludes; every export's header says the same words."""
    result = audit_mod.verify(path, audit_mod.Head(run.audit_seq, run.audit_head))
    if not result.ok:
        return audit_mod.Verification(result, "box head not checked (the local chain is broken)")
    against, problem = _box_head_check(args, run, path)
    return audit_mod.Verification(
        result, against, problem, box_checked=against.startswith("checked against")
    )


def cmd_audit(args: argparse.Namespace) -> int:
    try:
        run = runs.find(_state_dir(args), args.run)
    except LookupError as exc:
        _err(str(exc))
        return EXIT_INVALID
    path = _state_dir(args) / "runs" / run.run_id / "audit.jsonl"
    checked = verification(args, run, path)
    if args.audit_command == "verify":
        if checked.ok:
            print(terminal(f"{path}: {checked.summary()}"))
            return EXIT_OK
        _err(f"{path}: {checked.summary()}")
        if checked.local.bad_record:
            _err(f"first bad record: {checked.local.bad_record}")
        return EXIT_FAILED
    from eagle_tui.present.audit_md import export_markdown

    records = audit_mod.read_records(path) if path.exists() else []
    fmt = args.format
    if fmt == "jsonl":
        out = audit_mod.export_jsonl(records)
    elif fmt == "csv":
        out = audit_mod.export_csv(records, checked)
    else:
        out = export_markdown(records, checked)
    if args.output:
        write_atomic(Path(args.output), out)
        print(
            terminal(
                f"wrote {args.output} ({len(records)} records, chain "
                f"{'ok' if checked.ok else 'NOT OK'})"
            )
        )
    else:
        sys.stdout.write(out)  # every value in it is escaped (runbook/escape.py)
    if not checked.ok:
        _err(f"warning: audit verify says {checked.summary()}")
        return EXIT_FAILED
    return EXIT_OK


# ---------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eagle-tui", description=(__doc__ or "eagle-tui").splitlines()[0]
    )
    parser.add_argument("--version", action="version", version=f"eagle-tui {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        help="run state directory (default: $EAGLE_TUI_STATE_DIR or the XDG state dir)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", parents=[common], help="check a runbook; exit 0 (valid) or 2")
    p.add_argument("runbook")
    p.add_argument("--set", action="append", metavar="NAME=VALUE", help="override a variable")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("run", parents=[common], help="run a runbook (TUI, or headless with --auto)")
    p.add_argument("runbook")
    p.add_argument(
        "--auto", action="store_true", help="headless: run every step in order without the TUI"
    )
    p.add_argument(
        "--yes",
        action="append",
        nargs="?",
        const="*",
        metavar="STEP",
        help="confirm destructive steps: alone, those in the runbook's auto_confirm; with STEP, that step",
    )
    p.add_argument("--set", action="append", metavar="NAME=VALUE", help="override a variable")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--from", metavar="STEP", help="start at STEP (earlier steps are not run)")
    group.add_argument("--only", metavar="STEP", help="run only STEP")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="resolve vars and evaluate every guard; change nothing",
    )
    p.add_argument(
        "--host", help="default host for steps without their own (overrides the runbook's host)"
    )
    p.add_argument(
        "--python",
        metavar="PATH",
        help="the python on the box for a host not in the runbook's `hosts:` (e.g. --host "
        "user@box): it runs the agent, and `python` in jobs and guards means it (as Ansible's "
        "interpreter setting); a `hosts:` entry says its own with `python:`",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--new-run", action="store_true", help="start a new run instead of resuming the latest"
    )
    which.add_argument(
        "--run",
        metavar="ID",
        help="open this run: an id, a unique prefix or `latest` (see `eagle-tui runs`)",
    )
    p.add_argument("--quiet", action="store_true", help="do not stream job logs")
    p.add_argument(
        "--accept-audit-break",
        action="store_true",
        help="resume although the run's audit and state disagree (the override is audited)",
    )
    p.add_argument(
        "--trust-host",
        action="append",
        metavar="SHA256:FINGERPRINT",
        help="trust this host key on first contact (recorded in known_hosts)",
    )
    p.add_argument("--known-hosts", help="known_hosts file (default ~/.ssh/known_hosts)")
    p.add_argument("--ssh-config", help="ssh config file (default ~/.ssh/config)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "runs", parents=[common], help="list the runs: id, runbook, status, live steps"
    )
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser(
        "status",
        parents=[common],
        help="show a run's steps (default: the latest run); exit 1 when a step failed, 3 blocked "
        "(--json: 0)",
    )
    p.add_argument("run", nargs="?")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("audit", help="export or verify a run's audit log")
    asub = p.add_subparsers(dest="audit_command", required=True)
    e = asub.add_parser(
        "export", parents=[common], help="export the audit log (default: the latest run)"
    )
    e.add_argument("run", nargs="?")
    e.add_argument("--format", choices=("jsonl", "md", "csv"), default="md")
    e.add_argument("-o", "--output")
    _box_options(e)
    e.set_defaults(func=cmd_audit)
    v = asub.add_parser(
        "verify", parents=[common], help="verify the hash chain (default: the latest run)"
    )
    v.add_argument("run", nargs="?")
    _box_options(v)
    v.set_defaults(func=cmd_audit)
    return parser


def _box_options(p: argparse.ArgumentParser) -> None:
    """How verify (and the export's header, which says what verify says) reaches the box."""
    p.add_argument(
        "--offline", action="store_true", help="do not consult the head kept on the run's box"
    )
    p.add_argument("--known-hosts", help="known_hosts file (default ~/.ssh/known_hosts)")
    p.add_argument("--ssh-config", help="ssh config file (default ~/.ssh/config)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
