"""Log streaming through the remote agent over the local transport, against `cat` in a pipe.

For short (~80 B) and long (~4 KiB) lines: a job writes a deterministic log of --mb MB; then
the client (tests/agent/agent_proc.py: the agent as a subprocess over pipes) streams it with
`job.watch` from offset 0 to `job_end`, decoding every event back to bytes; the peer is
`cat LOG` read through a pipe by the same process. Both consumers do the same work per byte
(count lines, sha256), and the sha256 proves the agent delivered the exact bytes. A third
figure streams while the job is still writing (end to end, bounded by the writer).

    python bench/bench_agent_logs.py [--mb 200] [--out bench/results/agent_logs.json]

`--single-line` measures the whole client instead (issue 25, bounded memory): `eagle-tui run
--auto` of a job printing ONE line of --mb MB with no newline, through the engine, the mirror
and the console; the client's peak RSS (its own process) against the same run with a 1 MB line,
the streaming time (the step's start to end) against `cat` of the same log through a pipe, and
the mirror's sha256 against the job's log:

    python bench/bench_agent_logs.py --single-line [--mb 1000] [--out bench/results/agent_logs_single_line.json]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from machine_info import describe, save_result  # bench/ is sys.path[0] when run as a script

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "agent"))
sys.path.insert(0, str(REPO))  # this checkout first (not an installed copy)
from agent_proc import AgentProc  # noqa: E402

from remote_agent.agent.logwatch import CHUNK  # noqa: E402

# Writes `mb` MB of numbered lines of `width` bytes (newline included) in big buffered blocks.
WRITER = r"""
import sys
mb, width = int(sys.argv[1]), int(sys.argv[2])
total = mb * 1000 * 1000
pad = b"abcdefghijklmnopqrstuvwxyz0123456789" * (width // 36 + 1)
out = sys.stdout.buffer
buf, n, i = [], 0, 0
while n < total:
    head = b"%010d " % i
    line = head + pad[: width - len(head) - 1] + b"\n"
    buf.append(line)
    n += width
    i += 1
    if len(buf) >= 4096:
        out.write(b"".join(buf))
        buf.clear()
out.write(b"".join(buf))
"""

KINDS = {"short": 80, "long": 4096}


def cpu_seconds(pid: int) -> float:
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    f = raw[raw.rfind(b")") + 2 :].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


class Sink:
    """Consumes log events: bytes, lines, sha256; `done` is set at job_end."""

    def __init__(self) -> None:
        self.bytes = 0
        self.lines = 0
        self.sha = hashlib.sha256()
        self.events = 0
        self.offset = 0
        self.done = threading.Event()
        self.end: dict[str, Any] | None = None

    def __call__(self, e: dict[str, Any]) -> None:
        if e["event"] == "log":
            assert e["offset"] == self.offset, "events must be contiguous"
            data = e["data"].encode("utf-8", "surrogateescape")
            self.offset = e["next_offset"]
            self.bytes += len(data)
            self.lines += data.count(b"\n")
            self.sha.update(data)
            self.events += 1
        elif e["event"] == "job_end":
            self.end = e
            self.done.set()


def bench_cat(path: Path) -> dict[str, Any]:
    sha = hashlib.sha256()
    n = lines = 0
    t0 = time.perf_counter()
    p = subprocess.Popen(["cat", str(path)], stdout=subprocess.PIPE)
    assert p.stdout is not None
    fd = p.stdout.fileno()
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        n += len(chunk)
        lines += chunk.count(b"\n")
        sha.update(chunk)
    p.wait()
    dt = time.perf_counter() - t0
    return {"seconds": dt, "bytes": n, "lines": lines, "sha256": sha.hexdigest()}


def rates(r: dict[str, Any]) -> dict[str, Any]:
    return {
        **r,
        "mb_per_s": r["bytes"] / r["seconds"] / 1e6,
        "lines_per_s": r["lines"] / r["seconds"],
    }


def median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]


def run_kind(work: Path, kind: str, width: int, mb: int, repeats: int) -> dict[str, Any]:
    spool = work / f"spool-{kind}"
    py = sys.executable

    # 1. The job writes the log (timed, for reference), then the agent streams it from disk,
    #    `repeats` times (fresh watch from offset 0 each time); the median run is reported.
    agent = AgentProc(spool)
    runs = []
    try:
        agent.hello()
        t0 = time.perf_counter()
        agent.call(
            "job.start",
            job_id=f"{kind}-file",
            argv=[py, "-c", WRITER, str(mb), str(width)],
            detach=True,
        )
        agent.wait_state(f"{kind}-file", ("exited",), timeout=600)
        write_s = time.perf_counter() - t0
        log = spool / "jobs" / f"{kind}-file" / "log"
        for _ in range(repeats):
            sink = Sink()
            agent.on_event = sink
            cpu0 = cpu_seconds(agent.proc.pid)
            t0 = time.perf_counter()
            agent.call("job.watch", job_id=f"{kind}-file", offset=0)
            if not sink.done.wait(600):
                raise TimeoutError("no job_end")
            dt = time.perf_counter() - t0
            runs.append(
                rates(
                    {
                        "seconds": dt,
                        "bytes": sink.bytes,
                        "lines": sink.lines,
                        "sha256": sink.sha.hexdigest(),
                        "events": sink.events,
                        "agent_cpu_s": round(cpu_seconds(agent.proc.pid) - cpu0, 3),
                    }
                )
            )
    finally:
        agent.close()
    streamed = median(runs)

    # 2. The peer: cat of the same file through a pipe (page cache warm for both).
    cats = [rates(bench_cat(log)) for _ in range(repeats)]
    cat = median(cats)
    for r in runs + cats:
        assert r["sha256"] == cat["sha256"], "the agent must deliver the exact bytes"
        assert r["lines"] == cat["lines"]

    # 3. Live: watch while the job writes (end to end from job start to job_end).
    sink_live = Sink()
    agent = AgentProc(spool, on_event=sink_live)
    try:
        agent.hello()
        t0 = time.perf_counter()
        agent.call(
            "job.start",
            job_id=f"{kind}-live",
            argv=[py, "-c", WRITER, str(mb), str(width)],
            detach=True,
        )
        agent.call("job.watch", job_id=f"{kind}-live", offset=0)
        if not sink_live.done.wait(600):
            raise TimeoutError("no job_end")
        live_dt = time.perf_counter() - t0
    finally:
        agent.close()
    live = rates(
        {
            "seconds": live_dt,
            "bytes": sink_live.bytes,
            "lines": sink_live.lines,
            "sha256": sink_live.sha.hexdigest(),
        }
    )
    assert live["sha256"] == cat["sha256"]
    shutil.rmtree(spool)

    def pick(r: dict[str, Any]) -> dict[str, Any]:
        keep = ("seconds", "bytes", "lines", "mb_per_s", "lines_per_s", "events", "agent_cpu_s")
        return {k: round(r[k], 3) if isinstance(r[k], float) else r[k] for k in keep if k in r}

    return {
        "line_bytes": width,
        "log_bytes": cat["bytes"],
        "writer_seconds": round(write_s, 3),
        "agent_watch": pick(streamed),
        "cat_pipe": pick(cat),
        "runs_mb_per_s": {
            "agent_watch": [round(r["mb_per_s"], 1) for r in runs],
            "cat_pipe": [round(r["mb_per_s"], 1) for r in cats],
        },
        "ratio_agent_over_cat": {
            "mb_per_s": round(streamed["mb_per_s"] / cat["mb_per_s"], 3),
            "lines_per_s": round(streamed["lines_per_s"] / cat["lines_per_s"], 3),
        },
        "agent_watch_live": pick(live),
        # What the agent process itself can push (its CPU time only; the client's JSON decode
        # is the bottleneck of the end-to-end figure above on a 2-core box).
        "agent_cpu_mb_per_s": round(
            streamed["bytes"] / max(streamed["agent_cpu_s"], 1e-9) / 1e6, 1
        ),
    }


# The CLI in this process, reporting its own peak RSS (not the agent's nor the job's).
CLI_WRAP = r"""
import resource, sys
from eagle_tui.cli import main
code = main(sys.argv[2:])
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
sys.exit(code)
"""
ONE_LINE = "import os\nb = bytes(range(32, 127)) * 11300\nfor i in range({mb}):\n    os.write(1, b[:1 << 20])"


def client_run(work: Path, mb: int) -> dict[str, Any]:
    import json

    rb = work / f"line{mb}.yaml"
    rb.write_text(
        f"name: line{mb}\nsteps:\n  - id: big\n    title: one line\n"
        f"    run: [python3, -c, {json.dumps(ONE_LINE.format(mb=mb))}]\n"
    )
    env = dict(
        os.environ,
        EAGLE_TUI_STATE_DIR=str(work / "state"),
        EAGLE_TUI_SPOOL=str(work / "spool"),
        PYTHONPATH=str(REPO),
    )
    rss = work / f"rss{mb}"
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", CLI_WRAP, str(rss), "run", "--auto", "--new-run", str(rb)],
        env=env,
        capture_output=True,
    )
    total = time.perf_counter() - t0
    assert out.returncode == 0, out.stderr[-2000:]
    status = subprocess.run(
        [sys.executable, "-m", "eagle_tui.cli", "status", "--json"],
        env=env,
        capture_output=True,
        check=True,
    )
    rec = json.loads(status.stdout)["steps"]["big"]
    logs = sorted((work / "spool" / "jobs").glob("*/log"), key=lambda p: p.stat().st_mtime)
    with open(rec["log_file"], "rb") as f:
        mirror_sha = hashlib.file_digest(f, "sha256").hexdigest()
    return {
        "mb": mb,
        "client_peak_rss_mib": round(int(rss.read_text()) / 1024, 1),
        "step_seconds": round(rec["ended_at"] - rec["started_at"], 3),
        "cli_seconds": round(total, 3),
        "console_bytes": len(out.stdout),
        "mirror_sha256": mirror_sha,
        "box_log": logs[-1],
    }


def single_line(work: Path, mb: int) -> dict[str, Any]:
    small = client_run(work, 1)
    big = client_run(work, mb)
    cat = rates(bench_cat(big["box_log"]))
    assert cat["sha256"] == big["mirror_sha256"], "the mirror must be the job's exact bytes"
    for r in (small, big):
        r.pop("box_log")
    return {
        "one_mb_line": small,
        "big_line": big,
        "client_rss_growth_mib": round(
            big["client_peak_rss_mib"] - small["client_peak_rss_mib"], 1
        ),
        "cat_pipe": {k: round(cat[k], 3) for k in ("seconds", "mb_per_s")},
        "client_mb_per_s": round(mb * (1 << 20) / 1e6 / big["step_seconds"], 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mb", type=int, default=200, help="log size per kind, in MB (default 200)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "agent_logs.json")
    ap.add_argument("--repeats", type=int, default=3, help="runs per measurement (median kept)")
    ap.add_argument(
        "--dir", type=Path, default=None, help="scratch directory (default: a temp dir)"
    )
    ap.add_argument(
        "--single-line",
        action="store_true",
        help="the whole client (run --auto) on one line of --mb MB without a newline",
    )
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-agent-logs-", dir=args.dir))
    if args.single_line:
        return main_single_line(args, work)
    try:
        results = {
            kind: run_kind(work, kind, width, args.mb, args.repeats)
            for kind, width in KINDS.items()
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {
        "benchmark": "agent_logs",
        "description": "job.watch through the agent over pipes (local transport) vs cat | pipe, "
        "same file, same consumer work (line count + sha256)",
        "machine": describe(),  # a shared box skews absolute figures; ratios are same-run
        "params": {"mb": args.mb, "chunk_bytes": CHUNK, "repeats": args.repeats},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": results,
    }
    save_result(args.out, doc)
    for kind, r in results.items():
        a, c, live = r["agent_watch"], r["cat_pipe"], r["agent_watch_live"]
        print(f"{kind:5} lines ({r['line_bytes']} B), {r['log_bytes'] / 1e6:.0f} MB:")
        print(
            f"  agent job.watch : {a['mb_per_s']:8.1f} MB/s {a['lines_per_s']:12,.0f} lines/s "
            f"({a['events']} events, agent CPU {a['agent_cpu_s']:.2f}s of {a['seconds']:.2f}s)"
        )
        print(f"  cat | pipe      : {c['mb_per_s']:8.1f} MB/s {c['lines_per_s']:12,.0f} lines/s")
        print(f"  agent CPU cost  : {r['agent_cpu_mb_per_s']:.0f} MB per agent CPU second")
        print(
            f"  ratio agent/cat : {r['ratio_agent_over_cat']['mb_per_s']:.3f} "
            f"(medians of {r['runs_mb_per_s']})"
        )
        print(
            f"  live (job writing, end to end): {live['mb_per_s']:.1f} MB/s, "
            f"{live['lines_per_s']:,.0f} lines/s (writer alone {r['writer_seconds']:.2f}s)"
        )
    print(f"wrote {args.out}")
    return 0


def main_single_line(args: argparse.Namespace, work: Path) -> int:
    try:
        r = single_line(work, args.mb)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = args.out
    if out == REPO / "bench" / "results" / "agent_logs.json":
        out = REPO / "bench" / "results" / "agent_logs_single_line.json"
    doc = {
        "benchmark": "agent_logs_single_line",
        "description": "eagle-tui run --auto of one line of --mb MB without a newline (engine, "
        "mirror, console): client peak RSS vs a 1 MB line, streaming time vs cat | pipe",
        "machine": describe(),
        "params": {"mb": args.mb, "chunk_bytes": CHUNK},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": r,
    }
    save_result(out, doc)
    big, small = r["big_line"], r["one_mb_line"]
    print(f"one line of {args.mb} MB, no newline, through run --auto (local agent):")
    print(
        f"  client peak RSS : {big['client_peak_rss_mib']:.1f} MiB "
        f"(1 MB line: {small['client_peak_rss_mib']:.1f} MiB; growth {r['client_rss_growth_mib']} MiB)"
    )
    print(
        f"  ours            : {big['step_seconds']:.2f} s step, {r['client_mb_per_s']} MB/s "
        f"(whole CLI {big['cli_seconds']:.2f} s)"
    )
    print(
        f"  cat | pipe      : {r['cat_pipe']['seconds']:.2f} s, {r['cat_pipe']['mb_per_s']:.0f} MB/s"
    )
    print(f"  console wrote {big['console_bytes']:,} bytes; mirror sha256 = the job's log")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
