"""The `local` transport: the agent as a subprocess over pipes (the embedded default)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from runbook.transports import Endpoint, TransportError

STREAM_LIMIT = 64 << 20  # a log event can carry 64 KiB of escaped text


# What the agent (and so every job and probe) may inherit from the client's environment: no API
# keys or tokens; a job gets a secret only through its step's declared `env`.
_KEEP = {
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "TERM",
    "SHELL",
    "HF_HOME",
}
_KEEP_PREFIXES = ("LC_", "EAGLE_TUI_", "CUDA_", "XDG_")


def scrubbed_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k in _KEEP or k.startswith(_KEEP_PREFIXES)}


CLOSE_GRACE_S = 5.0  # the agent's own exit after EOF on its stdin, then it is killed
_KILL_WAITS = 3  # waits of CLOSE_GRACE_S after a kill before giving up on the reap


class _ProcessChannel:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        assert proc.stdout is not None and proc.stdin is not None
        self.reader = proc.stdout
        self._stdin = proc.stdin
        self.reaped = False

    def write(self, data: bytes) -> None:
        self._stdin.write(data)

    async def drain(self) -> None:
        await self._stdin.drain()

    async def close(self) -> None:
        """Let the agent go and reap it: EOF on its stdin, then its exit (killed after
        CLOSE_GRACE_S) and the end of both pipes. Neither the process nor a pipe transport may
        outlive the event loop: their finalizers would run on a closed loop ("Event loop is
        closed", at worst at interpreter teardown). The exit alone is not enough, it can be known
        before the pipes have closed. A cancel (the app ending, a timeout around the close) kills
        the agent and is re-raised once it is reaped. Safe to call again."""
        try:
            self._stdin.close()
        except (BrokenPipeError, ConnectionResetError, RuntimeError):
            pass
        cancelled = False
        for _ in range(1 + _KILL_WAITS):
            try:
                await asyncio.wait_for(self._ended(), CLOSE_GRACE_S)
                self.reaped = True
                break
            except asyncio.TimeoutError:
                pass
            except asyncio.CancelledError:
                cancelled = True
            self._kill()
        if cancelled:
            raise asyncio.CancelledError

    async def _ended(self) -> None:
        """The process has exited and both its pipes are closed (stdout read to its end)."""
        await self.proc.wait()
        try:
            await self._stdin.wait_closed()
        except OSError:  # it closed with an error (a broken pipe): closed all the same
            pass
        try:
            await self.reader.read()
        except (OSError, RuntimeError, ValueError):  # lost with an error, or read elsewhere
            pass

    def _kill(self) -> None:
        if self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass


class LocalTransport:
    def __init__(
        self, spool: Path, agent_log: Path | None = None, python: str | None = None
    ) -> None:
        self.spool = Path(spool)
        self.agent_log = agent_log
        self.python = python or sys.executable
        self.endpoint = Endpoint("local", "local")
        self.channels: list[_ProcessChannel] = []  # every agent it started, until reaped

    async def open(self) -> _ProcessChannel:
        repo_root = str(Path(__file__).resolve().parents[2])
        env = scrubbed_env(os.environ)
        env["PYTHONPATH"] = repo_root + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
        )
        stderr = open(self.agent_log, "ab") if self.agent_log else asyncio.subprocess.DEVNULL
        try:
            proc = await asyncio.create_subprocess_exec(
                self.python,
                "-m",
                "remote_agent",
                "serve",
                "--spool",
                str(self.spool),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env=env,
                limit=STREAM_LIMIT,
                start_new_session=True,
            )
        except OSError as exc:
            raise TransportError(
                f"cannot start the local agent with {self.python}: {exc}", permanent=True
            ) from exc
        finally:
            if not isinstance(stderr, int):  # our log file, not DEVNULL
                stderr.close()
        channel = _ProcessChannel(proc)
        self.channels = [c for c in self.channels if not c.reaped] + [channel]
        return channel

    async def close(self) -> None:
        """Reap every agent this transport started and nobody closed (e.g. one whose open was
        cancelled mid-handshake): none may outlive the loop."""
        channels, self.channels = self.channels, []
        # together: a cancel reaches every close, and each reaps its agent before it ends
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)
