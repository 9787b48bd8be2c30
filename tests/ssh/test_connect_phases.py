"""Issue 28 Major 1 and 2: a host that cannot be reached, as the operator meets it.

Every connection phase is bounded and names itself (`ConnectTimeout 2` in the test's ssh config
sets the TCP and the SSH-handshake bounds): a loopback port that accepts TCP but never speaks
SSH (a socket server this test starts), an address that silently drops packets (198.18.0.0/15
routed into a network namespace that does not forward: no traffic leaves this machine), a name
that does not resolve. The dry run still lists every step, where it would run and its command,
marks the host's guards "not evaluated", tries once (no endless retries), exits 5, and never
says "nothing blocked"; interrupting it does not talk of jobs on the box.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.paths import REPO

from .netns import NetnsPair, _ip, have_netns

RUNBOOK = REPO / "tests" / "tui" / "runbooks" / "cockpit.yaml"
STEPS = ("prepare", "check", "wipe", "train", "report")


class SilentServer:
    """Accepts TCP on a loopback port and never sends a byte (not an SSH server)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.fixture
def silent():
    server = SilentServer()
    yield server
    server.close()


def cli_argv(tmp_path: Path, host: str, *extra: str) -> list[str]:
    config = tmp_path / "ssh_config"
    config.write_text("Host *\n  ConnectTimeout 2\n")
    argv = [sys.executable, "-m", "eagle_tui.cli", "run", str(RUNBOOK), "--host", host]
    argv += ["--state-dir", str(tmp_path / "state"), "--ssh-config", str(config)]
    argv += ["--known-hosts", str(tmp_path / "known_hosts"), "--set", f"work={tmp_path}/w"]
    return argv + list(extra)


def run_cli(argv: list[str], prefix: list[str] = (), timeout: float = 60) -> tuple:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    t0 = time.monotonic()
    out = subprocess.run(
        [*prefix, *argv], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO
    )
    return out, time.monotonic() - t0


def assert_dry_run_lists_everything(out, host: str, cause: str) -> None:
    text = out.stdout + out.stderr
    assert out.returncode == 5, text
    for sid in STEPS:
        assert f" {sid} on {host}" in text, (sid, text)
    assert "mkdir -p" in text  # the resolved command of `prepare`
    assert "not evaluated — host " in text  # each guard of the host says so
    assert text.count(f"{host}: not evaluated: host unreachable") == 1, text
    assert cause in text, text
    assert "--host user@host:port" in text
    assert "nothing blocked" not in text
    assert "dry run: guards of " in text and "unreachable" in text.splitlines()[-1]


def test_port_that_never_speaks_ssh(tmp_path, silent, tally):
    host = f"eagle@127.0.0.1:{silent.port}"
    out, took = run_cli(cli_argv(tmp_path, host, "--dry-run"))
    assert_dry_run_lists_everything(
        out, host, "no SSH handshake (the port accepts TCP but does not answer as an SSH server"
    )
    assert "within 2 s (ConnectTimeout)" in out.stdout + out.stderr
    assert f"ssh -p {silent.port} eagle@127.0.0.1" in out.stdout  # the hint in ssh's syntax
    held = silent.accepted == 1 and took < 30  # one attempt, bounded: no endless retry
    tally.trial("dry run against a port that never speaks SSH: one bounded attempt", held)
    assert held, (silent.accepted, took)
    assert not (tmp_path / "state" / "runs").exists()  # a dry run records nothing


def test_name_that_does_not_resolve(tmp_path):
    out, took = run_cli(cli_argv(tmp_path, "gpu8.invalid", "--dry-run"))
    assert_dry_run_lists_everything(out, "gpu8.invalid", "cannot resolve 'gpu8.invalid'")
    assert "~/.ssh/config entry `Host gpu8.invalid`" in out.stdout
    assert took < 30


def test_interrupting_a_dry_run_says_nothing_of_jobs(tmp_path, silent):
    config = tmp_path / "ssh_config"
    argv = cli_argv(tmp_path, f"eagle@127.0.0.1:{silent.port}", "--dry-run")
    config.write_text("Host *\n  ConnectTimeout 30\n")
    argv[argv.index("--ssh-config") + 1] = str(config)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
    )
    deadline = time.monotonic() + 30
    while silent.accepted == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    text, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, text
    assert "interrupted: dry run stopped; nothing changed" in text
    assert "reattach" not in text and "keep running on the box" not in text
    assert "nothing blocked" not in text


def test_auto_names_the_phase_and_its_bound(tmp_path, silent):
    """`--auto` keeps retrying a box that may come back, but each retry line says which phase
    ran out and its bound, once ("cannot reach X" is never repeated inside the line)."""
    argv = cli_argv(tmp_path, f"eagle@127.0.0.1:{silent.port}", "--auto")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "(attempt 2)" in line and "retrying in" in line:
                break
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "interrupted before the run opened; nothing was started or changed" in rest, rest
    assert "reattach" not in rest
    retry = next(x for x in lines if "(attempt 1)" in x and "retrying in" in x)
    assert "no SSH handshake" in retry and "within 2 s (ConnectTimeout)" in retry, retry
    assert retry.count("127.0.0.1") == 1, retry


@pytest.mark.netns
def test_address_that_drops_packets(tmp_path, tally):
    if not have_netns():
        pytest.skip("needs root and `ip netns` (iproute2)")
    net = NetnsPair(f"bh{os.getpid() % 10000}")
    try:
        net.create()
        # 198.18.255.254 is routed to the box's namespace, which does not forward: the SYNs
        # vanish there (no RST, no ICMP), as with a firewall that drops them.
        dark = "198.18.255.254"
        _ip("-n", net.client_ns, "route", "add", f"{dark}/32", "via", net.box_addr)
        host = f"root@{dark}:22"
        out, took = run_cli(cli_argv(tmp_path, host, "--dry-run"), prefix=net.exec_prefix())
    finally:
        net.close()
    assert_dry_run_lists_everything(out, host, "no TCP answer within 2 s (ConnectTimeout)")
    held = took < 30
    tally.trial("dry run against a blackholed address: one bounded attempt", held)
    assert held, took
