"""The payload's one HTTP client and one backoff (stdlib only: httpx would remove no code here).

Used by the OpenAI-compatible client (regenerate), the extraction client (SGLang `/generate`,
`/server_info`) and the serving checks (serve-check, accept). A reply that does not finish
within the timeout, including one trickled byte by byte, is a TimeoutError.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class HttpError(Exception):
    """No 2xx answer. `status` is None when no answer came at all (refused, reset, timeout)."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Response:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


class HttpClient:
    """One base URL. `keep_alive`: one connection per thread, dropped on any error or on the
    server's `Connection: close`; otherwise a fresh connection per request (no state to go stale).
    """

    def __init__(
        self,
        url: str,
        timeout: float = 600.0,
        headers: dict[str, str] | None = None,
        keep_alive: bool = False,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url}: expected http(s)://HOST[:PORT][/PATH]")
        self.scheme, self.host = parts.scheme, parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.url = f"{parts.scheme}://{parts.netloc}"
        self.base = parts.path.rstrip("/")
        self.timeout = timeout
        self.headers = dict(headers or {})
        self.keep_alive = keep_alive
        self._local = threading.local()

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.base}"

    def send(
        self,
        method: str,
        path: str = "",
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Response:
        """Any status comes back; transport failures raise (OSError, HTTPException, Timeout)."""
        timeout = timeout or self.timeout
        conn = self._connection(timeout)
        hdrs = {**self.headers, **(headers or {})}
        if body is not None:
            hdrs.setdefault("Content-Type", "application/json")
        deadline = time.monotonic() + timeout
        try:
            conn.request(method, self.base + path, body=body, headers=hdrs)
            resp = conn.getresponse()
            data = resp.read()
            if time.monotonic() > deadline:  # the socket timeout is per read, not per reply
                raise TimeoutError(f"no complete reply within {timeout:g}s")
        except BaseException:
            self._drop(conn)
            raise
        if not self.keep_alive or resp.getheader("connection", "").lower() == "close":
            self._drop(conn)
        return Response(resp.status, resp.headers, data)

    def request(
        self, method: str, path: str = "", payload: Any = None, timeout: float | None = None
    ) -> Any:
        """JSON in, JSON out (text when the reply is not JSON, None when empty); raises
        HttpError for anything but a 2xx answer."""
        data = None if payload is None else json.dumps(payload).encode()
        where = f"{method} {self.url}{self.base}{path}"
        try:
            resp = self.send(method, path, data, timeout=timeout)
        except (OSError, http.client.HTTPException) as exc:
            raise HttpError(None, f"{where}: {type(exc).__name__}: {exc}") from None
        if not 200 <= resp.status < 300:
            text = resp.body[:500].decode("utf-8", "replace")
            raise HttpError(resp.status, f"{where}: HTTP {resp.status}: {text}")
        try:
            return json.loads(resp.body) if resp.body else None
        except ValueError:
            return resp.body.decode("utf-8", "replace")

    def get(self, path: str = "", timeout: float | None = None) -> Any:
        return self.request("GET", path, timeout=timeout)

    def post(self, path: str, payload: Any, timeout: float | None = None) -> Any:
        return self.request("POST", path, payload, timeout=timeout)

    def close(self) -> None:
        """Closes this thread's kept-alive connection (other threads keep theirs)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            self._drop(conn)

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None) if self.keep_alive else None
        if conn is None:
            cls = (
                http.client.HTTPSConnection
                if self.scheme == "https"
                else http.client.HTTPConnection
            )
            conn = cls(self.host, self.port, timeout=timeout)
            if self.keep_alive:
                self._local.conn = conn
        elif conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        conn.close()


def backoff_delay(
    attempt: int,
    base: float = 1.0,
    cap: float = 60.0,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before retry `attempt + 1`: exponential, capped, with "equal jitter"
    (half fixed, half random, so clients that failed together do not retry together); never
    shorter than the server's Retry-After (itself capped)."""
    full = min(cap, base * (2**attempt))
    delay = full / 2 + (rng or random).uniform(0, full / 2)
    if retry_after is not None:
        delay = max(delay, min(retry_after, cap))
    return delay


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header in seconds; None for none or an HTTP date (use our own backoff)."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
