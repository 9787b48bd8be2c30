"""Attacks on "one driver per work on the box": two drivers at once, and a killed holder.

Real CLI processes with separate state dirs (two operators' machines) and one box: the real
local agent on a shared spool, and the real sshd of tests/ssh. Held = exactly one driver runs
the step (side-effect file), the other exits 4 with one line naming the holder, no traceback.
Every trial runs (the tally counts them all); a test fails at its end if any broke.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from remote_agent.agent.procs import all_procs
from tests.runbook.conftest import Cli
from tests.ssh.conftest import box, box2, ssh_keys  # noqa: F401 - fixtures of the real sshd
from tests.ssh.helpers import SshCli, write_ssh_config
from tests.ssh.sshd import kill_tagged

HOLDER = re.compile(
    r"^locked: runbook 'duo' in '.+' is being driven by \S+@\S+ pid \d+ since "
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ; "
)

RUNBOOK = """\
    name: duo
    {host}
    steps:
      - id: once
        title: Must run once
        run: echo x >> {side}; sleep 1.5
"""


def held_once(outs: list[tuple[int, str, str]], side: Path) -> bool:
    codes = sorted(rc for rc, _, _ in outs)
    loser = [err for rc, _, err in outs if rc == 4]
    runs = len(side.read_text().splitlines()) if side.exists() else 0
    return (
        codes == [0, 4]
        and runs == 1
        and len(loser) == 1
        and len(loser[0].strip().splitlines()) == 1
        and HOLDER.match(loser[0].strip()) is not None
        and all("Traceback" not in o + e for _, o, e in outs)
    )


def race(clis: list, rb_paths: list[Path], rng: random.Random) -> list[tuple[int, str, str]]:
    offsets = [0.0, rng.uniform(0, 0.4)]
    rng.shuffle(offsets)
    procs = []
    t0 = time.monotonic()
    for cli, rb, off in sorted(zip(clis, rb_paths, offsets, strict=True), key=lambda x: x[2]):
        time.sleep(max(0.0, t0 + off - time.monotonic()))
        procs.append(
            subprocess.Popen(
                cli.cmd("run", "--auto", "--quiet", str(rb)),
                env=cli.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        outs.append((p.returncode, out, err))
    return outs


def test_two_local_drivers_one_runs(tmp_path, tally):
    breaks: list = []
    rng = random.Random(2024)
    for i in range(20):
        root = tmp_path / f"t{i}"
        clis = [Cli(root / "alice"), Cli(root / "bob")]
        side = root / "side"
        rbs = []
        for c in clis:
            c.env["EAGLE_TUI_SPOOL"] = str(root / "box-spool")  # one box, two state dirs
            c.tmp.mkdir(parents=True)
            rbs.append(c.runbook(RUNBOOK.format(host="", side=side)))
        outs = race(clis, rbs, rng)
        ok = held_once(outs, side)
        tally.trial("two drivers at once, local agent", ok)
        if not ok:
            breaks.append(outs)
    assert not breaks, breaks[:2]


def _runs(side: Path) -> int:
    return len(side.read_text().splitlines()) if side.exists() else 0


def _never_started(cli: Cli, rec: dict) -> bool:
    """The box's evidence that the job never ran, as the engine recorded it: `never_started`,
    and its job dir holds no leader record (the leader writes `pgid` before the command)."""
    jd = Path(cli.env["EAGLE_TUI_SPOOL"]) / "jobs" / str(rec.get("job_id"))
    no_leader = not (jd / "pgid").exists() and not (jd / "leader_exit.json").exists()
    return rec.get("reason") == "never_started" and no_leader


def _kill9_trial(cli: Cli, rb: Path, side: Path, kill_when) -> tuple[bool, tuple]:
    """kill -9 the driver and its agent once `kill_when()` returns, restart, check the fate."""
    before = _runs(side)
    p = subprocess.Popen(
        cli.cmd("run", "--auto", "--quiet", "--new-run", str(rb)),
        env=cli.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # driver + agent in one group: one kill takes both
    )
    kill_when()
    for agent in [st.pid for st in all_procs() if st.ppid == p.pid]:
        os.kill(agent, signal.SIGKILL)  # its lock record stays, with a dead pid
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    out = cli("run", "--auto", "--quiet", str(rb), timeout=150)
    verify = cli("audit", "verify")
    rec = cli.state_json()["steps"]["once"]
    ran = _runs(side) - before
    if ran == 1:  # it ran (before the kill or on resume): recorded with its exit
        fate = out.returncode == 0 and rec["status"] == "succeeded" and rec["exit_code"] == 0
    else:  # it never ran: the kill landed mid launch; recorded so, never relaunched
        fate = ran == 0 and out.returncode == 1 and rec["status"] == "lost"
        fate = fate and _never_started(cli, rec)
    ok = fate and verify.returncode == 0 and "Traceback" not in out.stderr
    return ok, (ran, rec, out.stdout[-1500:], out.stderr, verify.stderr)


def test_kill9_holder_then_restart(tmp_path, tally):
    """kill -9 the driver and its agent at a random moment: the lock is stale (dead pid) and
    the next driver takes it over, resumes, and the audit still verifies. The job's fate is
    kept: one that ran is recorded `succeeded` and never run twice. A kill that lands inside
    the job's launch (the agent dies before its supervisor has the job spec, or before it was
    spawned) leaves a job that never ran: it is `lost` with reason `never_started` (exit 1),
    from the box's evidence, and not relaunched (docs/SAFETY.md)."""
    breaks: list = []
    rng = random.Random(99)
    cli = Cli(tmp_path)
    side = tmp_path / "side"
    rb = cli.runbook(RUNBOOK.format(host="", side=side) + "        detach: true\n")
    for i in range(20):
        ok, why = _kill9_trial(cli, rb, side, lambda: time.sleep(rng.uniform(0.3, 1.4)))
        tally.trial("kill -9 holder, restart takes the stale lock", ok)
        if not ok:
            breaks.append((i, *why))
    assert not breaks, breaks[:2]


