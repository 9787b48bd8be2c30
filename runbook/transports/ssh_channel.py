"""The agent's SSH channel as the engine's `Channel`: stdout into an asyncio.StreamReader (with
flow control back onto the channel), stderr into a local log, writes with drain."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

import asyncssh
from asyncssh.constants import EXTENDED_DATA_STDERR


class AgentSession(asyncssh.SSHClientSession):
    """Feeds the agent's stdout into an asyncio.StreamReader (with flow control back onto the
    channel) and its stderr into a local log; remembers how the agent ended."""

    def __init__(self, reader: asyncio.StreamReader, stderr_log: Path | None) -> None:
        self.reader = reader
        self.stderr_log = stderr_log
        self.stderr_tail: collections.deque[bytes] = collections.deque(maxlen=64)
        self.stdout_bytes = 0
        self.exit_status: int | None = None
        self.exit_signal: str | None = None
        self.closed = asyncio.Event()
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.chan: Any = None

    # asyncio.StreamReader pauses its "transport" when its buffer grows: map that to the channel
    def pause_reading(self) -> None:
        self.chan.pause_reading()

    def resume_reading(self) -> None:
        self.chan.resume_reading()

    def connection_made(self, chan: Any) -> None:
        self.chan = chan
        self.reader.set_transport(self)  # type: ignore[arg-type]

    def data_received(self, data: bytes, datatype: Any) -> None:
        if datatype == EXTENDED_DATA_STDERR:
            self.stderr_tail.append(data[-512:])
            if self.stderr_log is not None:
                try:
                    with open(self.stderr_log, "ab") as f:
                        f.write(data)
                except OSError:
                    pass
            return
        self.stdout_bytes += len(data)
        if not self.reader.at_eof():
            self.reader.feed_data(data)

    def eof_received(self) -> bool:
        if not self.reader.at_eof():
            self.reader.feed_eof()
        return False

    def exit_status_received(self, status: int) -> None:
        self.exit_status = status

    def exit_signal_received(self, signal: str, core_dumped: bool, msg: str, lang: str) -> None:
        self.exit_signal = signal

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.reader.at_eof():
            self.reader.feed_eof()
        self.closed.set()
        self.can_write.set()

    def stderr_text(self) -> str:
        text = b"".join(self.stderr_tail).decode("utf-8", "replace").strip()
        return text[-1500:]


class SshChannel:
    """The `Channel` the engine's AgentConnection reads lines from and writes requests to."""

    def __init__(self, session: AgentSession) -> None:
        self.session = session
        self.reader = session.reader

    def write(self, data: bytes) -> None:
        if self.session.closed.is_set():
            raise ConnectionResetError("the agent's SSH channel is closed")
        self.session.chan.write(data)

    async def drain(self) -> None:
        await self.session.can_write.wait()
        if self.session.closed.is_set():
            raise ConnectionResetError("the agent's SSH channel is closed")

    async def close(self) -> None:
        chan = self.session.chan
        if self.session.closed.is_set():
            return
        try:
            chan.write_eof()  # the agent exits at stdin EOF, after answering what is in flight
            await asyncio.wait_for(self.session.closed.wait(), 5)
        except (asyncio.TimeoutError, OSError, asyncssh.Error):
            pass
        chan.close()
