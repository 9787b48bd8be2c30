"""The request loop: JSON lines in on one fd, responses and events out on another.

Each request runs in its own thread (probes, cancels and log watches block), so one slow
request never stalls a `ping`. All output goes through one lock, one whole line at a time.
"""

from __future__ import annotations

import getpass
import logging
import os
import platform
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from remote_agent import __version__
from remote_agent.agent.driver_locks import DriverLocks
from remote_agent.agent.jobs import JobManager
from remote_agent.agent.logwatch import LogWatch, WatchRegistry
from remote_agent.agent.probes import CHECKS, run_probe
from remote_agent.agent.procs import boot_id
from remote_agent.agent.spool import Spool, check_job_id
from remote_agent.agent.stats import Stats
from remote_agent.wire.protocol import (
    MAX_LINE,
    PROTOCOL_VERSION,
    AgentError,
    Request,
    RequestError,
    arg_int,
    bad,
    encode,
    error_response,
    ok_response,
    parse_request,
)

log = logging.getLogger("remote_agent.server")

DRAIN_TIMEOUT_S = 30.0  # at EOF/shutdown, how long requests in flight may still take

Handler = Callable[[dict[str, Any]], Any]


@dataclass
class Streaming:
    """A result answered at once, followed by events produced by `run` in the same thread."""

    result: dict[str, Any]
    run: Callable[[], None]


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return str(os.getuid())


