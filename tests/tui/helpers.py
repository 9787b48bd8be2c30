"""Shared helpers for the cockpit tests: build the app on a test runbook with a private state
dir and spool, collect engine events, and wait on conditions (never fixed sleeps)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle_tui.app.app import CockpitApp
from eagle_tui.app.launch import build_app
from eagle_tui.cli import build_parser
from runbook.events import Event, StepChanged
from runbook.loader import parse_overrides

HERE = Path(__file__).resolve().parent
RUNBOOKS = HERE / "runbooks"
JOB = RUNBOOKS / "train_job.py"
SIZE = (160, 50)


@dataclass
class Env:
    root: Path
    runbook: Path
    host: str = "local"
    extra_sets: list[str] = field(default_factory=list)

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def work(self) -> Path:
        return self.root / "work"

    def argv(self, *extra: str) -> list[str]:
        sets = [f"work={self.work}", f"python={sys.executable}", f"job={JOB}", *self.extra_sets]
        out = ["run", str(self.runbook), "--state-dir", str(self.state), "--host", self.host]
        for s in sets:
            out += ["--set", s]
        return out + list(extra)

    def run_to_the_end(self) -> None:
        """The whole runbook headless (`--auto --yes`, a real process), as the night before a
        reopen: the cockpit then opens a finished run."""
        argv = [sys.executable, "-m", "eagle_tui.cli", *self.argv("--auto", "--yes", "--quiet")]
        assert subprocess.run(argv, capture_output=True, timeout=120).returncode == 0

    def app(self, *extra: str, **kw: Any) -> CockpitApp:
        args = build_parser().parse_args(self.argv(*extra))
        return quiet(
            build_app(
                args,
                self.state,
                parse_overrides(args.set or []),
                {},
                keymap_paths=kw.pop("keymap_paths", []),
                **kw,
            )
        )


class Events:
    """Every engine event, in order (a listener beside the app's)."""

    def __init__(self, app: CockpitApp) -> None:
        self.items: list[Event] = []
        app.engine.listeners.append(self.items.append)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.items if isinstance(e, kind)]

    def statuses(self, sid: str) -> list[str]:
        return [e.status for e in self.of(StepChanged) if e.step_id == sid]


def quiet(app: CockpitApp) -> CockpitApp:
    """No animations: TEXTUAL_ANIMATIONS is read when textual is imported, which the snapshot
    plugin does before any conftest runs, so set the app's level directly."""
    app.animation_level = "none"
    return app


async def wait_for(
    pilot: Any, cond: Callable[[], Any], timeout: float = 45.0, what: str = ""
) -> Any:
    """Let the app run until `cond()` is truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            app = pilot.app
            notes = [n.message for n in app._notifications]
            raise AssertionError(
                f"timed out waiting for {what or cond}; screen={app.screen!r}; notifications={notes}"
            )
        await pilot.pause(0.02)


async def opened(pilot: Any) -> None:
    await wait_for(pilot, lambda: pilot.app.opened, what="the run to open")


def status(app: CockpitApp, sid: str) -> str | None:
    rec = app.record(sid)
    return rec.status if rec else None


async def settle(app: CockpitApp) -> None:
    await asyncio.sleep(0)


def log_lines(app: CockpitApp) -> list[str]:
    from eagle_tui.app.widgets.logs.live_log import LiveLog

    log = app.main.query_one(LiveLog)
    return list(log.lines)


async def type_confirmation(pilot: Any, text: str) -> None:
    """Wait for the typed-confirmation modal's input to have focus, then type `text` + Enter."""
    from eagle_tui.app.screens.confirm import ConfirmScreen

    app = pilot.app
    await wait_for(
        pilot,
        lambda: (
            isinstance(app.screen, ConfirmScreen)
            and app.focused is not None
            and app.focused.id == "confirm-input"
        ),
        what="the confirmation input",
    )
    await pilot.press(*text, "enter")
