"""Jobs through a real agent: start, status, read, watch, cancel, timeout, lost, secrets, spool."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
from pathlib import Path

import pytest

from remote_agent.agent.logwatch import CHUNK  # the agent's largest log event
from tests.support.procs import alive, procs_where
from tests.support.waiting import wait_for

from .agent_proc import AgentCallError, AgentProc, data_bytes
from .helpers import PY


def read_all(agent: AgentProc, job_id: str, max_bytes: int) -> bytes:
    """Page through job.read until eof (the job must have ended)."""
    out, offset = b"", 0
    while True:
        r = agent.call("job.read", job_id=job_id, offset=offset, max_bytes=max_bytes)
        assert r["offset"] == offset
        out += data_bytes(r)
        offset = r["next_offset"]
        if r["eof"]:
            return out


def test_start_status_read_exit_code(agent: AgentProc) -> None:
    started = agent.call(
        "job.start",
        job_id="j1",
        run_id="r1",
        step_id="s1",
        argv=[PY, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
        detach=True,
    )
    assert started["job_id"] == "j1" and started["pid"] == started["pgid"]
    assert started["spool_dir"] == str(agent.spool / "jobs" / "j1")
    info = agent.wait_state("j1", ("exited",))
    assert info["exit"]["exit_code"] == 3 and info["exit"]["signal"] is None
    assert info["exit"]["reason"] == "exited"
    assert (info["run_id"], info["step_id"], info["pid"]) == ("r1", "s1", started["pid"])
    assert info["boot_id_matches"] is True and info["log_size"] == 8
    assert sorted(read_all(agent, "j1", 3).split()) == [b"err", b"out"]
    assert agent.call("job.list", run_id="r1")["jobs"][0]["job_id"] == "j1"
    assert agent.call("job.list", run_id="other")["jobs"] == []
    h = agent.call("job.log_hash", job_id="j1", start=0, end=4)
    data = read_all(agent, "j1", 100)
    assert h == {"sha256": hashlib.sha256(data[:4]).hexdigest(), "size": 4, "start": 0, "end": 4}
    with pytest.raises(AgentCallError, match="past the end"):
        agent.call("job.log_hash", job_id="j1", start=0, end=9)
    with pytest.raises(AgentCallError, match="past the end"):
        agent.call("job.read", job_id="j1", offset=9)


def test_read_is_not_eof_while_running(agent: AgentProc) -> None:
    agent.call("job.start", job_id="run", shell="echo first; sleep 30", detach=True)
    wait_for(lambda: agent.call("job.status", job_id="run")["log_size"] == 6)
    r = agent.call("job.read", job_id="run", offset=0)
    assert data_bytes(r) == b"first\n" and r["eof"] is False
    agent.call("job.cancel", job_id="run", grace_s=5)
    r = agent.call("job.read", job_id="run", offset=6)
    assert r["data"] == "" and r["eof"] is True


def test_signal_is_recorded(agent: AgentProc) -> None:
    agent.call(
        "job.start",
        job_id="sig",
        argv=[PY, "-c", "import os; os.kill(os.getpid(), 10)"],
        detach=True,
    )
    e = agent.wait_state("sig", ("exited",))["exit"]
    assert (e["exit_code"], e["signal"], e["reason"]) == (None, 10, "signaled")


def test_environment_cwd_and_stdin(agent: AgentProc, tmp_path: Path) -> None:
    code = (
        "import os, sys; print(os.getcwd()); print(os.environ['MY_VAR']);"
        "print(os.environ['PYTHONUNBUFFERED']); print(repr(sys.stdin.read()));"
        # the job's parent, its leader (jobleader), leads the job's process group
        "print(os.getpgid(0) == os.getppid(), os.getsid(0) != os.getpid());"
        "import signal; print(signal.getsignal(signal.SIGHUP) == signal.SIG_DFL,"
        " signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    )
    agent.call(
        "job.start",
        job_id="env",
        argv=[PY, "-c", code],
        cwd=str(tmp_path),
        env={"MY_VAR": "hello world"},
        detach=True,
    )
    data, end = agent.watch_bytes("env")
    assert data.decode().splitlines() == [
        str(tmp_path),
        "hello world",
        "1",
        "''",
        "True True",
        "True True",
    ]
    assert end["exit"]["exit_code"] == 0


def test_ignored_signals_of_the_agent_do_not_leak_into_jobs(spool: Path) -> None:
    """An agent started with signals ignored (nohup, some launchers) still gives jobs the
    default dispositions: SIG_IGN survives exec, so the jobwrap must reset it."""
    import sys

    launcher = (
        "import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
        "signal.signal(signal.SIGUSR2, signal.SIG_IGN); "
        "os.execv(sys.executable, [sys.executable, '-m', 'remote_agent'] + sys.argv[1:])"
    )
    a = AgentProc(spool, argv=[sys.executable, "-c", launcher, "serve"])
    try:
        code = (
            "import signal; print([signal.getsignal(s) == signal.SIG_DFL "
            "for s in (signal.SIGHUP, signal.SIGUSR2)])"
        )
        a.call("job.start", job_id="hup", argv=[PY, "-c", code], detach=True)
        assert a.watch_bytes("hup")[0] == b"[True, True]\n"
    finally:
        a.close()


def test_duplicate_job_id_is_refused_with_exists(agent: AgentProc) -> None:
    agent.call("job.start", job_id="dup", shell="echo one", detach=True)
    agent.wait_state("dup", ("exited",))
    spec = (agent.spool / "jobs" / "dup" / "spec.json").read_bytes()
    with pytest.raises(AgentCallError) as e:
        agent.call("job.start", job_id="dup", shell="echo two", detach=True)
    assert e.value.type == "exists"
    assert (agent.spool / "jobs" / "dup" / "spec.json").read_bytes() == spec
    assert read_all(agent, "dup", 100) == b"one\n"


def test_a_job_that_cannot_start_is_reported(agent: AgentProc) -> None:
    with pytest.raises(AgentCallError) as e:
        agent.call("job.start", job_id="nostart", argv=["/no/such/program"], detach=True)
    assert e.value.type == "start_failed" and "/no/such/program" in e.value.message
    info = agent.call("job.status", job_id="nostart")
    assert info["state"] == "exited" and info["exit"]["exit_code"] == 127
    assert b"cannot start job" in read_all(agent, "nostart", 1000)


# Deterministic output exercising the log path: binary and invalid UTF-8, a line far longer
# than a chunk, many short lines, and a final line without a newline.
TRICKY = r"""
import os, sys
w = sys.stdout.buffer
w.write(bytes(range(256)) + b"\n")
w.write(b"bad utf8: \xff\xfe \xc3\x28 \xed\xa0\x80 lone \x80\n")
w.write(b"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n")
w.write(b"L" * 300000 + b"\n")
for i in range(3000):
    w.write(b"short line %d\n" % i)
