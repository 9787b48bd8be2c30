"""Attack on "bounded client memory" (issue 25): one line of 256 MB with no newline, through
the real CLI (`run --auto`) and the real local agent.

Held = the client's peak RSS grows by less than 64 MiB over the same run with a 1 MiB line
(today's main: 1.66 GB for 150 MB), the mirror on disk is the job's bytes exactly (sha256),
and the console shows a bounded prefix of the line and counts the rest (`… N more bytes`).
The client's RSS is its own (`RUSAGE_SELF` in the CLI's process, measured by a wrapper), not
the agent's or the job's. Speed is measured in bench/bench_agent_logs.py (--single-line)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tracemalloc

from tests.runbook.conftest import Cli

WRAP = r"""
import resource, sys
from eagle_tui.cli import main
code = main(sys.argv[2:])
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
sys.exit(code)
"""
JOB = "import os\nb = bytes(range(32, 127)) * 11300\nfor i in range({mb}):\n    os.write(1, b[:1 << 20])"


def expected(mb: int) -> bytes:
    return (bytes(range(32, 127)) * 11300)[: 1 << 20] * mb


def _run(cli: Cli, mb: int) -> tuple[int, subprocess.CompletedProcess, str]:
    rb = cli.runbook(
        f"""\
        name: line{mb}
        steps:
          - id: big
            title: One line of {mb} MiB
            run: [python3, -c, {json.dumps(JOB.format(mb=mb))}]
        """,
        name=f"rb{mb}.yaml",
    )
    rss = cli.tmp / f"rss{mb}"
    out = subprocess.run(
        [sys.executable, "-c", WRAP, str(rss), "run", "--auto", "--new-run", str(rb)],
        env=cli.env,
        capture_output=True,
        timeout=600,
    )
    log = json.loads(cli("status", "--json", check=0).stdout)["steps"]["big"]["log_file"]
    with open(log, "rb") as f:
        sha = hashlib.file_digest(f, "sha256").hexdigest()
    return int(rss.read_text()), out, sha


def test_one_giant_line_streams_at_bounded_client_memory(tmp_path, tally):
    cli = Cli(tmp_path)
    base_kib, base, _ = _run(cli, 1)
    big_kib, out, sha = _run(cli, 256)
    growth_mib = (big_kib - base_kib) / 1024
    said = re.search(rb"\xe2\x80\xa6 ([0-9,]+) more bytes", out.stdout)
    more = int(said[1].replace(b",", b"")) if said else -1
    held = (
        base.returncode == 0
        and out.returncode == 0
        and growth_mib < 64
        and sha == hashlib.sha256(expected(256)).hexdigest()
        and 256 * (1 << 20) - 70 * 1024 < more < 256 * (1 << 20)  # a 64 KiB prefix shown
        and len(out.stdout) < 1 << 20
    )
    tally.trial("memory: one 256 MB line without a newline (client RSS, mirror exact)", held)
    assert held, (base_kib, big_kib, growth_mib, more, out.returncode, out.stderr[-2000:])


def test_cockpit_feed_bounds_a_giant_line(tally):
    """The cockpit's log pane data path (LogFeed) fed 64 MB of one line in 256 KiB chunks:
    Python memory stays under 2 MiB, the line is shown with its count."""
    from eagle_tui.app.widgets.logs.feed import LogFeed

    feed = LogFeed(100)
    chunk = "y" * (256 * 1024)
    tracemalloc.start()
    for _ in range(256):
        feed.feed(chunk)
    feed.feed("\n")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    lines = feed.take()
    held = (
        peak < 2 << 20
        and len(lines) == 1
        and lines[0].endswith(f" … {64 * (1 << 20) - 64 * 1024:,} more bytes")
    )
    tally.trial("memory: cockpit log pane, one 64 MB line", held)
    assert held, (peak, [x[-60:] for x in lines])
