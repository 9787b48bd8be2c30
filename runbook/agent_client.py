"""Client of the remote agent's JSON-lines protocol (remote_agent/PROTOCOL.md), with a per-host
session that reconnects after a lost connection and resumes every log cursor.

`AgentConnection` is one live channel: requests with ids, responses matched to futures, events
dispatched to subscribers. `HostSession` owns the connection to one host: it connects lazily,
reconnects with exponential backoff and jitter (never for permanent errors such as a refused host
key), and re-issues calls that were cut by a disconnect. Every op is safe to repeat: `job.start`
answers `exists` on a repeat, which the engine treats as "already launched".
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections.abc import Awaitable, Callable
from typing import Any

from remote_agent.wire.protocol import PROTOCOL_VERSION, AgentError, text_to_bytes  # one contract
from runbook.transports import Endpoint, HostKeyRefusal, Transport, TransportError

CLIENT_NAME = "eagle-tui"
HELLO_TIMEOUT = 60.0  # the agent's first answer, the last connection phase


class ConnectionLost(Exception):
    pass


EventHandler = Callable[[dict[str, Any]], None]


class AgentConnection:
    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._handlers: list[EventHandler] = []
        self._reader_task: asyncio.Task | None = None
        self.closed = asyncio.Event()
        self.hello: dict[str, Any] = {}

    def start(self) -> None:
        self._reader_task = asyncio.ensure_future(self._read_loop())

    def subscribe(self, handler: EventHandler) -> Callable[[], None]:
        self._handlers.append(handler)
        return lambda: self._handlers.remove(handler) if handler in self._handlers else None

    async def _read_loop(self) -> None:
        try:
            while True:
                line = await self.channel.reader.readline()
                if not line:
                    break
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue  # not ours (e.g. a stray print on a remote login shell)
                if not isinstance(msg, dict):
                    continue
                if "event" in msg:
                    for handler in list(self._handlers):
                        handler(msg)
                    continue
                rid = msg.get("id")
                fut = self._pending.pop(rid, None) if isinstance(rid, int) else None
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        except (ConnectionError, asyncio.IncompleteReadError, OSError, ValueError):
            pass
        except asyncio.CancelledError:
            raise
        finally:
            self.closed.set()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionLost("connection to the agent was lost"))
            self._pending.clear()
            for handler in list(self._handlers):
                handler({"event": "_closed"})

    async def call(self, op: str, timeout: float | None = None, **args: Any) -> dict[str, Any]:
        if self.closed.is_set():
            raise ConnectionLost("connection to the agent is closed")
        rid = next(self._ids)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            self.channel.write((json.dumps({"id": rid, "op": op, "args": args}) + "\n").encode())
            await self.channel.drain()
        except (ConnectionError, OSError, RuntimeError) as exc:
            self._pending.pop(rid, None)
            raise ConnectionLost(str(exc)) from exc
        try:
            msg = await (asyncio.wait_for(fut, timeout) if timeout else fut)
        finally:
            self._pending.pop(rid, None)
        if msg.get("ok"):
            return msg.get("result") or {}
        err = msg.get("error") or {}
        raise AgentError(err.get("type", "internal"), err.get("message", "unknown error"))

    async def close(self) -> None:
        try:
            task = self._reader_task
            if task:
                task.cancel()
                # wait() never raises the reader's own end, and a cancel of this close still
                # reaches the caller (awaiting the task and catching CancelledError swallowed it)
                await asyncio.wait({task})
                if not task.cancelled():
                    task.exception()  # retrieved: how the reader ended is not this close's
        finally:  # the channel (the agent's process) is let go however this close ends
            try:
                await self.channel.close()
            finally:
                self.closed.set()


# state, attempt, message, and the refused host key when that is why it failed
StatusCallback = Callable[[str, int, str | None, HostKeyRefusal | None], None]


class HostSession:
    """The engine's handle on one host. Survives disconnects; see module docstring."""

    def __init__(
        self,
        name: str,
        transport: Transport,
        on_status: StatusCallback | None = None,
        max_backoff: float = 30.0,
        max_attempts: int | None = None,
    ) -> None:
        self.name = name
        self.transport = transport
        self.on_status = on_status or (lambda *a: None)
        self.max_backoff = max_backoff
        self.max_attempts = max_attempts
        self.conn: AgentConnection | None = None
        self._connect_lock = asyncio.Lock()
        self._event_handlers: list[EventHandler] = []
        self.hello: dict[str, Any] = {}
        self.reconnects = 0
        self.last_error: str | None = None  # the latest failed attempt's one line
        self._closing = False
        # run on every new connection before it is used (the engine's driver claim)
        self.on_connect: list[Callable[[AgentConnection], Awaitable[None]]] = []

    @property
    def endpoint(self) -> Endpoint:
        return self.transport.endpoint

    def subscribe(self, handler: EventHandler) -> Callable[[], None]:
        """Events from every connection this session will have (handlers survive reconnects)."""
        self._event_handlers.append(handler)
        if self.conn is not None:
            self.conn.subscribe(handler)
        return lambda: self._unsubscribe(handler)

    def _unsubscribe(self, handler: EventHandler) -> None:
        if handler in self._event_handlers:
            self._event_handlers.remove(handler)
        if self.conn is not None and handler in self.conn._handlers:
            self.conn._handlers.remove(handler)

    @property
    def connected(self) -> bool:
        return self.conn is not None and not self.conn.closed.is_set()

    @property
    def connecting(self) -> bool:
        """Another caller is (re)connecting right now (and may retry for a long time)."""
        return self._connect_lock.locked()

    async def connection(self, attempts: int | None = None) -> AgentConnection:
        """The live connection; `attempts` bounds this call's tries (default: the session's
        `max_attempts`, None: until it connects or fails permanently)."""
        if self.conn is not None and not self.conn.closed.is_set():
            return self.conn
        self._refuse_if_closing()
        async with self._connect_lock:
            if self.conn is not None and not self.conn.closed.is_set():
                return self.conn
            self._refuse_if_closing()
            self.conn = await self._connect_with_retry(attempts or self.max_attempts)
            return self.conn

    def _refuse_if_closing(self) -> None:
        """No new connection once close() began: nothing would close it (a follow or a stats
        loop that sees the agent's goodbye must not start a new agent)."""
        if self._closing:
            raise ConnectionLost(f"{self.name}: the session is closed")

    async def _connect_once(self) -> AgentConnection:
        channel = await self.transport.open()
        conn = AgentConnection(channel)
        conn.start()
        try:
            hello = await conn.call(
                "hello", timeout=HELLO_TIMEOUT, protocol=PROTOCOL_VERSION, client=CLIENT_NAME
            )
        except asyncio.CancelledError:  # e.g. the app ends while opening: let the agent go
            await conn.close()
            raise
        except AgentError as exc:
            await conn.close()
            raise TransportError(
                f"agent handshake failed: {exc.message}",
                permanent=exc.type in ("protocol", "spool_unusable"),
            ) from exc
        except (ConnectionLost, asyncio.TimeoutError) as exc:
            await conn.close()
            why = f"within {HELLO_TIMEOUT:g} s" if isinstance(exc, asyncio.TimeoutError) else exc
            raise TransportError(
                f"{self.name}: agent start: the agent did not answer its handshake {why}"
            ) from exc
        conn.hello = self.hello = hello
        for handler in self._event_handlers:
            conn.subscribe(handler)
        try:
            for hook in self.on_connect:
                await hook(conn)
            self._refuse_if_closing()  # closed meanwhile: this connection would outlive it
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _connect_with_retry(self, max_attempts: int | None) -> AgentConnection:
        attempt = 0
        first = self.conn is None
        while True:
            attempt += 1
            state = "connecting" if first else "reconnecting"
            self.on_status(state, attempt, None, None)
            try:
                conn = await self._connect_once()
            except TransportError as exc:
                self.last_error = str(exc)
                if exc.permanent or self._closing:
                    self.on_status("failed", attempt, str(exc), exc.host_key)
                    raise
                if max_attempts is not None and attempt >= max_attempts:
                    self.on_status("failed", attempt, str(exc), exc.host_key)
                    raise
                delay = min(self.max_backoff, 0.5 * 2 ** min(attempt - 1, 10))
                delay *= 0.5 + random.random()  # jitter: many clients must not retry in lockstep
                self.on_status(state, attempt, f"{exc}; retrying in {delay:.1f}s", None)
                await asyncio.sleep(delay)
                continue
            if not first:
                self.reconnects += 1
            self.last_error = None
            self.on_status("connected", attempt, None, None)
            return conn

    async def call(self, op: str, timeout: float | None = None, **args: Any) -> dict[str, Any]:
        """Call `op`, reconnecting and repeating it if the connection drops mid-call."""
        while True:
            conn = await self.connection()
            try:
                return await conn.call(op, timeout=timeout, **args)
            except ConnectionLost:
                if self._closing:
                    raise
                continue

    async def follow_job(
        self,
        job_id: str,
        offset: int,
        on_data: Callable[[int, int, bytes], Awaitable[None] | None],
    ) -> dict[str, Any]:
        """Stream a job's log from `offset` until it ends; survives reconnects.

        `on_data(offset, next_offset, data)` is called in order, exactly once per byte range;
        returns the job_end event (with `exit` and `log_size`).
        """
        cursor = offset
        while True:
            conn = await self.connection()
            queue: asyncio.Queue = asyncio.Queue()

            def handler(msg: dict[str, Any], q: asyncio.Queue = queue) -> None:
                if msg.get("event") == "_closed" or msg.get("job_id") == job_id:
                    q.put_nowait(msg)

            unsubscribe = conn.subscribe(handler)
            try:
                try:
                    await conn.call("job.watch", job_id=job_id, offset=cursor)
                except ConnectionLost:
                    continue
                while True:
                    msg = await queue.get()
                    ev = msg.get("event")
                    if ev == "_closed":
                        break  # reconnect and watch again from the cursor
                    if ev == "log":
                        start, end = int(msg["offset"]), int(msg["next_offset"])
                        if end <= cursor:
                            continue  # already delivered (a watch racing a reconnect)
                        data = text_to_bytes(msg.get("data", ""))
                        if start < cursor:  # overlap: keep only the new bytes
                            data = data[cursor - start :]
                            start = cursor
                        if start != cursor:
                            raise AgentError(
                                "protocol",
                                f"log gap for {job_id}: expected offset {cursor}, got {start}",
                            )
                        result = on_data(start, end, data)
                        if asyncio.iscoroutine(result):
                            await result
                        cursor = end
                    elif ev == "job_end":
                        size = int(msg.get("log_size", cursor))
                        while cursor < size:  # by protocol never needed; cheap insurance
                            chunk = await conn.call("job.read", job_id=job_id, offset=cursor)
                            data = text_to_bytes(chunk.get("data", ""))
                            if not data:
                                break
                            end = int(chunk["next_offset"])
                            result = on_data(cursor, end, data)
                            if asyncio.iscoroutine(result):
                                await result
                            cursor = end
                        return msg
            finally:
                unsubscribe()
                if conn is not None and not conn.closed.is_set():
                    try:
                        await conn.call("job.unwatch", timeout=10, job_id=job_id)
                    except (AgentError, ConnectionLost, asyncio.TimeoutError):
                        pass

    async def close(self) -> None:
        """Say goodbye to the agent, then let go of the connection and the transport, also
        when this close is cancelled (the app ending mid-close): a connection or an agent
        process left open is finalized after its event loop has closed."""
        self._closing = True
        try:
            if self.conn is not None:
                try:
                    await asyncio.wait_for(self.conn.call("shutdown"), 5)
                except (AgentError, ConnectionLost, asyncio.TimeoutError, Exception):
                    pass
        finally:
            try:
                if self.conn is not None:
                    await self.conn.close()
            finally:
                await self.transport.close()
