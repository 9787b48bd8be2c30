"""Attacks on the payload's one HTTP client (remote_agent/eagle3/http_client.py) with a real
http.server on 127.0.0.1: trickled replies, dropped connections, error statuses, a closed port,
keep-alive reuse; and the one backoff's bounds. The three transports now share this client, so
these trials cover regenerate, extraction and serve-check/accept at once."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from remote_agent.eagle3.data.openai_client import ChatClient, RequestFailed
from remote_agent.eagle3.errors import Failed
from remote_agent.eagle3.extraction.server import Http
from remote_agent.eagle3.http_client import HttpClient, HttpError, backoff_delay
from remote_agent.eagle3.serving.checks import http_json


class Server:
    """Answers by path: /ok (JSON), /status/N, /trickle (one byte per 0.2 s), /drop (closes
    without a status line), /close (answers with Connection: close). Counts TCP connections."""

    def __init__(self) -> None:
        self.connections = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive

            def log_message(self, *args):
                pass

            def setup(self):
                super().setup()
                outer.connections += 1

            def _reply(self, status: int, obj, close: bool = False) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if close:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._route()

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                self.body = self.rfile.read(n)
                self._route()

            def _route(self):
                if self.path.startswith("/status/"):
                    return self._reply(int(self.path.rsplit("/", 1)[1]), {"error": "injected"})
                if self.path == "/trickle":
                    self.send_response(200)
                    self.send_header("Content-Length", "20")
                    self.end_headers()
                    for _ in range(20):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(0.2)
                    return
                if self.path == "/drop":
                    self.close_connection = True
                    return
                if self.path == "/close":
                    return self._reply(200, {"ok": True}, close=True)
                if self.path.endswith("/chat/completions"):
                    msg = {"role": "assistant", "content": "hi"}
                    return self._reply(200, {"choices": [{"message": msg}]})
                self._reply(200, {"ok": True, "path": self.path})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.stop()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_statuses_and_json(server, tally) -> None:
    client = HttpClient(server.url, timeout=5)
    assert tally.trial("http: 2xx JSON parsed", client.get("/ok") == {"ok": True, "path": "/ok"})
    for status in (400, 404, 429, 500, 503):
        with pytest.raises(HttpError) as exc:
            client.get(f"/status/{status}")
        held = exc.value.status == status and f"HTTP {status}" in str(exc.value)
        assert tally.trial("http: non-2xx raised with its status", held)
    with pytest.raises(HttpError) as exc:
        HttpClient(f"http://127.0.0.1:{_closed_port()}", timeout=2).get("/ok")
    assert tally.trial("http: refused port is status None", exc.value.status is None)
    with pytest.raises(HttpError) as exc:
        client.get("/drop")
    assert tally.trial("http: dropped connection is status None", exc.value.status is None)


def test_trickled_reply_times_out(server, tally) -> None:
    """Each byte comes within the socket timeout, the whole reply does not: it must fail."""
    client = HttpClient(server.url, timeout=1.0)
    start = time.monotonic()
    with pytest.raises(HttpError) as exc:
        client.get("/trickle")
    took = time.monotonic() - start
    held = exc.value.status is None and "TimeoutError" in str(exc.value) and took < 6
    assert tally.trial("http: trickled reply bounded by the timeout", held)


def test_keep_alive_reuses_one_connection_and_recovers(server, tally) -> None:
    client = HttpClient(server.url, timeout=5, keep_alive=True)
    for _ in range(5):
        client.get("/ok")
    assert tally.trial("http: keep-alive reuses one connection", server.connections == 1)
    client.get("/close")  # the server closes: the next request opens a fresh one
    client.get("/ok")
    assert tally.trial("http: Connection: close honoured", server.connections == 2)
    with pytest.raises(HttpError):
        client.get("/drop")
    assert tally.trial("http: keep-alive recovers after a drop", client.get("/ok")["ok"] is True)
    fresh = HttpClient(server.url, timeout=5)
    before = server.connections
    fresh.get("/ok")
    fresh.get("/ok")
    assert tally.trial("http: one connection per request", server.connections == before + 2)


def test_three_transports_share_the_client(server, tally) -> None:
    """regenerate, extraction and serving each go through HttpClient and map its errors."""
    chat = ChatClient([server.url + "/v1"], "m", timeout=5, retries=0)
    assert tally.trial(
        "http: ChatClient answers", chat.complete([{"role": "user"}]).content == "hi"
    )
    bad = ChatClient([server.url + "/status/503"], "m", timeout=5, retries=1, backoff=0.01)
    with pytest.raises(RequestFailed, match="gave up after 2 attempts"):
        bad.complete([])
    assert tally.trial("http: ChatClient retried 503 once", bad.stats.retries == 1)
    ext = Http(server.url.removeprefix("http://"), timeout=5)
    assert tally.trial("http: extraction Http answers", ext.post("/generate", {"a": 1})["ok"])
    with pytest.raises(Failed, match="HTTP 500"):
        http_json(server.url + "/status/500")
    assert tally.trial("http: serving maps errors to Failed", True)
    with pytest.raises(Failed, match="expected a JSON object"):
        http_json(server.url + "/trickle", timeout=10)
    assert tally.trial("http: serving refuses a non-object reply", True)


def test_one_backoff_bounds(tally) -> None:
    rng = random.Random(7)
    held = True
    for attempt in range(12):
        for _ in range(50):
            d = backoff_delay(attempt, base=1.0, cap=10.0, rng=rng)
            full = min(10.0, 2.0**attempt)
            held &= full / 2 <= d <= full
    assert tally.trial("backoff: exponential, capped, equal jitter", held)
    d = backoff_delay(0, base=1.0, cap=10.0, retry_after=7.0, rng=rng)
    assert tally.trial("backoff: honours Retry-After", 7.0 <= d <= 10.0)
    d = backoff_delay(0, base=1.0, cap=10.0, retry_after=3600.0, rng=rng)
    assert tally.trial("backoff: Retry-After capped", d == 10.0)
