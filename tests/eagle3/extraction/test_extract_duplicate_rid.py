"""A timed-out request is retried with the same rid; SGLang answers "Duplicate request ID" while
the first is still running. The client waits and retries instead of stopping the extraction.

The server is a stand-in on loopback (SGLang needs GPUs): it answers 400 with SGLang 0.5.23's
message while a rid is in flight, as TokenizerManager does.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from remote_agent.eagle3.extraction.client import ClientOptions, Extraction


class SlowServer:
    def __init__(self, busy_s: float) -> None:
        self.in_flight: set[str] = set()
        self.done: set[str] = set()
        self.log: list[tuple[str, int]] = []
        lock = threading.Lock()
        srv = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                rid = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["rid"]
                with lock:
                    dup = rid in srv.in_flight
                    first = not dup and not srv.log and rid not in srv.done
                    srv.in_flight.add(rid)
                if dup:
                    body = json.dumps({"error": {"message": f"Duplicate request ID: {rid}"}})
                    status = 400
                else:
                    if first:
                        time.sleep(busy_s)  # longer than the client's timeout
                    with lock:
                        srv.in_flight.discard(rid)
                        srv.done.add(rid)
                    body, status = "{}", 200
                srv.log.append((rid, status))
                data = body.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up on this one

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_duplicate_request_id_after_a_timeout_is_retried(tmp_path, monkeypatch):
    srv = SlowServer(busy_s=1.5)
    monkeypatch.setattr(time, "sleep", _fast_sleep(time.sleep))
    try:
        ex = Extraction(
            ClientOptions(srv.url, tmp_path / "d.jsonl", tmp_path, request_timeout=0.5, retries=6)
        )
        assert ex._post("dump-a", [1, 2, 3]) is None
        statuses = [s for _, s in srv.log]
        assert 400 in statuses, statuses  # the duplicate was seen, and survived
    finally:
        srv.httpd.shutdown()


def test_other_client_errors_still_stop_at_once(tmp_path):
    class Bad(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(400)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"no")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Bad)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        ex = Extraction(ClientOptions(url, tmp_path / "d.jsonl", tmp_path, retries=5))
        t0 = time.monotonic()
        assert "HTTP 400" in ex._post("dump-a", [1])
        assert time.monotonic() - t0 < 1.0  # no backoff on a request that is simply wrong
    finally:
        httpd.shutdown()


def _fast_sleep(real):
    """The client's backoff (1, 2, 4 s...) shortened so the test stays fast; server sleeps stay."""

    def sleep(s: float) -> None:
        real(min(s, 0.4) if threading.current_thread() is threading.main_thread() else s)

    return sleep