def test_kill9_holder_mid_job_launch(tmp_path, tally):
    """The kill aimed at the job's launch: the moment the agent has made the job dir. Whether
    the supervisor got the spec first or not, the fate is recorded as above: `succeeded` once
    if it ran, else `lost` as `never_started`, from the box's evidence; never run twice."""
    breaks: list = []
    cli = Cli(tmp_path)
    side = tmp_path / "side"
    jobs = Path(cli.env["EAGLE_TUI_SPOOL"]) / "jobs"
    rb = cli.runbook(RUNBOOK.format(host="", side=side) + "        detach: true\n")
    for i in range(6):
        seen = {d.name for d in jobs.iterdir()} if jobs.exists() else set()

        def launched(seen: set[str] = seen) -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if jobs.exists() and {d.name for d in jobs.iterdir()} - seen:
                    return
                time.sleep(0.0005)

        ok, why = _kill9_trial(cli, rb, side, launched)
        tally.trial("kill -9 holder mid job launch: fate kept, never run twice", ok)
        if not ok:
            breaks.append((i, *why))
    assert not breaks, breaks[:2]


def test_stale_by_boot_id_and_dead_pid(tmp_path, tally):
    """The agent's own rule, on records a crashed or rebooted holder left behind."""
    from remote_agent.agent.driver_locks import DriverLocks

    breaks: list = []
    locks = DriverLocks(tmp_path)
    me = {"host": "h", "user": "u", "pid": 1, "driver_id": "mine"}
    live = subprocess.Popen(["sleep", "30"])
    try:
        cases = {
            "live holder": (live.pid, locks.boot, False),
            "dead pid": (2**22 + 7, locks.boot, True),
            "other boot": (live.pid, "another-boot-id", True),
        }
        for what, (pid, boot, stale) in cases.items():
            path, _, _ = locks._path({"name": "duo", "work_dir": str(tmp_path)})
            path.parent.mkdir(parents=True, exist_ok=True)
            rec = {"agent_pid": pid, "agent_start": None, "boot_id": boot, "driver_id": "x"}
            path.write_text(json.dumps({**rec, "host": "far", "user": "eve", "pid": 5, "since": 1}))
            res = locks.acquire({"name": "duo", "work_dir": str(tmp_path), "holder": me})
            ok = res["acquired"] is stale and (res["holder"]["user"] == ("u" if stale else "eve"))
            tally.trial(f"stale lock rule: {what}", ok)
            if not ok:
                breaks.append((what, res))
            locks.release_all()
    finally:
        live.kill()
        live.wait()
    assert not breaks, breaks[:2]