w.write(b"M" * 70000 + b"\r\n")
w.write(b"tail without newline \xff")
w.flush()
"""


def tricky_expected() -> bytes:
    out = bytes(range(256)) + b"\n"
    out += b"bad utf8: \xff\xfe \xc3\x28 \xed\xa0\x80 lone \x80\n"
    out += b"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n"
    out += b"L" * 300000 + b"\n"
    out += b"".join(b"short line %d\n" % i for i in range(3000))
    out += b"M" * 70000 + b"\r\n" + b"tail without newline \xff"
    return out


def check_log_events(events: list[dict], start: int, final: int) -> None:
    """Contiguous offsets; a chunk ends at a newline unless it is full-size or the last one."""
    logs = [e for e in events if e["event"] == "log"]
    offset = start
    for i, e in enumerate(logs):
        data = data_bytes(e)
        assert e["offset"] == offset and e["next_offset"] == offset + len(data)
        assert 0 < len(data) <= CHUNK
        assert data.endswith(b"\n") or len(data) == CHUNK or i == len(logs) - 1
        offset = e["next_offset"]
    assert offset == final
    ends = [e for e in events if e["event"] == "job_end"]
    assert len(ends) == 1 and events[-1] is ends[0] and ends[0]["log_size"] == final


def test_watch_delivers_every_byte_exactly_once(agent: AgentProc) -> None:
    expected = tricky_expected()
    agent.call("job.start", job_id="tricky", argv=[PY, "-c", TRICKY], detach=True)
    data, end = agent.watch_bytes("tricky")
    assert data == expected
    assert end["state"] == "exited" and end["exit"]["exit_code"] == 0
    check_log_events(agent.job_events("tricky"), 0, len(expected))
    assert read_all(agent, "tricky", 100_000) == expected
    # The raw protocol lines are pure ASCII: bytes survive any transport.
    assert all(line.isascii() for line in agent.raw)


def test_watch_from_a_cursor_gets_the_rest(agent: AgentProc) -> None:
    expected = tricky_expected()
    agent.call("job.start", job_id="t2", argv=[PY, "-c", TRICKY], detach=True)
    agent.wait_state("t2", ("exited",))
    cursor = 300_500
    data, _ = agent.watch_bytes("t2", offset=cursor)
    assert data == expected[cursor:]
    check_log_events(agent.job_events("t2"), cursor, len(expected))


SLOW = r"""
import sys, time
for i in range(300):
    sys.stdout.write(f"line {i:04d} " + "x" * (i % 50) + "\n")
    if i % 3 == 0:
        sys.stdout.write("part-")   # a partial line, finished by the next write
        sys.stdout.flush()
        time.sleep(0.002)
        sys.stdout.write("done\n")
    sys.stdout.flush()
