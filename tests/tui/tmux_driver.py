"""A small tmux driver for end-to-end tests: a private server socket (`tmux -L`), a fixed-size
window running a plain shell, keys in, screen text out, and condition waits with timeouts."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def cockpit_argv(runbook: Path, tmp_path: Path, *extra: str) -> list[str]:
    """`eagle-tui run RUNBOOK` on the local box with the test's state dir and work dir."""
    argv = [sys.executable, "-m", "eagle_tui.cli", "run", str(runbook)]
    argv += ["--state-dir", str(tmp_path / "state"), "--host", "local"]
    sets = (
        f"work={tmp_path / 'work'}",
        f"python={sys.executable}",
        f"job={HERE / 'runbooks' / 'train_job.py'}",
    )
    for s in sets:
        argv += ["--set", s]
    return argv + list(extra)


def gate_line(work: Path) -> str:
    """A pattern for train_job.py's gate line (`waiting for <work>/release`) on the screen. The
    live log cuts a line at the pane's edge (it scrolls sideways, it does not wrap), and under
    xdist the tmp path is longer (`popen-gwN/`), so `release` may be cut off: match the line's
    start and the start of this test's own work dir."""
    return "waiting for " + re.escape(str(work)[:16])


def terminal_env(tmp_path: Path) -> dict[str, str]:
    """A clean terminal for the app: this test's spool and config, no animations."""
    return {
        "TERM": "xterm-256color",
        "TEXTUAL_ANIMATIONS": "none",
        "EAGLE_TUI_SPOOL": os.environ["EAGLE_TUI_SPOOL"],
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PS1": "$ ",
    }


class TmuxDriver:
    def __init__(
        self, name: str, cwd: Path, env: dict[str, str], size: tuple[int, int] = (160, 50)
    ) -> None:
        self.socket = f"eagle-tui-{name}-{os.getpid()}"
        self.session = "e2e"
        self.cwd = cwd
        self.env = env
        self.size = size

    @staticmethod
    def available() -> bool:
        return shutil.which("tmux") is not None

    def tmux(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def start(self) -> None:
        w, h = self.size
        env_args = [a for k, v in self.env.items() for a in ("-e", f"{k}={v}")]
        self.tmux(
            "new-session",
            "-d",
            "-s",
            self.session,
            "-x",
            str(w),
            "-y",
            str(h),
            "-c",
            str(self.cwd),
            *env_args,
            "bash --norc --noprofile",
        )
        # escape-time 0: Escape is not held back 500 ms; remain-on-exit: the last screen stays
        self.tmux("set-option", "-s", "escape-time", "0")
        self.tmux("set-option", "-g", "remain-on-exit", "on")
        self.tmux("set-option", "-g", "history-limit", "5000")

    def stop(self) -> None:
        self.tmux("kill-server", check=False)

    def run(self, argv: list[str]) -> None:
        """Type a command line into the shell (not the TUI) and run it; its exit code is echoed."""
        self.send_text(shlex.join(argv) + "; echo EXIT=$?")
        self.keys("Enter")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", self.session, *keys)

    def send_text(self, text: str) -> None:
        self.tmux("send-keys", "-t", self.session, "-l", text)

    def paste(self, text: str) -> None:
        """Bracketed paste: a long string arrives whole instead of as keystrokes."""
        self.tmux("set-buffer", "-b", "e2e", text)
        self.tmux("paste-buffer", "-p", "-d", "-b", "e2e", "-t", self.session)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.session)

    def wait_for(self, pattern: str, timeout: float = 30.0, poll: float = 0.1) -> re.Match:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.screen()
            m = rx.search(text)
            if m:
                return m
            time.sleep(poll)
        raise AssertionError(
            f"screen never showed {pattern!r} within {timeout}s; last screen:\n{text}"
        )

    def wait_until(self, cond, what: str, timeout: float = 30.0, poll: float = 0.1) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            time.sleep(poll)
        raise AssertionError(f"timed out waiting for {what}; last screen:\n{self.screen()}")
