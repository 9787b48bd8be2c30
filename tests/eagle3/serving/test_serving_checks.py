"""serve-check and accept against a stand-in SGLang HTTP server on loopback.

SGLang cannot run on these machines (it needs GPUs and gigabytes of CUDA wheels), so this server
is a fake: it answers /get_server_info and /generate with the fields SGLang 0.5.23 returns
(speculative_* settings, meta_info.completion_tokens and spec_verify_ct), deterministically.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.paths import REPO


class FakeSglang:
    def __init__(self, algorithm: str, draft: str, accept_every: float) -> None:
        self.algorithm, self.draft, self.accept = algorithm, draft, accept_every
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _send(self, obj):
                body = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/get_server_info":
                    self._send(
                        {
                            "speculative_algorithm": fake.algorithm,
                            "speculative_draft_model_path": fake.draft,
                            "speculative_num_steps": 3,
                            "speculative_eagle_topk": 1,
                            "speculative_num_draft_tokens": 4,
                            "internal_states": [{"avg_spec_accept_length": fake.accept}],
                        }
                    )
                else:
                    self.send_error(404)

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(req)
                n = req["sampling_params"]["max_new_tokens"]
                verify = n if fake.algorithm != "EAGLE3" else int(round(n / fake.accept))
                self._send(
                    {
                        "text": "ok " * n,
                        "meta_info": {"completion_tokens": n, "spec_verify_ct": verify},
                    }
                )

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def eagle3(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "remote_agent.eagle3", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text(
        "".join(
            json.dumps({"question_id": i, "turns": [f"Explain {w}.", "Shorter."]}) + "\n"
            for i, w in enumerate(["lists", "dicts", "sets"])
        )
    )
    return path


def test_serve_check_accepts_eagle3_and_names_the_eagle_misconfiguration(tmp_path):
    good = FakeSglang("EAGLE3", str(tmp_path / "drafter"), 2.5)
    try:
        out = eagle3(
            "serve-check",
            "--url",
            good.url,
            "--draft",
            str(tmp_path / "drafter"),
            "--steps",
            "3",
            "--topk",
            "1",
            "--draft-tokens",
            "4",
        )
        assert out.returncode == 0, out.stderr
        out = eagle3("serve-check", "--url", good.url, "--draft", str(tmp_path / "other"))
        assert out.returncode == 1 and "speculative_draft_model_path" in out.stderr
    finally:
        good.close()
    bad = FakeSglang("EAGLE", str(tmp_path / "drafter"), 1.0)
    try:
        out = eagle3("serve-check", "--url", bad.url)
        assert out.returncode == 1 and "runs EAGLE, not EAGLE3" in out.stderr
    finally:
        bad.close()


def test_accept_uses_sglangs_formula_over_both_turns(tiny_target, prompts, tmp_path):
    srv = FakeSglang("EAGLE3", "d", 2.5)
    try:
        report = tmp_path / "accept.json"
        out = eagle3(
            "accept",
            "--url",
            srv.url,
            "--prompts",
            str(prompts),
            "--tokenizer",
            str(tiny_target),
            "--max-new-tokens",
            "50",
            "--out",
            str(report),
        )
        assert out.returncode == 0, out.stderr
        rep = json.loads(report.read_text())
        assert rep["requests"] == 6  # 3 questions x 2 turns, each answered in context
        assert (
            rep["completion_tokens"] == 300
            and rep["verify_steps"] == 120
            and rep["accept_length"] == 2.5
        )
        second_turns = [
            r
            for r in srv.requests
            if len(r["input_ids"]) > min(len(x["input_ids"]) for x in srv.requests)
        ]
        assert len(second_turns) >= 3  # the second turn carries the first answer
        assert all(r["sampling_params"]["temperature"] == 0.0 for r in srv.requests)
    finally:
        srv.close()


def test_accept_of_exactly_one_fails(tiny_target, prompts):
    srv = FakeSglang("EAGLE", "d", 1.0)
    try:
        out = eagle3(
            "accept",
            "--url",
            srv.url,
            "--prompts",
            str(prompts),
            "--tokenizer",
            str(tiny_target),
            "--max-new-tokens",
            "20",
        )
        assert out.returncode == 1 and "no draft token was ever accepted" in out.stderr
    finally:
        srv.close()
