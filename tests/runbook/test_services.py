"""Service steps: succeed once ready with the job still running; a `stop:` step ends it."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from runbook.loader import RunbookError, load_text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_service_ready_then_used_then_stopped(cli, tmp_path):
    port = free_port()
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "hello.txt").write_text("hi")
    rb = cli.runbook(f"""\
        name: svc
        steps:
          - id: server
            title: Serve files
            run: [python3, -m, http.server, "{port}", --bind, 127.0.0.1, --directory, "{tmp_path / "www"}"]
            detach: true
            service:
              ready: {{check: http_ok, url: "http://127.0.0.1:{port}/hello.txt"}}
              interval: 0.2s
          - id: use
            title: Use the server
            run: python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/hello.txt').read())"
            requires: [server]
          - id: stop-server
            title: Stop the server
            stop: server
            requires: [use]
    """)
    cli("run", str(rb), "--auto", check=0)
    st = cli.state_json()["steps"]
    assert st["server"]["status"] == "succeeded" and st["server"]["reason"] == "service_ready"
    assert st["stop-server"]["reason"] == "service_stopped"
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/hello.txt", timeout=2)
    use_log = open(st["use"]["log_file"]).read()
    assert use_log.strip() == "b'hi'"


def test_service_that_exits_or_never_gets_ready_fails(cli, tmp_path):
    port = free_port()
    rb = cli.runbook(f"""\
        name: svcbad
        steps:
          - id: quits
            title: Exits at once
            run: "true"
            detach: true
            service: {{ready: {{check: http_ok, url: "http://127.0.0.1:{port}/"}}, interval: 0.2s}}
    """)
    cli("run", str(rb), "--auto", check=1)
    assert cli.state_json()["steps"]["quits"]["reason"] == "service_exited"
    rb2 = cli.runbook(
        f"""\
        name: svcslow
        steps:
          - id: never
            title: Never ready
            run: [sleep, "60"]
            detach: true
            service: {{ready: {{check: http_ok, url: "http://127.0.0.1:{port}/"}}, timeout: 1s, interval: 0.2s}}
    """,
        "slow.yaml",
    )
    cli("run", str(rb2), "--auto", check=1)
    st = cli.state_json()["steps"]["never"]
    assert st["status"] == "failed" and st["reason"] == "not_ready"


def test_service_schema_rules():
    base = "name: t\nsteps:\n  - {id: s, title: S, run: 'x', detach: true, service: {ready: {check: path_exists, path: /}}}\n"
    load_text(base, "t.yaml")
    with pytest.raises(RunbookError, match="must be `detach: true`"):
        load_text(base.replace("detach: true, ", ""), "t.yaml")
    with pytest.raises(RunbookError, match="is not a service"):
        load_text(
            "name: t\nsteps:\n  - {id: a, title: A, run: 'x'}\n  - {id: b, title: B, stop: a}\n",
            "t.yaml",
        )
    with pytest.raises(RunbookError, match="runs nothing itself"):
        load_text(base + "  - {id: b, title: B, stop: s, run: 'x'}\n", "t.yaml")
