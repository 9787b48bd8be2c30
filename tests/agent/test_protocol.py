"""Handshake, malformed input and fuzzing of the request parser."""

from __future__ import annotations

import json
import os
import platform
import socket
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remote_agent.agent.probes import CHECKS
from remote_agent.wire.protocol import RequestError, parse_request

from .agent_proc import AgentCallError, AgentProc


def test_hello_describes_the_agent(agent: AgentProc, spool: Path) -> None:
    h = agent.hello()
    assert h["protocol"] == 1
    assert h["python"] == platform.python_version()
    assert h["hostname"] == socket.gethostname()
    assert h["pid"] == agent.proc.pid
    assert h["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert h["spool"] == str(spool)
    assert {"job.start", "job.watch", "probe", "stats.since", "check:manifest"} <= set(
        h["capabilities"]
    )
    assert agent.call("ping")["t"] > 0


def test_protocol_mismatch_names_both_versions(agent: AgentProc) -> None:
    with pytest.raises(AgentCallError) as e:
        agent.call("hello", protocol=2, client="future")
    assert e.value.type == "protocol"
    assert "protocol 2" in e.value.message and "protocol 1" in e.value.message
    with pytest.raises(AgentCallError) as e:
        agent.call("hello", client="nothing")
    assert e.value.type == "protocol"
    assert agent.call("ping")  # still serving


def _answers(agent: AgentProc) -> int:
    with agent._cond:
        return len(agent.responses) + len(agent.unsolicited)


def _send_expect_one(agent: AgentProc, line: bytes, *, unparsed: bool = False) -> dict:
    """Send one line; exactly one response comes back (by its id, or with id null)."""
    before_unsolicited = len(agent.unsolicited)
    try:
        rid = None if unparsed else json.loads(line).get("id")
    except Exception:
        rid = None
    agent.send_line(line)
    if isinstance(rid, int) and not isinstance(rid, bool):
        return agent.wait_response(rid, 20)
    agent.wait_until(lambda: len(agent.unsolicited) > before_unsolicited, 20, repr(line[:80]))
    return agent.unsolicited[-1]


MALFORMED = [
    (b"garbage", None),
    (b"[]", None),
    (b"   ", None),
    (b"\xff\xfe\x00", None),
    (b'{"op": "ping"}', None),
    (b'{"id": "7", "op": "ping"}', None),
    (b'{"id": true, "op": "ping"}', None),
    (b'{"id": 7}', 7),
    (b'{"id": 8, "op": "no.such.op"}', 8),
    (b'{"id": 9, "op": "ping", "args": []}', 9),
    (b'{"id": 10, "op": "ping", "extra": 1}', 10),
    (b'{"id": 11, "op": "job.status", "args": {"job_id": "../../etc"}}', 11),
    (b'{"id": 12, "op": "job.status", "args": {}}', 12),
    (b'{"id": 13, "op": "job.read", "args": {"job_id": "x", "offset": -1}}', 13),
    (b'{"id": 14, "op": "job.start", "args": {"job_id": "a", "argv": ["x"], "shell": "y"}}', 14),
    (b'{"id": 15, "op": "job.start", "args": {"job_id": "b"}}', 15),
    (b'{"id": 16, "op": "job.start", "args": {"job_id": "c", "argv": "notalist"}}', 16),
    (b"[" * 100_000, None),
    (b'{"id": 1' + b"0" * 5000 + b', "op": "ping"}', None),
]


def test_malformed_lines_get_errors_and_the_agent_keeps_serving(agent: AgentProc) -> None:
    for line, rid in MALFORMED:
        resp = _send_expect_one(agent, line)
        assert resp["ok"] is False, line[:60]
        assert resp["id"] == rid
        assert resp["error"]["type"] in ("bad_request", "not_found"), resp
        assert isinstance(resp["error"]["message"], str) and resp["error"]["message"]
    resp = _send_expect_one(agent, b'{"id": 99, "op": "job.status", "args": {"job_id": "nope"}}')
    assert resp["error"]["type"] == "not_found"
    assert agent.call("ping")
    # No job was created by the rejected job.start requests.
    assert not list((agent.spool / "jobs").iterdir())


def test_an_oversized_line_is_refused_not_buffered(agent: AgentProc) -> None:
    resp = _send_expect_one(
        agent, b'{"id": 5, "op": "ping", "pad": "' + b"x" * (17 << 20) + b'"}', unparsed=True
    )
    assert resp["id"] is None and "longer than" in resp["error"]["message"]
    assert agent.call("ping")


def test_blank_line_and_eof_end_cleanly(spool: Path) -> None:
    a = AgentProc(spool)
    assert _send_expect_one(a, b"")["ok"] is False
    assert a.close() == 0


def test_shutdown_answers_then_exits(spool: Path) -> None:
    a = AgentProc(spool)
    assert a.call("shutdown") == {}
    assert a.proc.wait(10) == 0


# --- fuzzing -----------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=15,
)
# Ops that cannot start anything or stop the agent; the spool has no jobs, so job ops miss.
SAFE_OPS = [
    "ping",
    "hello",
    "job.status",
    "job.list",
    "job.read",
    "job.watch",
    "job.unwatch",
    "job.cancel",
    "job.log_hash",
    "stats.since",
    "stats.sample",
    "probe",
]
ARG_KEYS = [
    "job_id",
    "offset",
    "max_bytes",
    "protocol",
    "check",
    "paths",
    "seq",
    "run_id",
    "start",
    "end",
    "grace_s",
]
requests = st.fixed_dictionaries(
    {},
    optional={
        "id": st.integers(-(2**70), 2**70) | json_values,
        "op": st.sampled_from(SAFE_OPS) | st.text(max_size=12),
        "args": st.dictionaries(
            st.sampled_from(ARG_KEYS) | st.text(max_size=8), json_values, max_size=5
        )
        | json_values,
        "extra": json_values,
    },
)
lines = st.one_of(
    requests.map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=300),
    st.text(max_size=300).map(lambda s: s.encode("utf-8", "surrogatepass")),
).map(lambda b: b.replace(b"\n", b" ").replace(b"\r", b" "))


