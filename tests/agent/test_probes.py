"""Every check type, true and false, evaluated by a real agent; probes never modify anything."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .agent_proc import AgentProc

PY = sys.executable


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small data tree the probes look at (and must leave exactly as it is)."""
    root = tmp_path_factory.mktemp("probe-data")
    (root / "data").mkdir()
    (root / "data" / "a.bin").write_bytes(b"a" * 1000)
    (root / "data" / "sub").mkdir()
    (root / "data" / "sub" / "b.bin").write_bytes(b"b" * 234)
    os.link(root / "data" / "a.bin", root / "data" / "sub" / "a-hardlink.bin")  # counted once
    (root / "big-outside.bin").write_bytes(b"z" * 50_000)
    os.symlink(root / "big-outside.bin", root / "data" / "link-to-big")  # not followed
    os.symlink(root / "data", root / "data" / "sub" / "loop")  # a cycle, not followed
    recs = [{"id": str(i), "input_ids": list(range(i + 1))} for i in range(5)]
    (root / "ok.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (root / "bad.jsonl").write_text('{"id": "0"}\n{"id": "1"}\n{"id": oops\n')
    payload = b"merged records\n" * 100
    (root / "merged.jsonl").write_bytes(payload)
    manifest = {
        "format": "eagle3-merged",
        "version": 1,
        "records": 100,
        "file": "merged.jsonl",
        "sha256": hashlib.sha256(payload).hexdigest(),
        "sources": {"a": {"records": 60}},
        "flag": True,
    }
    (root / "merged.manifest.json").write_text(json.dumps(manifest))
    bad_manifest = dict(manifest, sha256="0" * 64)
    (root / "bad.manifest.json").write_text(json.dumps(bad_manifest))
    return root


@pytest.fixture(scope="module")
def pagent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProc]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not (Path(p) / "nvidia-smi").exists()
    )
    a = AgentProc(tmp_path_factory.mktemp("probe-spool") / "spool", env=env, keep_raw=True)
    yield a
    assert not a.garbage
    a.close()


def probe(agent: AgentProc, **check: Any) -> dict[str, Any]:
    return agent.call("probe", check=check, timeout=60)


def _snapshot(root: Path) -> dict[str, tuple]:
    snap = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else None
        snap[str(p)] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_nlink, digest)
    return snap


def test_path_exists_and_absent(pagent: AgentProc, tree: Path) -> None:
    r = probe(pagent, check="path_exists", path=str(tree / "data" / "a.bin"))
    assert r["ok"] and r["observed"] == {"exists": True, "type": "file", "size": 1000}
    r = probe(pagent, check="path_exists", path=str(tree / "nope"))
    assert not r["ok"] and r["observed"]["exists"] is False and "does not exist" in r["message"]
    r = probe(pagent, check="path_absent", path=str(tree / "nope"))
    assert r["ok"]
    r = probe(pagent, check="path_absent", path=str(tree / "data"))
    assert not r["ok"] and r["observed"]["type"] == "dir"


def test_sha256(pagent: AgentProc, tree: Path) -> None:
    digest = hashlib.sha256(b"a" * 1000).hexdigest()
    r = probe(
        pagent, check="sha256", path=str(tree / "data" / "a.bin"), any_of=["0" * 64, digest.upper()]
    )
    assert r["ok"] and r["observed"] == {"sha256": digest, "size": 1000}
    r = probe(pagent, check="sha256", path=str(tree / "data" / "a.bin"), any_of=["0" * 64])
    assert not r["ok"] and r["observed"]["sha256"] == digest
    r = probe(pagent, check="sha256", path=str(tree / "missing"), any_of=[digest])
    assert not r["ok"] and "no such file" in r["message"]


def test_disk_free(pagent: AgentProc, tree: Path) -> None:
    r = probe(pagent, check="disk_free", path=str(tree), min_bytes=1)
    assert r["ok"] and r["observed"]["free_bytes"] > 0 and r["observed"]["total_bytes"] > 0
    r = probe(pagent, check="disk_free", path=str(tree / "not" / "yet"), min_bytes=10**18)
    assert not r["ok"] and r["observed"]["path"] == str(tree)  # nearest existing parent


def test_dir_size_counts_each_inode_once_and_follows_no_symlink(
    pagent: AgentProc, tree: Path
) -> None:
    r = probe(pagent, check="dir_size", path=str(tree / "data"), min_bytes=1234, max_bytes=1234)
    assert r["ok"], r
    assert r["observed"]["bytes"] == 1234 and r["observed"]["files"] == 2
    r = probe(pagent, check="dir_size", path=str(tree / "data"), max_bytes=1000, min_bytes=None)
    assert not r["ok"] and r["observed"]["bytes"] == 1234
    r = probe(pagent, check="dir_size", path=str(tree / "data"), min_bytes=2000, max_bytes=None)
    assert not r["ok"]
    r = probe(pagent, check="dir_size", path=str(tree / "missing"), max_bytes=0)
    assert not r["ok"] and "no such" in r["message"]