@pytest.mark.sshd
def test_two_drivers_over_ssh_one_runs(tmp_path, box, box2, ssh_keys, tally):  # noqa: F811
    breaks: list = []
    known = tmp_path / "known_hosts"
    known.write_text(box.known_hosts_line())
    config = write_ssh_config(tmp_path / "ssh_config", ssh_keys["user"], box=box, box2=box2)
    rng = random.Random(5)
    try:
        for i in range(20):
            root = tmp_path / f"t{i}"
            side = root / "side"
            clis = [SshCli(root / n, known, config) for n in ("alice", "bob")]
            rbs = []
            for c in clis:
                c.tmp.mkdir(parents=True)
                rbs.append(c.runbook(RUNBOOK.format(host="host: box", side=side)))
            outs = race(clis, rbs, rng)
            ok = held_once(outs, side)
            tally.trial("two drivers at once, over ssh", ok)
            if not ok:
                breaks.append(outs)
    finally:
        kill_tagged(box.tag)
    assert not breaks, breaks[:2]


def test_second_cockpit_on_a_locked_work_exits_4(tmp_path, monkeypatch, tally):
    """The real cockpit (Textual, Pilot) as the second driver: the holder line, exit 4."""
    breaks: list = []
    import asyncio

    from eagle_tui.app.launch import build_app
    from eagle_tui.app.screens.dialogs import ErrorScreen
    from eagle_tui.cli import build_parser

    monkeypatch.setenv("EAGLE_TUI_SPOOL", str(tmp_path / "box-spool"))
    holder = Cli(tmp_path / "alice")
    holder.env["EAGLE_TUI_SPOOL"] = str(tmp_path / "box-spool")
    holder.tmp.mkdir()
    side = tmp_path / "side"
    # the holder outlives every trial (a loaded machine is slow to start apps); killed after
    rb = holder.runbook(RUNBOOK.format(host="", side=side).replace("sleep 1.5", "sleep 120"))
    p = subprocess.Popen(holder.cmd("run", "--auto", "--quiet", str(rb)), env=holder.env)
    try:
        deadline = time.monotonic() + 20
        while not side.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        state = tmp_path / "bob"
        args = build_parser().parse_args(["run", str(rb), "--state-dir", str(state)])
        for _ in range(3):
            app = build_app(args, state, {}, {}, keymap_paths=[])

            async def drive(app=app) -> None:
                async with app.run_test(size=(120, 40)) as pilot:
                    for _ in range(400):
                        if isinstance(app.screen, ErrorScreen):
                            break
                        await pilot.pause(0.05)
                    await pilot.press("enter")
                    for _ in range(100):
                        if app.return_value is not None:
                            break
                        await pilot.pause(0.05)

            asyncio.run(drive())
            ok = (
                app.return_value == 4
                and app.refusal is not None
                and HOLDER.match("locked: " + app.refusal) is not None
                and not (state / "runs").exists()
            )
            tally.trial("second cockpit on a driven work", ok)
            if not ok:
                breaks.append((app.return_value, app.refusal))
    finally:
        p.kill()
        p.wait()
    assert not breaks, breaks[:2]


MULTI = """\
    name: duo
    host: {default}
    steps:
      - id: once
        title: Must run once
        host: box2
        run: echo {who} >> {side}; sleep 1.5
"""


@pytest.mark.sshd
def test_lock_on_every_host_the_steps_use(tmp_path, box, box2, ssh_keys, tally):  # noqa: F811
    """Alice's runbook defaults to box but runs its step on box2; Bob's runs the same work on
    box2 directly. The claim is taken on every host the steps use, so one of them is refused
    (before: the lock covered the default host only, and both ran on box2)."""
    breaks: list = []
    known = tmp_path / "known_hosts"
    known.write_text(box.known_hosts_line() + box2.known_hosts_line())
    config = write_ssh_config(tmp_path / "ssh_config", ssh_keys["user"], box=box, box2=box2)
    rng = random.Random(17)
    try:
        for i in range(12):
            root = tmp_path / f"t{i}"
            side = root / "side"
            clis = [SshCli(root / n, known, config) for n in ("alice", "bob")]
            rbs = []
            for c, default in zip(clis, ("box", "box2"), strict=True):
                c.tmp.mkdir(parents=True)
                rbs.append(c.runbook(MULTI.format(default=default, who=c.tmp.name, side=side)))
            outs = race(clis, rbs, rng)
            # trials run one after another on the same boxes: a claim not released at exit
            # would refuse both drivers of the next trial
            ok = held_once(outs, side)
            tally.trial("lock on every host the steps use (two sshd boxes)", ok)
            if not ok:
                breaks.append(outs)
    finally:
        kill_tagged(box.tag)
        kill_tagged(box2.tag)
    assert not breaks, breaks[:2]