def _runs_nothing(line: bytes) -> bool:
    # A probe naming a real check could walk or hash "/" for minutes: keep the fuzz cheap.
    return not any(f'"{name}"'.encode() in line for name in CHECKS)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=400) | requests.map(lambda d: json.dumps(d).encode()))
def test_parser_never_raises_anything_else(line: bytes) -> None:
    try:
        req = parse_request(line)
    except RequestError as e:
        assert e.error.type == "bad_request" and e.error.message
        assert e.id is None or isinstance(e.id, int)
    else:
        assert isinstance(req.id, int) and isinstance(req.op, str) and isinstance(req.args, dict)


@pytest.fixture(scope="module")
def fuzz_agent(tmp_path_factory: pytest.TempPathFactory):
    a = AgentProc(tmp_path_factory.mktemp("fuzz") / "spool", keep_raw=True)
    yield a
    a.close()


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines.filter(_runs_nothing))
def test_agent_answers_every_fuzzed_line_with_one_json_response(
    fuzz_agent: AgentProc, line: bytes
) -> None:
    resp = _send_expect_one(fuzz_agent, line)
    assert set(resp) == ({"id", "ok", "result"} if resp["ok"] else {"id", "ok", "error"})
    if not resp["ok"]:
        assert resp["error"]["type"] in ("bad_request", "not_found", "protocol")
        assert "Traceback" not in resp["error"]["message"]
    assert not fuzz_agent.garbage
    assert not any(b"Traceback" in raw for raw in fuzz_agent.raw)
    assert fuzz_agent.proc.poll() is None
    assert os.path.isdir(fuzz_agent.spool / "jobs") and not os.listdir(fuzz_agent.spool / "jobs")
