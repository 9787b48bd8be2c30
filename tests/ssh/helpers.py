"""The CLI over SSH, test ssh configs, and a streaming job whose output can be checked line by
line for loss, duplication and re-runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.support.paths import REPO


def host_block(alias: str, hostname: str, port: int, key: Path, extra: str = "") -> str:
    return (
        f"Host {alias}\n  HostName {hostname}\n  Port {port}\n  User root\n"
        f"  IdentityFile {key}\n  IdentitiesOnly yes\n  ConnectTimeout 5\n{extra}"
    )


def write_ssh_config(path: Path, key: Path, *, box, box2=None, extra: str = "") -> Path:
    text = host_block("box", box.address, box.port, key)
    if box2 is not None:
        text += host_block("box2", box2.address, box2.port, key)
        # the box reached through box2 as a jump host
        text += host_block("boxj", box.address, box.port, key, "  ProxyJump box2\n")
    path.write_text(text + extra)
    return path


class SshCli:
    """`eagle-tui` as a subprocess, with --ssh-config/--known-hosts of the test."""

    def __init__(
        self, tmp: Path, known_hosts: Path, ssh_config: Path, prefix: list[str] | None = None
    ) -> None:
        self.tmp = tmp
        self.state = tmp / "state"
        self.known_hosts = known_hosts
        self.ssh_config = ssh_config
        self.prefix = prefix or []
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        self.env = dict(env, EAGLE_TUI_STATE_DIR=str(self.state), PYTHONPATH=str(REPO))
        self.env["COLUMNS"] = "200"
        self.procs: list[subprocess.Popen] = []

    def runbook(self, text: str, name: str = "rb.yaml") -> Path:
        path = self.tmp / name
        path.write_text(textwrap.dedent(text))
        return path

    def cmd(self, *args: str, ssh: bool = True) -> list[str]:
        extra = (
            ["--ssh-config", str(self.ssh_config), "--known-hosts", str(self.known_hosts)]
            if ssh and args and args[0] == "run"
            else []
        )
        return [*self.prefix, sys.executable, "-m", "eagle_tui.cli", *args, *extra]

    def __call__(
        self, *args: str, timeout: float = 120, check: int | None = None, ssh: bool = True
    ) -> subprocess.CompletedProcess:
        out = subprocess.run(
            self.cmd(*args, ssh=ssh), env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check is not None:
            assert out.returncode == check, (
                f"exit {out.returncode}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}"
            )
        return out

    def popen(self, *args: str) -> subprocess.Popen:
        p = subprocess.Popen(
            self.cmd(*args),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.procs.append(p)
        return p

    def state_json(self) -> dict:
        return json.loads(self("status", "--json", check=0).stdout)

    def audit(self) -> list[dict]:
        out = self("audit", "export", "--format", "jsonl", check=0)
        return [json.loads(line) for line in out.stdout.splitlines()]

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


class OutputTail:
    """Collects a Popen's merged output in a thread, so tests can wait for a line."""

    def __init__(self, proc: subprocess.Popen) -> None:
        import threading

        self.proc = proc
        self.lines: list[tuple[float, str]] = []
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def count(self, needle: str) -> int:
        return sum(needle in line for _, line in self.lines)

    def wait(self, timeout: float = 120) -> int:
        code = self.proc.wait(timeout)
        self._t.join(5)
        return code


# A detached job that counts its launches, prints numbered lines until a stop file appears (or
# `limit` lines), then exits 3: loss, duplication, re-runs and the exit code are all visible.
STREAM_JOB = """\
import os, sys, time
work, dt, limit = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
with open(os.path.join(work, "starts"), "a") as f:
    f.write("%d\\n" % os.getpid())
i = 0
while i < limit and not os.path.exists(os.path.join(work, "stop")):
    print("line %06d %s" % (i, "x" * 40), flush=True)
    i += 1
    time.sleep(dt)
print("done %d" % i, flush=True)
sys.exit(3)
"""


def stream_runbook(work: Path, dt: float = 0.01, limit: int = 1_000_000, host: str = "box") -> str:
    work.mkdir(parents=True, exist_ok=True)
    (work / "job.py").write_text(STREAM_JOB)
    return f"""\
        name: stream
        host: {host}
        steps:
          - id: before
            title: Runs once
            run: echo before >> {work}/before
          - id: stream
            title: Stream numbered lines
            detach: true
            run: [python3, {work}/job.py, {work}, "{dt}", "{limit}"]
    """


def check_stream(cli: SshCli, work: Path, box_home: Path) -> tuple[int, dict]:
    """Every line exactly once, in order, identical to the box's own log; one launch; exit 3."""
    st = cli.state_json()["steps"]["stream"]
    assert st["status"] == "failed" and st["reason"] == "exit_code" and st["exit_code"] == 3, st
    assert st["attempt"] == 1, st
    assert len((work / "starts").read_text().split()) == 1  # launched once, never re-run
    assert (work / "before").read_text() == "before\n"  # a succeeded step never re-runs
    mirror = Path(st["log_file"]).read_bytes()
    box_log = box_home / ".eagle-tui" / "spool" / "jobs" / st["job_id"] / "log"
    assert mirror == box_log.read_bytes()
    lines = mirror.decode().splitlines()
    n = int(lines[-1].split()[1])
    assert lines == [f"line {i:06d} {'x' * 40}" for i in range(n)] + [f"done {n}"]
    return n, st