def test_jsonl_records(pagent: AgentProc, tree: Path) -> None:
    path = str(tree / "ok.jsonl")
    r = probe(
        pagent, check="jsonl_records", path=path, count=5, field="input_ids", field_len_sum=15
    )
    assert r["ok"] and r["observed"] == {"records": 5, "field_len_sum": 15}
    assert probe(pagent, check="jsonl_records", path=path, min=1, max=5)["ok"]
    assert not probe(pagent, check="jsonl_records", path=path, count=4)["ok"]
    assert not probe(pagent, check="jsonl_records", path=path, min=6)["ok"]
    assert not probe(pagent, check="jsonl_records", path=path, field="input_ids", field_len_sum=14)[
        "ok"
    ]
    r = probe(pagent, check="jsonl_records", path=path, field="nope")
    assert not r["ok"] and f"{path}:1" in r["message"]
    bad = str(tree / "bad.jsonl")
    r = probe(pagent, check="jsonl_records", path=bad, count=3)
    assert not r["ok"] and f"{bad}:3:" in r["message"] and r["observed"]["records"] == 2


def test_manifest(pagent: AgentProc, tree: Path) -> None:
    m = str(tree / "merged.manifest.json")
    expect = {"format": "eagle3-merged", "records": 100.0, "sources.a.records": 60, "flag": True}
    r = probe(pagent, check="manifest", path=m, expect=expect)
    assert r["ok"], r
    assert r["observed"]["fields"]["sources.a.records"] == 60
    assert r["observed"]["sha256_actual"] == r["observed"]["sha256_expected"]
    assert r["observed"]["file"] == str(tree / "merged.jsonl")
    r = probe(pagent, check="manifest", path=m, expect={"records": 99})
    assert not r["ok"] and "records is 100, expected 99" in r["message"]
    r = probe(pagent, check="manifest", path=m, expect={"flag": 1})  # JSON true is not 1
    assert not r["ok"]
    r = probe(pagent, check="manifest", path=m, expect={"missing.key": 1})
    assert not r["ok"] and "missing.key missing" in r["message"]
    r = probe(pagent, check="manifest", path=str(tree / "bad.manifest.json"), expect={})
    assert not r["ok"] and "sha256 of" in r["message"]
    assert not probe(pagent, check="manifest", path=str(tree / "nope.json"), expect={})["ok"]


def test_command(pagent: AgentProc, tree: Path) -> None:
    r = probe(
        pagent,
        check="command",
        argv=[PY, "-c", "print('version 1.2.3')"],
        stdout_regex=r"^version 1\.\d+",
    )
    assert r["ok"] and r["observed"]["exit_code"] == 0 and "1.2.3" in r["observed"]["stdout_tail"]
    r = probe(pagent, check="command", shell="echo nope; echo oops >&2; exit 4")
    assert not r["ok"] and r["observed"]["exit_code"] == 4
    assert r["observed"]["stderr_tail"] == "oops\n"
    r = probe(pagent, check="command", shell="echo v2", stdout_regex="^v1")
    assert not r["ok"] and "does not match" in r["message"]
    r = probe(
        pagent, check="command", shell="pwd; echo $PROBE_X", cwd=str(tree), env={"PROBE_X": "y"}
    )
    assert r["ok"] and r["observed"]["stdout_tail"] == f"{tree}\ny\n"
    r = probe(pagent, check="command", argv=["/no/such/binary"])
    assert not r["ok"] and "cannot run" in r["message"]


def test_command_timeout_kills_its_tree(pagent: AgentProc, tmp_path: Path) -> None:
    pidfile = tmp_path / "bg.pid"
    r = probe(pagent, check="command", timeout_s=0.5, shell=f"sleep 60 & echo $! > {pidfile}; wait")
    assert not r["ok"] and r["observed"]["timed_out"] and "timed out" in r["message"]
    from tests.support.procs import alive
    from tests.support.waiting import wait_for

    bg = int(pidfile.read_text())
    wait_for(lambda: not alive(bg), 10, "background sleep killed with the probe's group")


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_http_ok(pagent: AgentProc, http_url: str) -> None:
    r = probe(pagent, check="http_ok", url=f"{http_url}/health")
    assert r["ok"] and r["observed"] == {"status": 200, "error": None}
    r = probe(pagent, check="http_ok", url=f"{http_url}/missing")
    assert not r["ok"] and r["observed"]["status"] == 404
    assert probe(pagent, check="http_ok", url=f"{http_url}/missing", status=404)["ok"]
    # A port nobody listens on: refused, with the error observed.
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    r = probe(pagent, check="http_ok", url=f"http://127.0.0.1:{port}/", timeout_s=2)
    assert not r["ok"] and r["observed"]["status"] is None and r["observed"]["error"]
    assert not probe(pagent, check="http_ok", url="file:///etc/passwd")["ok"]


