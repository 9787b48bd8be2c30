"""Faults between client and box: sshd in one network namespace, the CLI in another, a veth
pair between them. The keepalive is 1 s x 2 here (ServerAliveInterval/ServerAliveCountMax in
the test ssh config), so a dead link is noticed within about 3 s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.paths import REPO
from tests.support.waiting import wait_for

from .helpers import (
    OutputTail,
    SshCli,
    check_stream,
    host_block,
    stream_runbook,
)
from .netns import NetnsPair, have_netns
from .sshd import Sshd, agent_pids, kill_tagged, ppid

pytestmark = [pytest.mark.sshd, pytest.mark.netns]

KEEPALIVE = "  ServerAliveInterval 1\n  ServerAliveCountMax 2\n"


@dataclass
class Lab:
    net: NetnsPair
    sshd: Sshd


@pytest.fixture(scope="module")
def lab(tmp_path_factory, ssh_keys):
    if not have_netns():
        pytest.skip("needs root and `ip netns` (iproute2)")
    tag = str(os.getpid() % 100000)
    net = NetnsPair(tag)
    sshd = None
    try:
        net.create()
        root = tmp_path_factory.mktemp("netns-box")
        sshd = Sshd(
            root / "sshd",
            [ssh_keys["user"].with_suffix(".pub")],
            root / "home",
            uuid.uuid4().hex,
            address=net.box_addr,
            port=2222,
            netns=net.box_ns,
            client_netns=net.client_ns,
        ).start()
        yield Lab(net, sshd)
    finally:
        if sshd is not None:
            sshd.stop()
        net.close()


@pytest.fixture
def ns_cli(lab, tmp_path, ssh_keys):
    known = tmp_path / "known_hosts"
    known.write_text(lab.sshd.known_hosts_line())
    config = tmp_path / "ssh_config"
    config.write_text(host_block("box", lab.net.box_addr, 2222, ssh_keys["user"], KEEPALIVE))
    cli = SshCli(tmp_path, known, config, prefix=lab.net.exec_prefix())
    yield cli
    cli.cleanup()
    lab.net.restore()
    kill_tagged(lab.sshd.tag)


def lines_seen(tail: OutputTail) -> int:
    return tail.count("stream │ line ")


def wait_streaming(tail: OutputTail, more: int = 50, timeout: float = 30) -> None:
    start = lines_seen(tail)
    wait_for(lambda: lines_seen(tail) >= start + more, timeout, f"{more} more streamed lines")


def finish(cli: SshCli, tail: OutputTail, work: Path, home: Path) -> int:
    (work / "stop").touch()
    code = tail.wait(90)
    assert code == 1, tail.text()  # the job exits 3: the step fails, the exit code is kept
    n, _ = check_stream(cli, work, home)
    return n


def test_link_cut_mid_stream_longer_than_keepalive(lab, ns_cli, tmp_path):
    work = tmp_path / "work"
    rb = ns_cli.runbook(stream_runbook(work))
    tail = OutputTail(ns_cli.popen("run", str(rb), "--auto"))
    wait_streaming(tail, 100)
    cuts, detect = CUTS, []
    for k in range(cuts):
        seen = tail.count("reconnecting (attempt 1)")
        t0 = time.monotonic()
        lab.net.cut()
        wait_for(lambda s=seen: tail.count("reconnecting (attempt 1)") > s, 20, "keepalive")
        detect.append(time.monotonic() - t0)
        time.sleep(1.0)  # stay cut a while longer: reconnect attempts time out meanwhile
        lab.net.restore()
        wait_for(lambda k=k: tail.count(": connected") > k, 30, "reconnect")
        wait_streaming(tail)
    n = finish(ns_cli, tail, work, lab.sshd.home)
    print(f"\n{cuts} link cuts, keepalive noticed each after {[round(d, 1) for d in detect]} s; "
          f"{n} lines, none lost or repeated")  # fmt: skip
    assert all(d < 10 for d in detect)  # 1 s x 2 keepalive, not TCP's minutes


def _kill_session(pid: int) -> None:
    os.kill(ppid(pid), signal.SIGKILL)  # the agent's parent: the sshd session process


DISCONNECTS = int(os.environ.get("EAGLE_SSH_DISCONNECTS", "20"))  # more for a soak run
CUTS = int(os.environ.get("EAGLE_SSH_CUTS", "3"))


def test_disconnect_repeated_within_one_job(lab, ns_cli, tmp_path):
    """20 disconnects in one job: the server-side sshd session process and the agent killed in
    turn; every line still arrives exactly once and the job is never relaunched."""
    work = tmp_path / "work"
    rb = ns_cli.runbook(stream_runbook(work))
    tail = OutputTail(ns_cli.popen("run", str(rb), "--auto"))
    wait_streaming(tail, 50)
    done, killed = 0, set()
    for k in range(DISCONNECTS):
        agents = wait_for(lambda: [p for p in agent_pids(lab.sshd.tag) if p not in killed], 30)
        (agent,) = agents
        if k % 2 == 0:
            _kill_session(agent)
        else:
            os.kill(agent, signal.SIGKILL)
        killed.add(agent)
        wait_for(
            lambda: [p for p in agent_pids(lab.sshd.tag) if p not in killed], 30, "a new agent"
        )
        wait_streaming(tail, 20)
        done += 1
    n = finish(ns_cli, tail, work, lab.sshd.home)
    print(f"\n{done} disconnects within one job (sshd session / agent killed in turn); {n} lines")
    assert done == DISCONNECTS and tail.count("reconnecting (attempt 1)") >= DISCONNECTS


def test_client_killed_and_restarted(lab, ns_cli, tmp_path):
    work = tmp_path / "work"
    rb = ns_cli.runbook(stream_runbook(work))
    first = ns_cli.popen("run", str(rb), "--auto")
    tail = OutputTail(first)
    wait_streaming(tail, 100)
    first.kill()  # SIGKILL: no goodbye to the box
    first.wait()
    time.sleep(1.0)  # the job keeps writing meanwhile
    second = OutputTail(ns_cli.popen("run", str(rb), "--auto"))
    wait_for(lambda: second.count("reattached to job"), 30, "reattach")
    wait_streaming(second, 50)
    finish(ns_cli, second, work, lab.sshd.home)


def test_stats_sampled_while_cut_arrive_after_reconnect(lab, ns_cli, tmp_path):
    work = tmp_path / "work"
    rb = ns_cli.runbook(stream_runbook(work, dt=0.05))
    cmd = [
        *lab.net.exec_prefix(), sys.executable, str(REPO / "tests" / "ssh" / "stats_client.py"),
        str(rb), str(ns_cli.state), str(ns_cli.known_hosts), str(ns_cli.ssh_config),
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=ns_cli.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    ns_cli.procs.append(proc)
    tail = OutputTail(proc)

    def samples() -> list[tuple[float, dict]]:
        out = []
        for at, line in list(tail.lines):
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "stats" in msg:
                out.append((at, msg))
        return out

    wait_for(lambda: len(samples()) >= 2, 30, "stats samples")
    cut_wall = time.time()
    lab.net.cut()
    wait_for(lambda: tail.count('"conn": "reconnecting"'), 20, "the cut to be noticed")
    time.sleep(3.0)  # the box keeps sampling every 2 s while we are away
    restore_wall, restore_mono = time.time(), time.monotonic()
    lab.net.restore()
    wait_for(lambda: tail.count('"conn": "connected"') >= 2, 30, "reconnect")
    wait_for(lambda: any(at > restore_mono for at, _ in samples()), 30, "stats after")
    (work / "stop").touch()
    assert tail.wait(60) == 1, tail.text()
    got = samples()
    seqs = [m["stats"] for _, m in got]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs  # no gap, no repeat
    during = [(at, m) for at, m in got if cut_wall + 0.5 < m["t"] < restore_wall]
    assert during, got  # sampled on the box while the link was down...
    assert all(at > restore_mono for at, _ in during)  # ...delivered after reconnecting
