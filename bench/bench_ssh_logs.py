"""Log streaming from a remote job through a real OpenSSH sshd on loopback, against `ssh box cat`.

The client is the engine's own path: `SshTransport` (asyncssh) + `HostSession.follow_job`, with
the agent bootstrapped on the "box" (a test sshd on 127.0.0.1, as tests/ssh does; needs root).
Every line the job writes starts with its CLOCK_MONOTONIC write time (same machine, same clock),
so the client measures write-to-delivery latency per line. For short (~80 B) and long (~4 KiB)
lines:

- paced: the job writes a steady rate, flushing each line: latency p50/p99 as an operator
  watching a training log sees it;
- burst: the job writes as fast as it can (64 KiB writes): delivered lines/s end to end, the
  latency under that load, and the agent's CPU use (from /proc/<agent pid>/stat);
- replay: the finished log streamed again from offset 0 (pure transport: agent, sshd, asyncssh,
  engine decode), against `ssh box cat LOG` of the same file through the same sshd (OpenSSH
  client, same consumer work: line count + sha256), in the same run: the ratio.

    python bench/bench_ssh_logs.py [--short-lines 300000] [--long-lines 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from machine_info import describe, save_result  # bench/ is sys.path[0] when run as a script

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from runbook.agent_client import HostSession  # noqa: E402
from runbook.transports import TransportOptions  # noqa: E402
from runbook.transports.ssh import SshTransport  # noqa: E402
from tests.ssh.helpers import host_block  # noqa: E402
from tests.ssh.sshd import Sshd, have_sshd, keygen  # noqa: E402

# argv: n, width, rate (lines/s; 0 = as fast as possible). Each line: "<monotonic> <seq> pad\n".
WRITER = r"""
import os, sys, time
n, width, rate = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
pad = "abcdefghijklmnopqrstuvwxyz0123456789" * (width // 36 + 1)
out = sys.stdout
mono = time.monotonic
if rate > 0:
    t0 = mono()
    for i in range(n):
        head = "%.6f %08d " % (mono(), i)
        out.write(head + pad[: width - len(head) - 1] + "\n")
        out.flush()
        delay = t0 + (i + 1) / rate - mono()
        if delay > 0:
            time.sleep(delay)
else:
    buf, size = [], 0
    for i in range(n):
        head = "%.6f %08d " % (mono(), i)
        line = head + pad[: width - len(head) - 1] + "\n"
        buf.append(line)
        size += width
        if size >= 65536:
            out.write("".join(buf))
            out.flush()
            buf, size = [], 0
    out.write("".join(buf))
    out.flush()
"""


def machine() -> dict[str, Any]:
    import asyncssh

    ssh_v = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    return describe(asyncssh=asyncssh.__version__, openssh=ssh_v)


def cpu_seconds(pid: int) -> float:
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    f = raw[raw.rfind(b")") + 2 :].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class Collector:
    """The client side: splits delivered bytes into lines, timestamps each against its stamp."""

    def __init__(self, stamped: bool = True) -> None:
        self.stamped = stamped
        self.partial = b""
        self.lines = 0
        self.bytes = 0
        self.sha = hashlib.sha256()
        self.latency_ms: list[float] = []
        self.first = self.last = 0.0

    def __call__(self, start: int, end: int, data: bytes) -> None:
        now = time.monotonic()
        if not self.first:
            self.first = now
        self.last = now
        self.bytes += len(data)
        self.sha.update(data)
        buf = self.partial + data
        *lines, self.partial = buf.split(b"\n")
        self.lines += len(lines)
        if self.stamped:
            for line in lines:
                self.latency_ms.append((now - float(line[: line.index(b" ")])) * 1000.0)


async def follow(session: HostSession, job_id: str, stamped: bool = True) -> Collector:
    c = Collector(stamped)
    end = await session.follow_job(job_id, 0, c)
    assert end.get("exit", {}).get("exit_code") == 0, end
    return c


async def run_kind(
    session: HostSession, box_home: Path, kind: str, width: int, n: int, rate: float, paced_n: int
) -> dict[str, Any]:
    agent_pid = int(session.hello["pid"])
    py = "python3"

    async def start(job: str, count: int, r: float) -> None:
        await session.call(
            "job.start",
            job_id=job,
            run_id="bench",
            argv=[py, "-c", WRITER, str(count), str(width), str(r)],
            detach=True,
        )

    tag = uuid.uuid4().hex[:8]
    # paced: steady rate, per-line flush
    await start(f"{kind}-paced-{tag}", paced_n, rate)
    paced = await follow(session, f"{kind}-paced-{tag}")

    # burst: as fast as the writer goes; agent CPU over the whole follow
    job = f"{kind}-burst-{tag}"
    cpu0, t0 = cpu_seconds(agent_pid), time.monotonic()
    await start(job, n, 0)
    burst = await follow(session, job)
    burst_wall, burst_cpu = time.monotonic() - t0, cpu_seconds(agent_pid) - cpu0

    # replay of the finished log, 3 times, median
    replays = []
    for _ in range(3):
        cpu0, t0 = cpu_seconds(agent_pid), time.monotonic()
        c = await follow(session, job, stamped=False)
        replays.append((time.monotonic() - t0, cpu_seconds(agent_pid) - cpu0, c))
    replays.sort(key=lambda r: r[0])
    rep_s, rep_cpu, rep = replays[1]
    log = box_home / ".eagle-tui" / "spool" / "jobs" / job / "log"
    return {
        "line_bytes": width,
        "paced": {
            "lines": paced.lines,
            "rate_lines_per_s": rate,
            "latency_ms_p50": round(pct(paced.latency_ms, 0.5), 2),
            "latency_ms_p99": round(pct(paced.latency_ms, 0.99), 2),
            "latency_ms_max": round(max(paced.latency_ms), 2),
        },
        "burst": {
            "lines": burst.lines,
            "bytes": burst.bytes,
            "seconds": round(burst_wall, 3),
            "lines_per_s": round(burst.lines / burst_wall),
            "mb_per_s": round(burst.bytes / burst_wall / 1e6, 2),
            "latency_ms_p50": round(pct(burst.latency_ms, 0.5), 1),
            "latency_ms_p99": round(pct(burst.latency_ms, 0.99), 1),
            "agent_cpu_s": round(burst_cpu, 3),
            "agent_cpu_pct": round(100 * burst_cpu / burst_wall, 1),
        },
        "replay": {
            "seconds": round(rep_s, 3),
            "lines_per_s": round(rep.lines / rep_s),
            "mb_per_s": round(rep.bytes / rep_s / 1e6, 2),
            "agent_cpu_s": round(rep_cpu, 3),
            "agent_cpu_pct": round(100 * rep_cpu / rep_s, 1),
            "runs_s": [round(r[0], 3) for r in replays],
            "sha256": rep.sha.hexdigest(),
        },
        "_log": str(log),
        "_lines": rep.lines,
        "_sha": burst.sha.hexdigest(),
    }


def ssh_cmd(config: Path, known: Path, *remote: str) -> list[str]:
    return ["ssh", "-F", str(config), "-o", f"UserKnownHostsFile={known}", "-o",
            "BatchMode=yes", "box", *remote]  # fmt: skip


def ssh_setup_s(config: Path, known: Path) -> float:
    """`ssh box true`: connection, kex, auth, session; subtracted from `cat` for the net rate."""
    runs = []
    for _ in range(3):
        t0 = time.monotonic()
        subprocess.run(ssh_cmd(config, known, "true"), check=True)
        runs.append(time.monotonic() - t0)
    return sorted(runs)[1]


def ssh_cat(config: Path, known: Path, path: str) -> dict[str, Any]:
    setup = ssh_setup_s(config, known)
    runs = []
    for _ in range(3):
        sha = hashlib.sha256()
        n = lines = 0
        t0 = time.monotonic()
        p = subprocess.Popen(ssh_cmd(config, known, "cat", path), stdout=subprocess.PIPE)
        assert p.stdout is not None
        fd = p.stdout.fileno()
        while chunk := os.read(fd, 1 << 20):
            n += len(chunk)
            lines += chunk.count(b"\n")
            sha.update(chunk)
        assert p.wait() == 0
        runs.append((time.monotonic() - t0, n, lines, sha.hexdigest()))
    runs.sort()
    s, n, lines, digest = runs[1]
    net = max(s - setup, 1e-3)
    return {
        "seconds": round(s, 3),
        "setup_s": round(setup, 3),
        # the rate net of connection setup (the agent's figures reuse a live connection)
        "lines_per_s": round(lines / net),
        "mb_per_s": round(n / net / 1e6, 2),
        "lines_per_s_with_setup": round(lines / s),
        "runs_s": [round(r[0], 3) for r in runs],
        "sha256": digest,
        "lines": lines,
    }


async def bench(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    keys = work / "keys"
    keys.mkdir()
    user = keygen(keys / "id_ed25519")
    sshd = Sshd(work / "sshd", [user.with_suffix(".pub")], work / "home", uuid.uuid4().hex)
    sshd.start()
    try:
        config = work / "ssh_config"
        config.write_text(host_block("box", sshd.address, sshd.port, user))
        known = work / "known_hosts"
        known.write_text(sshd.known_hosts_line())
        opts = TransportOptions(known_hosts=str(known), ssh_config=str(config))
        transport = SshTransport.from_options("box", work / "state", opts)
        session = HostSession("box", transport)
        t0 = time.monotonic()
        await session.connection()
        bootstrap_s = time.monotonic() - t0
        results: dict[str, Any] = {}
        for kind, width, n, rate, paced_n in (
            ("short", 80, args.short_lines, 2000.0, 4000),
            ("long", 4096, args.long_lines, 500.0, 1000),
        ):
            r = await run_kind(session, sshd.home, kind, width, n, rate, paced_n)
            cat = ssh_cat(config, known, r.pop("_log"))
            assert cat["sha256"] == r.pop("_sha") == r["replay"]["sha256"], "exact bytes"
            assert cat["lines"] == r.pop("_lines")
            r["ssh_cat"] = cat
            r["ratio_over_ssh_cat"] = {
                "replay_lines_per_s": round(r["replay"]["lines_per_s"] / cat["lines_per_s"], 3),
                "burst_lines_per_s": round(r["burst"]["lines_per_s"] / cat["lines_per_s"], 3),
            }
            results[kind] = r
        await session.close()
        return {"bootstrap_s": round(bootstrap_s, 3), "results": results}
    finally:
        sshd.stop()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--short-lines", type=int, default=300_000)
    ap.add_argument("--long-lines", type=int, default=10_000)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "ssh_logs.json")
    args = ap.parse_args()
    if os.geteuid() != 0 or not have_sshd():
        print("needs root and OpenSSH sshd (the box is a test sshd on loopback)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-ssh-logs-"))
    try:
        mach = machine()
        out = asyncio.run(bench(args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {
        "benchmark": "ssh_logs",
        "description": "job log streaming through a real sshd on loopback (SshTransport + "
        "HostSession.follow_job, the engine's path) vs `ssh box cat LOG` of the same file; "
        "write-to-delivery latency from per-line CLOCK_MONOTONIC stamps",
        "machine": mach,
        "params": {"short_lines": args.short_lines, "long_lines": args.long_lines},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **out,
    }
    save_result(args.out, doc)
    print(f"bootstrap (connect, probe, upload, start agent, hello): {out['bootstrap_s']:.2f}s")
    for kind, r in out["results"].items():
        p, b, rep, cat = r["paced"], r["burst"], r["replay"], r["ssh_cat"]
        print(f"{kind} lines ({r['line_bytes']} B):")
        print(
            f"  paced {p['rate_lines_per_s']:.0f}/s : latency p50 {p['latency_ms_p50']:.1f} ms, "
            f"p99 {p['latency_ms_p99']:.1f} ms ({p['lines']} lines)"
        )
        print(
            f"  burst (live)   : {b['lines_per_s']:>10,} lines/s {b['mb_per_s']:7.1f} MB/s, "
            f"latency p50 {b['latency_ms_p50']:.0f} ms p99 {b['latency_ms_p99']:.0f} ms, "
            f"agent CPU {b['agent_cpu_pct']:.0f}%"
        )
        print(
            f"  replay (file)  : {rep['lines_per_s']:>10,} lines/s {rep['mb_per_s']:7.1f} MB/s, "
            f"agent CPU {rep['agent_cpu_pct']:.0f}%"
        )
        print(
            f"  ssh box cat    : {cat['lines_per_s']:>10,} lines/s {cat['mb_per_s']:7.1f} MB/s "
            f"(net of {cat['setup_s']:.2f}s connection setup)"
        )
        print(
            f"  ratio over cat : replay {r['ratio_over_ssh_cat']['replay_lines_per_s']:.3f}, "
            f"burst {r['ratio_over_ssh_cat']['burst_lines_per_s']:.3f}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