def test_gpu_idle_without_nvidia_smi_says_so(pagent: AgentProc) -> None:
    r = probe(pagent, check="gpu_idle")
    assert r == {
        "ok": False,
        "observed": {"error": "no GPU: nvidia-smi not found"},
        "message": "no GPU: nvidia-smi not found",
    }


FAKE_SMI = """#!/bin/sh
# A stand-in nvidia-smi printing what the real one prints for these queries.
mode=$(cat "$(dirname "$0")/mode")
case "$*" in
  *--query-gpu=*)
    echo "0, GPU-aaa, NVIDIA H200, 3, 512, 143771"
    if [ "$mode" = busy ]; then echo "1, GPU-bbb, NVIDIA H200, 97, 80000, 143771"
    else echo "1, GPU-bbb, NVIDIA H200, 0, 0, 143771"; fi ;;
  *--query-compute-apps=*)
    if [ "$mode" = busy ]; then echo "4242, GPU-bbb, 80000, python"; fi ;;
esac
"""


@pytest.fixture(scope="module")
def fake_smi_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentProc, Path]]:
    bindir = tmp_path_factory.mktemp("fakebin")
    smi = bindir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    (bindir / "mode").write_text("idle")
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    a = AgentProc(tmp_path_factory.mktemp("smi-spool") / "spool", env=env)
    yield a, bindir
    a.close()


def test_gpu_idle_parses_nvidia_smi(fake_smi_agent: tuple[AgentProc, Path]) -> None:
    a, bindir = fake_smi_agent
    (bindir / "mode").write_text("idle")
    r = probe(a, check="gpu_idle", max_memory_mib=1024, max_util=10)
    assert r["ok"], r
    assert [g["index"] for g in r["observed"]["gpus"]] == [0, 1]
    (bindir / "mode").write_text("busy")
    r = probe(a, check="gpu_idle")
    assert not r["ok"] and "[1]" in r["message"] and "4242" in r["message"]
    assert r["observed"]["compute_apps"][0]["pid"] == 4242
    s = a.call("stats.sample", paths=["/"])
    assert s["gpu_error"] is None and s["gpus"][1] == {
        "index": 1,
        "name": "NVIDIA H200",
        "util": 97.0,
        "mem_used_mib": 80000.0,
        "mem_total_mib": 143771.0,
    }


@pytest.mark.parametrize(
    "check",
    [
        {"check": "no_such_check"},
        {"path": "/"},
        {"check": "path_exists"},
        {"check": "path_exists", "path": 3},
        {"check": "sha256", "path": "/etc/hostname"},
        {"check": "sha256", "path": "/etc/hostname", "any_of": "abc"},
        {"check": "disk_free", "path": "/"},
        {"check": "jsonl_records", "path": "/", "count": "many"},
        {"check": "command"},
        {"check": "command", "argv": ["true"], "shell": "true"},
        {"check": "command", "argv": ["true"], "stdout_regex": "("},
        {"check": "http_ok"},
        {"check": "manifest", "path": "/", "expect": []},
        "not a dict",
        None,
    ],
)
def test_bad_checks_answer_ok_false_with_a_message(pagent: AgentProc, check: Any) -> None:
    r = pagent.call("probe", check=check)
    assert r["ok"] is False and isinstance(r["message"], str) and r["message"]


def test_probes_never_modify_anything(pagent: AgentProc, tree: Path, http_url: str) -> None:
    before = _snapshot(tree)
    digest = hashlib.sha256(b"a" * 1000).hexdigest()
    checks = [
        {"check": "path_exists", "path": str(tree / "data")},
        {"check": "path_absent", "path": str(tree / "data" / "x")},
        {"check": "sha256", "path": str(tree / "data" / "a.bin"), "any_of": [digest]},
        {"check": "disk_free", "path": str(tree / "new" / "dir"), "min_bytes": 1},
        {"check": "dir_size", "path": str(tree), "min_bytes": 1},
        {"check": "jsonl_records", "path": str(tree / "ok.jsonl"), "count": 5},
        {"check": "jsonl_records", "path": str(tree / "bad.jsonl")},
        {"check": "manifest", "path": str(tree / "merged.manifest.json"), "expect": {"version": 1}},
        {"check": "manifest", "path": str(tree / "bad.manifest.json"), "expect": {"version": 2}},
        {"check": "http_ok", "url": f"{http_url}/health"},
        {"check": "gpu_idle"},
    ]
    for c in checks:
        pagent.call("probe", check=c)
    assert _snapshot(tree) == before
    assert not (tree / "new").exists()
