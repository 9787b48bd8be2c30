"""A small synchronous client for the remote agent, driving `python -m remote_agent serve` over
pipes (the local transport). Used by the agent tests and by bench/bench_agent_logs.py.

Responses are matched by id; events are kept in arrival order (or handed to `on_event`).
Log data comes back to bytes with `text.encode("utf-8", "surrogateescape")`.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.paths import REPO


class AgentCallError(Exception):
    def __init__(self, type_: str, message: str) -> None:
        super().__init__(f"{type_}: {message}")
        self.type = type_
        self.message = message


def data_bytes(event_or_result: dict[str, Any]) -> bytes:
    return event_or_result["data"].encode("utf-8", "surrogateescape")


class AgentProc:
    def __init__(
        self,
        spool: Path,
        *,
        argv: list[str] | None = None,
        env: dict[str, str] | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        keep_raw: bool = False,
        pythonpath: bool = True,
    ) -> None:
        cmd = argv or [sys.executable, "-m", "remote_agent", "serve"]
        full_env = dict(os.environ if env is None else env)
        if pythonpath:  # the checkout's remote_agent (not needed for a zipapp)
            full_env["PYTHONPATH"] = str(REPO) + (
                os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else ""
            )
        self.proc = subprocess.Popen(
            [*cmd, "--spool", str(spool)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=REPO,
            env=full_env,
        )
        self.spool = spool
        self.on_event = on_event
        self.keep_raw = keep_raw
        self.raw: list[bytes] = []  # every stdout line, when keep_raw
        self.events: list[dict[str, Any]] = []
        self.garbage: list[bytes] = []  # stdout lines that are not JSON objects
        self.responses: dict[Any, dict[str, Any]] = {}
        self.unsolicited: list[dict[str, Any]] = []  # responses with id null
        self.eof = False
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._wlock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        # A large buffer: log events are lines of up to ~400 KiB (64 KiB of escaped bytes).
        stdout = os.fdopen(self.proc.stdout.fileno(), "rb", buffering=1 << 20, closefd=False)
        for line in stdout:
            if self.keep_raw:
                self.raw.append(line)
            try:
                msg = json.loads(line)
                assert isinstance(msg, dict)
            except (ValueError, AssertionError):
                self.garbage.append(line)  # the tests assert this stays empty
                continue
            if "event" in msg:
                if self.on_event is not None:
                    self.on_event(msg)
                    continue
                with self._cond:
                    self.events.append(msg)
                    self._cond.notify_all()
            else:
                with self._cond:
                    if msg.get("id") is None:
                        self.unsolicited.append(msg)
                    else:
                        self.responses[msg["id"]] = msg
                    self._cond.notify_all()
        with self._cond:
            self.eof = True
            self._cond.notify_all()

    # --- requests -----------------------------------------------------------------------------

    def send_line(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        with self._wlock:
            self.proc.stdin.write(line if line.endswith(b"\n") else line + b"\n")
            self.proc.stdin.flush()

    def request(self, op: str, args: dict[str, Any] | None = None, timeout: float = 30) -> dict:
        rid = next(self._ids)
        self.send_line(json.dumps({"id": rid, "op": op, "args": args or {}}).encode())
        return self.wait_response(rid, timeout)

    def wait_response(self, rid: Any, timeout: float = 30) -> dict[str, Any]:
        with self._cond:
            if not self._cond.wait_for(lambda: rid in self.responses or self.eof, timeout):
                raise TimeoutError(f"no response to request {rid} within {timeout}s")
            if rid not in self.responses:
                raise EOFError(f"agent closed its output before answering request {rid}")
            return self.responses.pop(rid)

    def call(self, op: str, timeout: float = 30, **args: Any) -> dict[str, Any]:
        resp = self.request(op, args, timeout)
        if not resp["ok"]:
            raise AgentCallError(resp["error"]["type"], resp["error"]["message"])
        return resp["result"]

    def hello(self) -> dict[str, Any]:
        return self.call("hello", protocol=1, client="tests")

    # --- events -------------------------------------------------------------------------------

    def wait_until(self, pred: Callable[[], bool], timeout: float = 30, what: str = "") -> None:
        """Wait until pred() (evaluated under the event lock) holds; events are in self.events."""
        with self._cond:
            if not self._cond.wait_for(pred, timeout):
                raise TimeoutError(f"condition not met within {timeout}s: {what}")

    def job_events(self, job_id: str) -> list[dict[str, Any]]:
        with self._cond:
            return [e for e in self.events if e.get("job_id") == job_id]

    def wait_job_end(self, job_id: str, timeout: float = 60) -> dict[str, Any]:
        def ended() -> bool:
            return any(e["event"] == "job_end" and e["job_id"] == job_id for e in self.events)

        self.wait_until(ended, timeout, f"job_end of {job_id}")
        return next(e for e in self.job_events(job_id) if e["event"] == "job_end")

    def watch_bytes(self, job_id: str, offset: int = 0, timeout: float = 60) -> tuple[bytes, dict]:
        """job.watch from offset to job_end; returns (bytes, job_end event)."""
        self.call("job.watch", job_id=job_id, offset=offset)
        end = self.wait_job_end(job_id, timeout)
        logs = [e for e in self.job_events(job_id) if e["event"] == "log"]
        return b"".join(data_bytes(e) for e in logs), end

    def wait_state(self, job_id: str, states: tuple[str, ...], timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            info = self.call("job.status", job_id=job_id)
            if info["state"] in states:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {info['state']} after {timeout}s")
            time.sleep(0.02)

    # --- lifecycle ----------------------------------------------------------------------------

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(10)

    def close(self, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self._reader.join(timeout)
        return self.proc.returncode

    def __enter__(self) -> AgentProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