"""


def slow_expected() -> bytes:
    out = []
    for i in range(300):
        out.append(f"line {i:04d} " + "x" * (i % 50) + "\n")
        if i % 3 == 0:
            out.append("part-done\n")
    return "".join(out).encode()


def test_live_watch_while_the_job_writes(agent: AgentProc) -> None:
    agent.call("job.start", job_id="slow", argv=[PY, "-c", SLOW], detach=True)
    data, end = agent.watch_bytes("slow")
    assert data == slow_expected()
    # Partial lines are held back until complete while the job runs: every chunk ends a line.
    for e in agent.job_events("slow"):
        if e["event"] == "log":
            assert data_bytes(e).endswith(b"\n")


def test_unwatch_stops_events(agent: AgentProc) -> None:
    agent.call(
        "job.start",
        job_id="tick",
        detach=True,
        argv=[PY, "-c", "import time\nwhile True:\n print('tick', flush=True); time.sleep(0.01)"],
    )
    agent.call("job.watch", job_id="tick", offset=0)
    agent.wait_until(lambda: len(agent.events) >= 3, 10, "a few log events")
    assert agent.call("job.unwatch", job_id="tick") == {"stopped": 1}
    mark = len(agent.raw)  # lines received up to the unwatch response
    agent.call("job.cancel", job_id="tick", grace_s=5)
    agent.call("ping")
    later = [json.loads(x) for x in agent.raw[mark:]]
    assert not [e for e in later if e.get("event")]


def test_cancel_kills_the_whole_tree(agent: AgentProc, tmp_path: Path) -> None:
    """A torchrun-like tree: a TERM-ignoring parent, TERM-ignoring children, grandchildren,
    and a child that moved to its own process group."""
    pids = tmp_path / "pids"
    code = f"""
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
ign = "import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
kids = []
for i in range(2):
    kids.append(subprocess.Popen([sys.executable, "-c", ign +
        "g = subprocess.Popen(['sleep', '300']); print(g.pid, flush=True); time.sleep(300)"],
        stdout=subprocess.PIPE, text=True))
