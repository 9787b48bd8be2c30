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


class _ProcessChannel:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        assert proc.stdout is not None and proc.stdin is not None
        self.reader = proc.stdout
        self._stdin = proc.stdin

    def write(self, data: bytes) -> None:
        self._stdin.write(data)

    async def drain(self) -> None:
        await self._stdin.drain()

    async def close(self) -> None:
        if self.proc.returncode is None:
            try:
                self._stdin.close()
            except (BrokenPipeError, ConnectionResetError, RuntimeError):
                pass
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()


class LocalTransport:
    def __init__(
        self, spool: Path, agent_log: Path | None = None, python: str | None = None
    ) -> None:
        self.spool = Path(spool)
        self.agent_log = agent_log
        self.python = python or sys.executable
        self.endpoint = Endpoint("local", "local")
        self.processes: list[asyncio.subprocess.Process] = []

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
        self.processes.append(proc)
        return _ProcessChannel(proc)

    async def close(self) -> None:
        self.processes = [p for p in self.processes if p.returncode is None]
