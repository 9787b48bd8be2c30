"""Jobs outlive the agent: kill -9 the agent mid-job, start a new one, reattach by cursor."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.procs import alive
from tests.support.waiting import wait_for

from .agent_proc import AgentCallError, AgentProc, data_bytes
from .helpers import PY

N_LINES = 400

# Deterministic output with binary bytes and partial lines across the kills. It writes
# continuously, and waits at two gates so that it is provably still running when each new agent
# reattaches (no timing luck involved).
PRODUCER = r"""
import os, sys, time
gate, n = sys.argv[1], int(sys.argv[2])
w = sys.stdout.buffer
for i in range(n):
    if i in (150, 300):
        while not os.path.exists(gate + str(i)):
            time.sleep(0.005)
    w.write(b"line %05d " % i + bytes([0x80 + i % 128]) * (i % 7) + b" end\n")
    if i % 10 == 0:
        w.write(b"half-%05d-" % i)
        w.flush()
        time.sleep(0.002)
        w.write(b"line\n")
    w.flush()
    time.sleep(0.002)
sys.exit(7)
"""


def expected() -> bytes:
    out = b""
    for i in range(N_LINES):
        out += b"line %05d " % i + bytes([0x80 + i % 128]) * (i % 7) + b" end\n"
        if i % 10 == 0:
            out += b"half-%05d-line\n" % i
    return out


def delivered_through(agent: AgentProc, job_id: str) -> tuple[bytes, int]:
    """What the client has processed from its events, and its cursor (last next_offset)."""
    logs = [e for e in agent.job_events(job_id) if e["event"] == "log"]
    data = b"".join(data_bytes(e) for e in logs)
    return data, (logs[-1]["next_offset"] if logs else 0)


def test_kill9_agent_then_reattach_by_cursor(
    start_agent: Callable[..., AgentProc], tmp_path: Path
) -> None:
    gate = str(tmp_path / "gate")
    a1 = start_agent(keep_raw=True)
    a1.hello()
    a1.call(
        "job.start",
        job_id="long",
        run_id="r",
        step_id="train",
        argv=[PY, "-c", PRODUCER, gate, str(N_LINES)],
        detach=True,
    )
    a1.call("job.watch", job_id="long", offset=0)
    a1.wait_until(lambda: sum(e["event"] == "log" for e in a1.events) >= 5, 30, "some log events")
    a1.kill9()
    got1, cursor = delivered_through(a1, "long")
    assert 0 < cursor == len(got1)

    # Second agent: a relaunch attempt is refused, the job is still running, reattach.
    a2 = start_agent(keep_raw=True)
    a2.hello()
    with pytest.raises(AgentCallError) as e:
        a2.call(
            "job.start", job_id="long", argv=[PY, "-c", PRODUCER, gate, str(N_LINES)], detach=True
        )
    assert e.value.type == "exists"
    info = a2.call("job.status", job_id="long")
    assert info["state"] == "running", "the job must survive the agent"
    a2.call("job.watch", job_id="long", offset=cursor)
    Path(gate + "150").touch()
    phase2 = expected().index(b"line 00150 ")
    a2.wait_until(lambda: any(e.get("next_offset", 0) > phase2 for e in a2.events), 30, "phase 2")
    a2.kill9()
    got2, cursor2 = delivered_through(a2, "long")
    assert cursor2 == cursor + len(got2)

    # Third agent: reattach again and follow to the end.
    a3 = start_agent(keep_raw=True)
    a3.hello()
    assert a3.call("job.status", job_id="long")["state"] == "running"
    Path(gate + "300").touch()
    got3, end = a3.watch_bytes("long", offset=cursor2)
    full = got1 + got2 + got3
    assert full == expected()
    lines = full.splitlines()
    assert len(lines) == len(set(lines)) == N_LINES + N_LINES // 10  # every line exactly once
    assert end["exit"]["exit_code"] == 7 and end["exit"]["reason"] == "exited"
    info = a3.call("job.status", job_id="long")
    assert info["state"] == "exited" and info["exit"]["exit_code"] == 7
    assert info["log_size"] == len(full)
    assert not a1.garbage and not a2.garbage and not a3.garbage


def test_bound_job_dies_with_its_agent(start_agent: Callable[..., AgentProc]) -> None:
    a1 = start_agent()
    started = a1.call("job.start", job_id="bound", shell="echo up; sleep 300", detach=False)
    a1.call("job.start", job_id="free", shell="sleep 300", detach=True)
    a1.kill9()
    a2 = start_agent()
    info = a2.wait_state("bound", ("exited", "lost"), timeout=30)
    assert info["exit"]["reason"] == "agent_lost" and info["exit"]["signal"] == signal.SIGTERM
    wait_for(lambda: not alive(started["pid"]), 10, "bound job gone")
    assert a2.call("job.status", job_id="free")["state"] == "running"
    a2.call("job.cancel", job_id="free", grace_s=5)


def test_bound_job_dies_when_the_agent_exits_on_eof(start_agent: Callable[..., AgentProc]) -> None:
    a1 = start_agent()
    a1.call("job.start", job_id="bound2", shell="sleep 300", detach=False)
    assert a1.close() == 0
    a2 = start_agent()
    info = a2.wait_state("bound2", ("exited",), timeout=30)
    assert info["exit"]["reason"] == "agent_lost"


def test_detached_job_survives_a_hangup_of_the_agent(start_agent: Callable[..., AgentProc]) -> None:
    """SSH closing a session sends SIGHUP; the job is in its own session and never sees it."""
    a1 = start_agent()
    a1.call("job.start", job_id="hup", shell="sleep 300", detach=True)
    a1.proc.send_signal(signal.SIGHUP)
    a1.proc.wait(10)
    a2 = start_agent()
    assert a2.call("job.status", job_id="hup")["state"] == "running"
    a2.call("job.cancel", job_id="hup", grace_s=5)


def test_job_list_after_restart(start_agent: Callable[..., AgentProc], spool: Path) -> None:
    a1 = start_agent()
    a1.call("job.start", job_id="r1-a", run_id="run1", shell="exit 0", detach=True)
    a1.call("job.start", job_id="r1-b", run_id="run1", shell="sleep 300", detach=True)
    a1.call("job.start", job_id="r2-a", run_id="run2", shell="exit 1", detach=True)
    a1.wait_state("r1-a", ("exited",))
    a1.kill9()
    a2 = start_agent()
    jobs = {j["job_id"]: j for j in a2.call("job.list", run_id="run1")["jobs"]}
    assert set(jobs) == {"r1-a", "r1-b"}
    assert jobs["r1-a"]["state"] == "exited" and jobs["r1-b"]["state"] == "running"
    assert len(a2.call("job.list")["jobs"]) == 3
    a2.call("job.cancel", job_id="r1-b", grace_s=5)
