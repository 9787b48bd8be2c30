"""A fast dedicated runbook for the job-lifecycle and exactly-once attacks, and the probes that
count what happened: executions (side-effect files), lines shown (console) and mirrored, exits.

Every step runs `job.py`, which appends its pid to `<work>/exec.<step>` when it starts (so a
relaunch is counted), prints numbered lines, writes `<work>/done.<step>` when it has run to its
end, and exits with the code it was given. With `graceful`, SIGTERM makes it finish up and exit
0 (a trainer that checkpoints on TERM): it still "ran to an exit"; after its lines it keeps
running until that TERM (30 s at most), so an attack that lands late (a loaded machine) still
hits this job, never the next step's launch.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

from remote_agent.agent.procs import is_alive
from tests.runbook.conftest import Cli
from tests.support.waiting import wait_for  # noqa: F401  (re-exported: attack files import it here)

JOB = """\
import os, signal, sys, time
work, step, n, dt, code, graceful = sys.argv[1:7]
n, dt, code = int(n), float(dt), int(code)
with open(os.path.join(work, "exec." + step), "a") as f:
    f.write("%d\\n" % os.getpid())
def finish(*_):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop request is enough
    with open(os.path.join(work, "done." + step), "a") as f:
        f.write("ok\\n")
    sys.exit(0 if _ else code)
if graceful == "1":
    signal.signal(signal.SIGTERM, finish)
for i in range(n):
    print("%s %05d" % (step, i), flush=True)
    time.sleep(dt)
if graceful == "1":  # runs until told to stop (bounded), so a late stop request still finds it
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.05)
finish()
"""

LINE_RE = re.compile(r"│ (s\d+ \d{5})\s*$")


class Rig:
    """One run's directories, its runbook and the processes to attack."""

    def __init__(
        self, tmp: Path, cli: Any = None, spool: Path | None = None, host: str | None = None
    ) -> None:
        """The local transport by default; `cli`/`spool`/`host` for a box over SSH."""
        self.tmp = tmp
        self.work = tmp / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "job.py").write_text(JOB)
        self.cli = cli or Cli(tmp)
        self.spool = spool or tmp / "spool"
        self.host = host
        self.find_agents: Any = None  # over SSH: the test sshd's tagged agents
        self.name = f"faults-{os.getpid()}-{id(self) % 100000}"
        self.consoles: list[str] = []  # every client session's stdout
        self.proc: subprocess.Popen | None = None
        self._out: list[str] = []
        self._reader: threading.Thread | None = None

    def runbook(
        self,
        steps: int,
        lines: int,
        dt: float,
        code: int = 0,
        detach: bool = True,
        graceful: bool = False,
        extra: str = "",
    ) -> Path:
        body = f"name: {self.name}\n" + (f"host: {self.host}\n" if self.host else "") + "steps:\n"
        for k in range(steps):
            body += textwrap.dedent(f"""\
              - id: s{k}
                title: Step {k}
                detach: {"true" if detach else "false"}
                run: [python3, {self.work}/job.py, {self.work}, s{k}, "{lines}", "{dt}", "{code}", "{int(graceful)}"]
            """)
            body += textwrap.indent(extra, "  ")
        return self.cli.runbook(body)

    # --- the client (engine + console in one process) -----------------------------------------

    def start(self, *args: str) -> subprocess.Popen:
        self.proc = self.cli.popen(*args)
        self._out = []
        self._reader = threading.Thread(target=self._read, args=(self.proc, self._out))
        self._reader.start()
        return self.proc

    @staticmethod
    def _read(proc: subprocess.Popen, out: list[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)

    def finish(self, timeout: float = 60) -> int:
        assert self.proc is not None and self._reader is not None
        code = self.proc.wait(timeout)
        self._reader.join(10)
        self.consoles.append("".join(self._out))
        return code

    def kill_client(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.finish()

    # --- what is on the box ------------------------------------------------------------------

    def job_dir(self, step: str) -> Path | None:
        jobs = self.spool / "jobs"
        if not jobs.exists():
            return None
        found = sorted(
            d for d in jobs.iterdir() if f"-{self.name}-" in d.name and f".{step}." in d.name
        )
        return found[-1] if found else None

    def agents(self) -> list[int]:
        if self.find_agents is not None:
            return self.find_agents()
        out = subprocess.run(
            ["pgrep", "-f", f"remote_agent serve --spool {self.spool}"],
            capture_output=True,
            text=True,
        ).stdout
        return [int(p) for p in out.split()]

    def log_lines(self, step: str) -> int:
        d = self.job_dir(step)
        try:
            return (d / "log").read_bytes().count(b"\n") if d else 0
        except FileNotFoundError:
            return 0

    def jobwrap_pid(self, step: str) -> int | None:
        d = self.job_dir(step)
        try:
            return int((d / "pid").read_text().split()[0]) if d else None
        except (FileNotFoundError, ValueError, IndexError):
            return None

    def kill_jobs(self) -> None:
        """What a reboot does to the box's processes (this rig's jobs only, verified by start
        time so that a reused pid is never hit)."""
        jobs = self.spool / "jobs"
        for d in jobs.iterdir() if jobs.exists() else ():
            if f"-{self.name}-" not in d.name:
                continue
            for name in ("pgid", "pid"):
                try:
                    pid, start = (int(x) for x in (d / name).read_text().split()[:2])
                except (FileNotFoundError, ValueError):
                    continue
                if not is_alive(pid, start):
                    continue
                try:
                    os.killpg(pid, signal.SIGKILL) if name == "pgid" else os.kill(pid, 9)
                except ProcessLookupError:
                    pass

    # --- counts ------------------------------------------------------------------------------

    def executions(self, step: str) -> int:
        p = self.work / f"exec.{step}"
        return len(p.read_text().split()) if p.exists() else 0

    def done(self, step: str) -> bool:
        return (self.work / f"done.{step}").exists()

    def state(self) -> dict:
        runs = sorted((self.cli.state / "runs").glob("*/state.json"))
        return json.loads(runs[-1].read_text())["steps"]

    def console_counts(self, step: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for text in self.consoles:
            for line in text.splitlines():
                m = LINE_RE.search(line)
                if m and m.group(1).startswith(step + " "):
                    counts[m.group(1)] = counts.get(m.group(1), 0) + 1
        return counts

    def mirror_counts(self, step: str) -> dict[str, int]:
        rec = self.state()[step]
        counts: dict[str, int] = {}
        if rec.get("log_file") and Path(rec["log_file"]).exists():
            for line in Path(rec["log_file"]).read_text().splitlines():
                counts[line] = counts.get(line, 0) + 1
        return counts

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.finish()
        self.kill_jobs()


def expected(step: str, n: int) -> dict[str, int]:
    return {f"{step} {i:05d}": 1 for i in range(n)}


PY = sys.executable
