"""The base of the small JSON-over-HTTP servers that stand where SGLang's HTTP API does (the
online reference producer; the bench's and the tests' stand-in servers): quiet, JSON both ways."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:  # a request line per call would flood job logs
        pass

    def reply(self, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def read_json(self) -> Any:
        """The request's JSON body (Content-Length bytes)."""
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))
