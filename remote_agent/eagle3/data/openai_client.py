"""A small, thread-safe client for OpenAI-compatible `/v1/chat/completions` (stdlib only).

One keep-alive connection per thread and endpoint. Retried, with exponential backoff and jitter
(and the server's Retry-After when it sends one): 429, every 5xx, timeouts, refused/reset/dropped
connections and unreadable bodies. 401/403 are fatal for the whole run (a wrong key fails every
request); other 4xx fail the request at once. The API key only ever goes into the Authorization
header; every message that leaves this module has it redacted.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from remote_agent.eagle3.http_client import HttpClient, backoff_delay, retry_after_seconds

RETRY_STATUS = frozenset({408, 409, 425, 429}) | frozenset(range(500, 600))
FATAL_STATUS = frozenset({401, 403})


class RequestFailed(Exception):
    """The request failed for good (retries exhausted or a non-retryable answer)."""


class FatalRequestError(RequestFailed):
    """Every request will fail the same way (bad key, no access): stop the run."""


@dataclass(frozen=True)
class Completion:
    content: str
    reasoning: str | None
    finish_reason: str | None
    usage: dict[str, Any]


@dataclass
class ClientStats:
    requests: int = 0
    retries: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


def chat_endpoint(url: str, timeout: float) -> HttpClient:
    """`http(s)://host[:port]/v1` (or the full `.../chat/completions`), one keep-alive
    connection per thread."""
    if not url.rstrip("/").endswith("/chat/completions"):
        url = url.rstrip("/") + "/chat/completions"
    return HttpClient(url, timeout, keep_alive=True)


class ChatClient:
    def __init__(
        self,
        endpoints: list[str],
        model: str,
        api_key: str | None = None,
        timeout: float = 600.0,
        retries: int = 6,
        backoff: float = 1.0,
        backoff_max: float = 60.0,
        params: dict[str, Any] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.endpoints = [chat_endpoint(u, timeout) for u in endpoints]
        self.model = model
        self._key = api_key or None
        self.timeout = timeout
        self.retries = retries
        self.backoff, self.backoff_max = backoff, backoff_max
        self.params = dict(params or {})
        self.stats = ClientStats()
        self._lock = threading.Lock()
        self._next = 0
        self._rng = rng or random.Random()

    # -- public --------------------------------------------------------------------------------

    def complete(self, messages: list[dict[str, Any]]) -> Completion:
        body = json.dumps({"model": self.model, "messages": messages, **self.params}).encode()
        last = "no attempt"
        for attempt in range(self.retries + 1):
            endpoint = self._pick()
            retry_after: float | None = None
            try:
                status, headers, data = self._post(endpoint, body)
            except TimeoutError:
                last, reason = f"timed out after {self.timeout:g}s", "timeout"
            except (http.client.HTTPException, ConnectionError, OSError) as exc:
                last, reason = f"connection error: {type(exc).__name__}: {exc}", "connection"
            else:
                if status == 200:
                    try:
                        return _parse_completion(data)
                    except ValueError as exc:
                        last, reason = f"unreadable response: {exc}", "bad_response"
                elif status in FATAL_STATUS:
                    raise FatalRequestError(
                        self.redact(
                            f"{endpoint}: HTTP {status}: {_snippet(data)} (check the API key)"
                        )
                    )
                elif status in RETRY_STATUS:
                    last, reason = f"HTTP {status}: {_snippet(data)}", f"http_{status}"
                    retry_after = retry_after_seconds(headers.get("retry-after"))
                else:
                    raise RequestFailed(self.redact(f"{endpoint}: HTTP {status}: {_snippet(data)}"))
            self._count(reason, retried=attempt < self.retries)
            if attempt < self.retries:
                delay = backoff_delay(
                    attempt, self.backoff, self.backoff_max, retry_after, self._rng
                )
                time.sleep(delay)
        raise RequestFailed(self.redact(f"gave up after {self.retries + 1} attempts; last: {last}"))

    def redact(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text

    def close(self) -> None:
        for ep in self.endpoints:
            ep.close()

    # -- internals -----------------------------------------------------------------------------

    def _pick(self) -> HttpClient:
        with self._lock:
            endpoint = self.endpoints[self._next % len(self.endpoints)]
            self._next += 1
            return endpoint

    def _count(self, reason: str, retried: bool) -> None:
        with self._lock:
            self.stats.by_reason[reason] = self.stats.by_reason.get(reason, 0) + 1
            self.stats.retries += retried

    def _post(self, ep: HttpClient, body: bytes) -> tuple[int, http.client.HTTPMessage, bytes]:
        headers = {"Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        with self._lock:
            self.stats.requests += 1
        resp = ep.send("POST", "", body, headers)
        return resp.status, resp.headers, resp.body


def _parse_completion(data: bytes) -> Completion:
    obj = json.loads(data)
    if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list) or not obj["choices"]:
        raise ValueError("no 'choices' in the response")
    choice = obj["choices"][0]
    msg = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(msg, dict):
        raise ValueError("no 'message' in the first choice")
    content = msg.get("content") or ""
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")  # SGLang / OpenRouter names
    if not isinstance(content, str) or (reasoning is not None and not isinstance(reasoning, str)):
        raise ValueError("'content'/'reasoning_content' must be strings")
    usage = obj.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return Completion(content, reasoning or None, choice.get("finish_reason"), usage)


def _snippet(data: bytes) -> str:
    return data[:200].decode("utf-8", "replace").replace("\n", " ")