own = subprocess.Popen(["sleep", "300"], preexec_fn=os.setpgrp)
grand = [k.stdout.readline().strip() for k in kids]
open({str(pids)!r}, "w").write(" ".join(map(str, [os.getpid(), own.pid] + [k.pid for k in kids] + grand)))
print("ready", flush=True)
time.sleep(300)
"""
    started = agent.call("job.start", job_id="tree", argv=[PY, "-c", code], detach=True)
    wait_for(lambda: agent.call("job.status", job_id="tree")["log_size"] > 0, 30, "tree ready")
    tree_pids = [int(p) for p in pids.read_text().split()]
    assert len(tree_pids) == 6 and all(alive(p) for p in tree_pids)
    wrap = agent.call("job.status", job_id="tree")["jobwrap_pid"]
    info = agent.call("job.cancel", job_id="tree", grace_s=0.5)
    assert info["state"] == "exited"
    assert info["exit"]["reason"] == "cancelled" and info["exit"]["signal"] == signal.SIGKILL
    assert not [p for p in tree_pids if alive(p)]
    pgid = started["pgid"]
    # Nothing of the group or the session is left (the jobwrap itself exits after recording).
    wait_for(lambda: procs_where(lambda p, g, s: g == pgid or s == wrap) == [], 10, "tree gone")
    assert (agent.spool / "jobs" / "tree" / "cancel").exists()


def test_cancel_right_after_start(agent: AgentProc) -> None:
    agent.call("job.start", job_id="quick", shell="sleep 60", detach=True)
    info = agent.call("job.cancel", job_id="quick", grace_s=5)
    assert info["exit"]["reason"] == "cancelled" and info["exit"]["signal"] == signal.SIGTERM
    # Cancelling an ended job changes nothing.
    assert agent.call("job.cancel", job_id="quick")["exit"] == info["exit"]


def test_timeout(agent: AgentProc) -> None:
    agent.call("job.start", job_id="slowpoke", shell="sleep 60", timeout_s=0.3, detach=True)
    e = agent.wait_state("slowpoke", ("exited",))["exit"]
    assert (e["reason"], e["signal"], e["exit_code"]) == ("timeout", signal.SIGTERM, None)
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    agent.call(
        "job.start",
        job_id="stubborn",
        argv=[PY, "-c", stubborn],
        timeout_s=0.3,
        grace_s=0.3,
        detach=True,
    )
    e = agent.wait_state("stubborn", ("exited",))["exit"]
    assert (e["reason"], e["signal"]) == ("timeout", signal.SIGKILL)


def test_lost_when_jobwrap_and_job_are_killed(agent: AgentProc) -> None:
    agent.call("job.start", job_id="victim", shell="echo hi; sleep 60", detach=True)
    # job.start returns once the shell runs, not once it has echoed: kill only after "hi" is in
    # the log, or a loaded machine kills the shell first and the log is rightly empty.
    wait_for(lambda: agent.call("job.status", job_id="victim")["log_size"] == 3, 30, "hi")
    info = agent.call("job.status", job_id="victim")
    assert info["state"] == "running" and info["heartbeat_age_s"] < 5
    os.kill(info["jobwrap_pid"], signal.SIGKILL)
    os.killpg(info["pgid"], signal.SIGKILL)
    info = agent.wait_state("victim", ("lost",))
    assert info["exit"] is None and info["boot_id_matches"] is True
    assert info["fate"]["reason"] == "leader_gone"  # it ran: not "never started"
    data, end = agent.watch_bytes("victim")
    assert data == b"hi\n" and end["state"] == "lost" and end["exit"] is None
    assert end["fate"] == info["fate"]


def test_never_started_is_proven_not_guessed(agent: AgentProc) -> None:
    """A launch whose chain died before the job's leader recorded itself: the agent says the
    command never started (evidence), distinct from a job lost while it ran. The test process
    plays the launching agent: it makes the job dir with its `alive` lock, as job.start does."""
    from remote_agent.agent.spool import PGID, Spool

    spool = Spool(agent.spool)
    jd, held = spool.create_job("half")
    assert agent.call("job.status", job_id="half")["state"] == "running"  # launch under way
    os.close(held)  # the launcher is killed before the leader ran
    info = agent.call("job.status", job_id="half")
    assert info["state"] == "lost" and info["exit"] is None
    assert info["fate"]["reason"] == "never_started", info
    assert "never started" in info["fate"]["evidence"]
    _, end = agent.watch_bytes("half")
    assert end["state"] == "lost" and end["fate"]["reason"] == "never_started"

    jd, held = spool.create_job("ran")
    (jd.path / PGID).write_text("999999 1\n")  # the leader was on record, then died unrecorded
    os.close(held)
    info = agent.call("job.status", job_id="ran")
    assert (info["state"], info["fate"]["reason"]) == ("lost", "leader_gone"), info
    assert "lost while running" in info["fate"]["evidence"]


def test_job_killed_alone_is_not_lost(agent: AgentProc) -> None:
    agent.call("job.start", job_id="k9", shell="sleep 60", detach=True)
    info = agent.call("job.status", job_id="k9")
    os.killpg(info["pgid"], signal.SIGKILL)
    e = agent.wait_state("k9", ("exited", "lost"))["exit"]
    assert (e["reason"], e["signal"]) == ("signaled", signal.SIGKILL)


def test_pid_reuse_does_not_fake_a_running_job(agent: AgentProc) -> None:
    """A job dir whose jobwrap pid now belongs to another process (ours, with another start
    time) is lost, not running."""
    d = agent.spool / "jobs" / "reused"
    d.mkdir(mode=0o700)
    (d / "pid").write_text(f"{os.getpid()} 1\n")
    (d / "boot_id").write_text(Path("/proc/sys/kernel/random/boot_id").read_text())
    assert agent.call("job.status", job_id="reused")["state"] == "lost"
    (d / "boot_id").write_text("another-boot\n")
    info = agent.call("job.status", job_id="reused")
    assert info["state"] == "lost" and info["boot_id_matches"] is False


SECRET = "s3cr3t-Value-9f8e7d"


def test_secrets_never_reach_the_spool(agent: AgentProc) -> None:
    code = "import hashlib, os; print(hashlib.sha256(os.environ['API_TOKEN'].encode()).hexdigest())"
    agent.call(
        "job.start",
        job_id="sec",
        argv=[PY, "-c", code],
        env={"PLAIN": "visible"},
        secret_env={"API_TOKEN": SECRET},
        detach=False,
    )
    data, end = agent.watch_bytes("sec")
    assert data.decode().strip() == hashlib.sha256(SECRET.encode()).hexdigest()
    spec = json.loads((agent.spool / "jobs" / "sec" / "spec.json").read_text())
    assert spec["env"] == {"PLAIN": "visible"} and spec["secret_env_names"] == ["API_TOKEN"]
    files = [p for p in agent.spool.rglob("*") if p.is_file()]
    assert len(files) >= 8
    for p in files:
        assert SECRET.encode() not in p.read_bytes(), p
    assert SECRET.encode() not in b"".join(agent.raw)


def test_spool_is_user_only(agent: AgentProc) -> None:
    agent.call("job.start", job_id="perm", shell="echo x", detach=True)
    agent.wait_state("perm", ("exited",))
    agent.call("stats.sample", paths=["/"])
    for p in [agent.spool, *agent.spool.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o700 if p.is_dir() else 0o600), (p, oct(mode))


def test_spool_root_from_environment(tmp_path: Path) -> None:
    root = tmp_path / "deep" / "er" / "spool"
    a = AgentProc(root)  # --spool wins; $EAGLE_TUI_SPOOL is the fallback
    assert a.hello()["spool"] == str(root)
    a.close()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    env = dict(os.environ, EAGLE_TUI_SPOOL=str(tmp_path / "from-env"))
    import subprocess
    import sys

    from .agent_proc import REPO

    p = subprocess.run(
        [sys.executable, "-m", "remote_agent"],
        input=b'{"id":1,"op":"hello","args":{"protocol":1}}\n',
        capture_output=True,
        env={**env, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        timeout=30,
    )
    assert json.loads(p.stdout)["result"]["spool"] == str(tmp_path / "from-env")


def test_children_are_reaped(agent: AgentProc) -> None:
    for i in range(3):
        agent.call("job.start", job_id=f"z{i}", shell="true", detach=True)
    for i in range(3):
        agent.wait_state(f"z{i}", ("exited",))

    def zombies() -> list[str]:
        out = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    raw = Path(f"/proc/{name}/stat").read_bytes()
                except OSError:
                    continue
                f = raw[raw.rfind(b")") + 2 :].split()
                if int(f[1]) == agent.proc.pid and f[0] == b"Z":
                    out.append(name)
        return out

    wait_for(lambda: not zombies(), 10, "jobwraps reaped by the agent")
