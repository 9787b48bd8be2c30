"""ENOSPC on the box's spool while a job runs: a job that ran to an exit keeps that exit.

The spool sits on its own small tmpfs; the job (a trainer writing dumps next to the spool,
say) fills that filesystem, leaves a random few bytes free, and exits with a random code. In
half the trials its supervisor (jobwrap) was killed -9 earlier, so only the job's leader can
record the end. Real CLI, real local agent, a real tmpfs.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.faults.jobrig import Rig
from tests.support.waiting import wait_for

TRIALS = 20

FILL = """\
import errno, os, sys, time
spool, code, free, side = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
with open(side, "a") as f:
    f.write("ran\\n")
print("started", flush=True)
time.sleep(0.6)  # the test may kill the supervisor now
path = os.path.join(spool, "filler")
with open(path, "wb", buffering=0) as f:
    try:
        while True:
            f.write(b"\\0" * 65536)
    except OSError as e:
        assert e.errno in (errno.ENOSPC, errno.EDQUOT), e
    size = f.tell()
    try:
        while True:
            f.write(b"\\0")
    except OSError:
        pass
    os.ftruncate(f.fileno(), max(0, f.tell() - free))  # a random few bytes stay free
sys.exit(code)
"""


def _mount(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
    )
    return r.returncode == 0


def _trial(tmp: Path, seed: int) -> tuple[bool, str]:
    rng = random.Random(seed)
    rig = Rig(tmp)
    if not _mount(rig.spool, "3m"):
        pytest.skip("needs root to mount a tmpfs")
    code = rng.choice([0, 3])
    free = rng.choice([0, 0, rng.randint(1, 6000)])
    kill_wrap = seed % 2 == 1
    side = tmp / "side"
    (tmp / "fill.py").write_text(FILL)
    rb = rig.cli.runbook(
        textwrap.dedent(f"""\
        name: {rig.name}
        steps:
          - id: s0
            title: Fills the spool's disk, then exits {code}
            detach: {"true" if seed % 4 < 2 else "false"}
            run: [python3, {tmp / "fill.py"}, {rig.spool}, "{code}", "{free}", {side}]
        """)
    )
    try:
        rig.start("run", str(rb), "--auto")
        if kill_wrap:
            wait_for(lambda: rig.log_lines("s0") >= 1, 60, "job output", 0.005)
            pid = rig.jobwrap_pid("s0")
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
        rc = rig.finish(timeout=120)
        time.sleep(0.2)
        rec = rig.state()["s0"]
    finally:
        rig.cleanup()
        subprocess.run(["umount", "-l", str(rig.spool)], capture_output=True)
    ran = len(side.read_text().splitlines()) if side.exists() else 0
    want = ("succeeded", 0) if code == 0 else ("failed", 1)
    ok = (
        ran == 1
        and (rec["status"], rc) == want
        and rec.get("exit_code") == code
        and "Traceback" not in rig.consoles[-1]
    )
    why = (
        f"code {code}, free {free}, supervisor killed {kill_wrap}: ran {ran}x, exit {rc}, "
        f"{rec['status']} {rec.get('reason')} exit_code {rec.get('exit_code')}: "
        f"{rec.get('message')}"
    )
    return ok, why


def test_a_full_spool_keeps_the_exit_of_a_job_that_ran(tmp_path, tally):
    bad = []
    for seed in range(TRIALS):
        ok, why = _trial(tmp_path / f"t{seed}", seed)
        tally.trial("spool full (ENOSPC) as the job ends: exit kept", ok)
        if not ok:
            bad.append(f"trial {seed}: {why}")
    assert not bad, "\n".join(bad)


def _full_at_launch(tmp: Path, seed: int) -> tuple[bool, str]:
    """The spool's disk is (nearly) full before the job starts: it runs and keeps its exit, or
    it never runs and says so, or (a spool the agent never made) the driver stops with one
    line naming the spool; never a job that ran without a record of its end, never a hang."""
    rng = random.Random(1000 + seed)
    rig = Rig(tmp)
    if not _mount(rig.spool, "3m"):
        pytest.skip("needs root to mount a tmpfs")
    side = tmp / "side"
    rb = rig.cli.runbook(
        textwrap.dedent(f"""\
        name: {rig.name}
        steps:
          - id: s0
            title: Runs on a full spool
            run: echo ran >> {side}; echo done
        """)
    )
    warm = seed % 4 != 0  # the agent made its spool (ids, locks) while there was room
    free = rng.choice([0, rng.randint(1, 80_000), rng.randint(80_000, 400_000)])
    free = 0 if seed % 8 == 0 else free  # a spool the agent cannot even make its id in
    try:
        if warm:
            other = rig.cli.runbook(
                f"name: {rig.name}-w\nsteps:\n  - {{id: w, title: W, run: 'true'}}\n", "w.yaml"
            )
            rig.cli("run", "--auto", str(other), check=0)
        with open(rig.spool / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass
            os.ftruncate(f.fileno(), max(0, f.tell() - free))
        rig.start("run", str(rb), "--auto")
        rc = rig.finish(timeout=60)
        out = rig.consoles[-1]
        states = [json.loads(p.read_text()) for p in rig.cli.state.glob("runs/*/state.json")]
        mine = [st for st in states if st.get("runbook_name") == rig.name]
        rec = mine[0]["steps"]["s0"] if mine else {"status": None}
    finally:
        rig.cleanup()
        subprocess.run(["umount", "-l", str(rig.spool)], capture_output=True)
    ran = len(side.read_text().splitlines()) if side.exists() else 0
    if ran:
        ok = ran == 1 and rc == 0 and rec["status"] == "succeeded" and rec["exit_code"] == 0
    elif rec["status"] is None or "cannot be written" in out:
        lines = [ln for ln in out.splitlines() if ln.startswith("error:")]
        ok = rc == 1 and len(lines) == 1 and "No space left on device" in lines[0]
    else:
        said = rec.get("reason") == "never_started" or (
            rec.get("exit_code") == 126 and "reserve" in out
        )
        ok = rc == 1 and said
    ok = ok and "Traceback" not in out
    why = (
        f"warm {warm}, free {free}: ran {ran}x, exit {rc}, {rec['status']} {rec.get('reason')}: "
        f"{rec.get('message')}; {out[-300:]!r}"
    )
    return ok, why


def test_a_full_spool_at_launch_runs_with_a_record_or_not_at_all(tmp_path, tally):
    bad = []
    for seed in range(8):
        try:
            ok, why = _full_at_launch(tmp_path / f"t{seed}", seed)
        except Exception as e:  # a hung or crashed driver counts as a break, with its reason
            ok, why = False, f"{type(e).__name__}: {e}"
        tally.trial("spool full (ENOSPC) at the launch: ran with its exit, or said why not", ok)
        if not ok:
            bad.append(f"trial {seed}: {why}")
    assert not bad, "\n".join(bad)
