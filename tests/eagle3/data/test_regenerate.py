"""`eagle3 regenerate` against a real OpenAI-compatible HTTP server on 127.0.0.1.

The server answers deterministically and misbehaves on request, keyed by markers in the last
user message: `[429x2]` (two 429s, then an answer), `[500x1]`, `[503x1]`, `[drop]` (first request:
connection closed without a response), `[slow]` (first request: no answer until the client has
given up and retried), `[hang]` (first request: wait until the test releases it), `[400]`,
`[401]` (always). It counts requests per key, so the tests assert exact request counts.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.paths import REPO

KEY = "sk-test-5ecret-0f-the-run"


class FakeOpenAI:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.log: list[tuple[str, list[dict], str | None]] = []
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                msgs = body["messages"]
                key = msgs[-1]["content"]
                with server.arrived:
                    server.counts[key] += 1
                    n = server.counts[key]
                    server.log.append((key, msgs, self.headers.get("Authorization")))
                    server.arrived.notify_all()
                fail = re.search(r"\[(\d{3})x(\d+)\]", key)
                if fail and n <= int(fail.group(2)):
                    return self.reply(
                        int(fail.group(1)), {"error": "injected"}, {"Retry-After": "0"}
                    )
                if "[400]" in key:  # echoes the auth header: the client must redact it
                    return self.reply(
                        400, {"error": f"bad request from {self.headers.get('Authorization')}"}
                    )
                if "[401]" in key:
                    return self.reply(401, {"error": "invalid key"})
                if "[drop]" in key and n == 1:
                    self.close_connection = True
                    return  # no status line at all: the client sees the connection dropped
                if "[slow]" in key and n == 1:
                    with server.arrived:  # answer only after the client retried
                        server.arrived.wait_for(lambda: server.counts[key] > 1, timeout=30)
                if "[hang]" in key and n == 1:
                    server.release.wait(30)
                turn = sum(1 for m in msgs if m["role"] == "assistant")
                message = {
                    "role": "assistant",
                    "content": f"A{turn}<{key}>",
                    "reasoning_content": f"R<{key}>",
                }
                self.reply(
                    200,
                    {
                        "choices": [{"message": message, "finish_reason": "stop"}],
                        "usage": {"completion_tokens": 3},
                    },
                )

            def reply(self, status, obj, headers=None):
                data = json.dumps(obj).encode()
                try:
                    self.send_response(status)
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up on this one

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda *a: None
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def keys_sent(self) -> set[str]:
        with self.lock:
            return set(self.counts)

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = FakeOpenAI()
    yield s
    s.close()


def conversations(tmp_path: Path, samples: list[tuple[str, list[str]]]) -> Path:
    """ShareGPT input: each user turn followed by an original (to be replaced) answer."""
    path = tmp_path / "in.jsonl"
    rows = []
    for sid, questions in samples:
        turns = [{"from": "system", "value": "be brief"}]
        for q in questions:
            turns += [{"from": "human", "value": q}, {"from": "gpt", "value": "ORIGINAL"}]
        rows.append({"id": sid, "conversations": turns})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def fast(server):
    return [
        "--endpoint",
        server.url,
        "--backoff",
        "0.01",
        "--backoff-max",
        "0.05",
        "--timeout",
        "1",
    ]


def output(path: Path) -> dict[str, dict]:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert len({r["id"] for r in rows}) == len(rows), "a sample was written twice"
    return {r["id"]: r for r in rows}


def test_retries_backoff_and_exact_request_counts(cli, server, tmp_path):
    samples = [
        ("s0", ["s0 q1 [429x2]", "s0 q2"]),
        ("s1", ["s1 q1 [500x1]", "s1 q2 [drop]"]),
        ("s2", ["s2 q1 [slow]", "s2 q2"]),
        ("s3", ["s3 q1", "s3 q2 [503x1]"]),
        ("s4", ["s4 q1"]),
    ]
    src, out = conversations(tmp_path, samples), tmp_path / "out.jsonl"
    run = cli(
        "regenerate", src, "--out", out, "--concurrency", "3", "--retries", "4", *fast(server)
    )
    assert run.rc == 0, run.stderr
    injected = {
        "s0 q1 [429x2]": 2,
        "s1 q1 [500x1]": 1,
        "s1 q2 [drop]": 1,
        "s2 q1 [slow]": 1,
        "s3 q2 [503x1]": 1,
    }
    questions = [q for _, qs in samples for q in qs]
    assert dict(server.counts) == {q: 1 + injected.get(q, 0) for q in questions}
    r = run.result
    assert (r["samples"], r["answered"], r["failed"], r["already_done"]) == (5, 5, 0, 0)
    assert r["requests"] == sum(server.counts.values()) == 15
    assert r["retries"] == 6
    assert r["retry_reasons"] == {
        "http_429": 2,
        "http_500": 1,
        "connection": 1,
        "timeout": 1,
        "http_503": 1,
    }
    rows = output(out)
    assert rows["s1"]["conversations"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "s1 q1 [500x1]"},
        {
            "role": "assistant",
            "content": "A0<s1 q1 [500x1]>",
            "reasoning_content": "R<s1 q1 [500x1]>",
        },
        {"role": "user", "content": "s1 q2 [drop]"},
        {
            "role": "assistant",
            "content": "A1<s1 q2 [drop]>",
            "reasoning_content": "R<s1 q2 [drop]>",
        },
    ]
    # turn by turn: the second question went out with the *regenerated* first answer, no reasoning
    [(_, msgs, _)] = [e for e in server.log if e[0] == "s0 q2"]
    assert msgs == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "s0 q1 [429x2]"},
        {"role": "assistant", "content": "A0<s0 q1 [429x2]>"},
        {"role": "user", "content": "s0 q2"},
    ]
    assert all("ORIGINAL" not in json.dumps(m) for _, m, _ in server.log)
    assert run.progress and all(
        p["unit"] == "samples" and "rate" in p and "eta_s" in p for p in run.progress
    )
    assert run.progress[-1]["done"] == 5 and run.progress[-1]["total"] == 5


def test_reasoning_can_be_dropped(cli, server, tmp_path):
    src, out = conversations(tmp_path, [("a", ["hi"])]), tmp_path / "out.jsonl"
    assert cli("regenerate", src, "--out", out, "--reasoning", "drop", *fast(server)).rc == 0
    assert output(out)["a"]["conversations"][-1] == {"role": "assistant", "content": "A0<hi>"}


def test_resume_sends_nothing_twice(cli, server, tmp_path):
    samples = [(f"s{k}", [f"s{k} q1", f"s{k} q2"]) for k in range(6)]
    src, out = conversations(tmp_path, samples), tmp_path / "out.jsonl"
    first = cli("regenerate", src, "--out", out, "--limit", "2", *fast(server))
    assert first.rc == 0 and set(output(out)) == {"s0", "s1"}
    sent_first = server.keys_sent()
    second = cli("regenerate", src, "--out", out, *fast(server))
    assert second.rc == 0
    assert (second.result["already_done"], second.result["answered"]) == (2, 4)
    assert set(output(out)) == {f"s{k}" for k in range(6)}
    assert set(server.counts.values()) == {1}  # every question was sent exactly once overall
    assert sent_first == {"s0 q1", "s0 q2", "s1 q1", "s1 q2"}
    third = cli("regenerate", src, "--out", out, *fast(server))
    assert third.result["answered"] == 0 and third.result["requests"] == 0


def test_killed_run_resumes_without_resending_answered_samples(cli, server, tmp_path):
    samples = [(f"s{k}", [f"s{k} q1" + (" [hang]" if k == 3 else "")]) for k in range(6)]
    src, out = conversations(tmp_path, samples), tmp_path / "out.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "remote_agent.eagle3", "regenerate", src, "--out", out, "--concurrency", "1", *fast(server), "--timeout", "60"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        with server.arrived:
            assert server.arrived.wait_for(lambda: server.counts["s3 q1 [hang]"] == 1, timeout=60)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    server.release.set()
    answered_before = set(output(out))
    assert "s3" not in answered_before and answered_before <= {"s0", "s1", "s2"}
    before = Counter(server.counts)
    run = cli("regenerate", src, "--out", out, *fast(server))
    assert run.rc == 0, run.stderr
    resent = {k for k in server.counts if server.counts[k] > before.get(k, 0)}
    assert not {f"{sid} q1" for sid in answered_before} & resent  # nothing answered went out again
    assert set(output(out)) == {f"s{k}" for k in range(6)}
    assert run.result["already_done"] == len(answered_before)


def test_api_key_from_env_is_sent_but_never_shown(cli, server, tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_REGEN_KEY", KEY)
    src, out = (
        conversations(tmp_path, [("ok", ["fine"]), ("bad", ["boom [400]"])]),
        tmp_path / "out.jsonl",
    )
    run = cli(
        "regenerate",
        src,
        "--out",
        out,
        "--api-key-env",
        "TEST_REGEN_KEY",
        "--max-failed",
        "0.6",
        *fast(server),
    )
    assert run.rc == 0, run.stderr
    assert {auth for _, _, auth in server.log} == {f"Bearer {KEY}"}
    errors = (tmp_path / "out.errors.jsonl").read_text()
    assert json.loads(errors)["id"] == "bad" and "HTTP 400" in errors and "Bearer ***" in errors
    everything = run.stderr + out.read_text() + errors
    assert KEY not in everything
    assert server.counts["boom [400]"] == 1  # not retried
    # the failed sample is not "answered": the next run sends it again
    assert (
        cli(
            "regenerate",
            src,
            "--out",
            out,
            "--api-key-env",
            "TEST_REGEN_KEY",
            "--max-failed",
            "1",
            *fast(server),
        ).rc
        == 0
    )
    assert server.counts["boom [400]"] == 2 and server.counts["fine"] == 1


def test_failures_above_the_threshold_exit_1(cli, server, tmp_path):
    src, out = conversations(tmp_path, [("a", ["x"]), ("b", ["y [503x9]"])]), tmp_path / "out.jsonl"
    run = cli("regenerate", src, "--out", out, "--retries", "2", *fast(server))
    assert (
        run.rc == 1
        and "1 of 2 samples failed" in run.error
        and "gave up after 3 attempts" in run.error
    )
    assert server.counts["y [503x9]"] == 3
    assert set(output(out)) == {"a"}  # what succeeded is kept for the next run


def test_bad_key_stops_the_run(cli, server, tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_REGEN_KEY", KEY)
    samples = [("a", ["q [401]"])] + [(f"s{k}", [f"s{k}"]) for k in range(20)]
    src, out = conversations(tmp_path, samples), tmp_path / "out.jsonl"
    run = cli(
        "regenerate",
        src,
        "--out",
        out,
        "--api-key-env",
        "TEST_REGEN_KEY",
        "--concurrency",
        "1",
        *fast(server),
    )
    assert run.rc == 1 and "HTTP 401" in run.error and "check the API key" in run.error
    assert KEY not in run.stderr
    assert server.counts["q [401]"] == 1 and sum(server.counts.values()) <= 3  # stopped early


def test_bad_input_sends_nothing(cli, server, tmp_path, monkeypatch):
    src = tmp_path / "in.jsonl"
    src.write_text(
        '{"id": "a", "conversations": [{"from": "human", "value": "q"}]}\n{"id": 1, "conversations": 5}\n'
    )
    out = tmp_path / "out.jsonl"
    run = cli("regenerate", src, "--out", out, *fast(server))
    assert run.rc == 2 and run.error.startswith(
        f"{src}:2: 'conversations'/'messages' must be a list"
    )
    monkeypatch.delenv("NOPE_KEY", raising=False)
    good = conversations(tmp_path, [("a", ["q"])])
    run = cli("regenerate", good, "--out", out, "--api-key-env", "NOPE_KEY", *fast(server))
    assert run.rc == 2 and "NOPE_KEY" in run.error
    assert not out.exists() and not server.log