class Server:
    def __init__(self, spool: Spool, in_fd: int, out_fd: int) -> None:
        self.spool = spool
        self.in_fd = in_fd
        self.out_fd = out_fd
        self._out_lock = threading.Lock()
        self._inflight = 0  # requests not yet answered
        self._inflight_cond = threading.Condition()
        self.jobs = JobManager(spool)
        self.watches = WatchRegistry()
        self.stats = Stats(spool.root, self.emit)
        self.locks = DriverLocks(spool.root)
        self.ops: dict[str, Handler] = {
            "hello": self.op_hello,
            "ping": lambda args: {"t": time.time()},
            "job.start": self.jobs.start,
            "job.status": self.jobs.status,
            "job.list": self.jobs.list,
            "job.read": self.jobs.read,
            "job.watch": self.op_watch,
            "job.unwatch": self.op_unwatch,
            "job.cancel": self.jobs.cancel,
            "job.log_hash": self.jobs.log_hash,
            "probe": lambda args: run_probe(args.get("check")),
            "stats.sample": self.stats.op_sample,
            "stats.watch": self.stats.op_watch,
            "stats.unwatch": self.stats.op_unwatch,
            "stats.since": self.stats.op_since,
            "lock.acquire": self.locks.acquire,
            "lock.release": self.locks.release,
            "lock.status": self.locks.status,
            "audit.head_set": self.locks.head_set,
            "audit.head_get": self.locks.head_get,
        }

    # --- output ------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.out_fd, view) :]
        except OSError as e:
            # The client is gone (EPIPE): so is our reason to live. Bound jobs see the pipe
            # close and stop; detached ones carry on.
            log.warning("output closed (%s); exiting", e)
            os._exit(0)

    def send(self, obj: dict[str, Any]) -> None:
        try:
            data = encode(obj)
        except (TypeError, ValueError) as e:  # a bug in a handler must still get an answer
            log.exception("cannot encode response")
            data = encode(
                error_response(obj.get("id"), AgentError("internal", f"unencodable: {e}"))
            )
        with self._out_lock:
            self._write(data)

    def emit(self, event: dict[str, Any], stop: threading.Event | None = None) -> bool:
        """Write an event unless `stop` is set; checked under the lock, so no event of a
        watch goes out after the response to its unwatch."""
        data = encode(event)
        with self._out_lock:
            if stop is not None and stop.is_set():
                return False
            self._write(data)
        return True

    # --- loop --------------------------------------------------------------------------------

    def serve(self) -> int:
        reader = os.fdopen(self.in_fd, "rb", buffering=1 << 16, closefd=False)
        while True:
            line = reader.readline(MAX_LINE + 1)
            if not line:
                # stdin EOF: the client is done (or the channel is gone). Answer what is in
                # flight, so a client that half-closes after its last request gets its answer.
                self.locks.release_all()  # first: the driver is gone, its claim with it
                self._drain()
                return 0
            if len(line) > MAX_LINE and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n"):  # skip the rest of the monster
                    line = reader.readline(MAX_LINE)
                self.send(error_response(None, bad(f"request line longer than {MAX_LINE} bytes")))
                continue
            try:
                req = parse_request(line)
            except RequestError as e:
                self.send(error_response(e.id, e.error))
                continue
            if req.op == "shutdown":
                self.locks.release_all()
                self._drain()
                self.send(ok_response(req.id, {}))
                return 0
            with self._inflight_cond:
                self._inflight += 1
            threading.Thread(
                target=self._handle, args=(req,), name=f"req-{req.id}-{req.op}", daemon=True
            ).start()

    def _drain(self, timeout: float = DRAIN_TIMEOUT_S) -> None:
        self.watches.stop_all()
        with self._inflight_cond:
            self._inflight_cond.wait_for(lambda: self._inflight == 0, timeout)

    def _answered(self) -> None:
        with self._inflight_cond:
            self._inflight -= 1
            self._inflight_cond.notify_all()

    def _handle(self, req: Request) -> None:
        answered = False

        def answer(obj: dict[str, Any]) -> None:
            nonlocal answered
            try:
                self.send(obj)
            finally:
                answered = True
                self._answered()

        try:
            try:
                fn = self.ops.get(req.op)
                if fn is None:
                    known = ", ".join(sorted([*self.ops, "shutdown"]))
                    raise bad(f"unknown op {req.op!r} (known: {known})")
                result = fn(req.args)
            except AgentError as e:
                answer(error_response(req.id, e))
                return
            except Exception as e:
                log.exception("op %s failed", req.op)
                answer(error_response(req.id, AgentError("internal", f"{type(e).__name__}: {e}")))
                return
            if isinstance(result, Streaming):
                answer(ok_response(req.id, result.result))
                result.run()  # events; no longer "in flight" for shutdown/EOF
            else:
                answer(ok_response(req.id, result))
        except Exception:
            log.exception("request %s (%s)", req.id, req.op)
        finally:
            if not answered:
                self._answered()

    # --- ops ---------------------------------------------------------------------------------

    def op_hello(self, args: dict[str, Any]) -> dict[str, Any]:
        theirs = args.get("protocol")
        if theirs != PROTOCOL_VERSION or isinstance(theirs, bool):
            raise AgentError(
                "protocol",
                f"client speaks protocol {theirs!r}, this agent (remote_agent {__version__}) "
                f"speaks protocol {PROTOCOL_VERSION}",
            )
        return {
            "protocol": PROTOCOL_VERSION,
            "agent_version": __version__,
            "python": platform.python_version(),
            "hostname": socket.gethostname(),
            "user": _user(),
            "boot_id": boot_id(),
            "pid": os.getpid(),
            "spool": str(self.spool.root),
            "spool_id": self._spool_id(),
            "capabilities": sorted([*self.ops, "shutdown"])
            + [f"check:{c}" for c in sorted(CHECKS)]
            + ["stats.persisted", "job.tree_kill_session"],
        }

    def _spool_id(self) -> str:
        """The spool's id, made now if need be; a spool that cannot be written (a full disk,
        permissions) refuses the handshake for good, with the reason, instead of a crash
        that a client would retry forever."""
        try:
            self.spool.ensure()
            return self.spool.identity()
        except OSError as e:
            raise AgentError(
                "spool_unusable",
                f"the agent's spool {self.spool.root} cannot be written: {e.strerror or e}; "
                "make room there (or fix what is in the way), or give the host another "
                "`spool:` (EAGLE_TUI_SPOOL), then retry",
            ) from None

    def op_watch(self, args: dict[str, Any]) -> Streaming:
        jd = self.spool.existing_job(check_job_id(args.get("job_id")))
        offset = arg_int(args, "offset", 0)
        size = jd.log_size()
        if offset > size:
            raise bad(f"offset {offset} is past the end of the log ({size} bytes)")
        w = LogWatch(self.jobs, jd, offset, self.emit)
        self.watches.add(w)

        def run() -> None:
            try:
                w.run()
            finally:
                self.watches.remove(w)

        return Streaming({}, run)

    def op_unwatch(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"stopped": self.watches.stop(check_job_id(args.get("job_id")))}
