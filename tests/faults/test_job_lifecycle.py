"""Jobs keep their fate: a job that ran to an exit is recorded with that exit whatever died
around it (its supervisor, its agent); a job whose fate is unknown (a wiped spool) is `lost`
with the evidence and never relaunched. Real CLI, real local agent, real jobs, a real tmpfs."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from tests.faults.jobrig import Rig, expected
from tests.faults.tally import trials
from tests.support.waiting import wait_for

TRIALS = trials(20)


def _kill(pid: int | None) -> None:
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _client_alive(rig: Rig) -> bool:
    return rig.proc is not None and rig.proc.poll() is None


def _per_step_trials(rig: Rig, steps: list[str], attack, rng: random.Random, lines: int) -> None:
    """Attack each step once, at a random line; stop early when the run itself stopped."""
    for s in steps:
        at = rng.randint(1, lines - 5)
        try:
            wait_for(
                lambda s=s, at=at: rig.log_lines(s) >= at or not _client_alive(rig),
                60,
                f"{s} output",
                0.002,
            )
        except AssertionError:
            return
        if not _client_alive(rig):
            return
        attack(s)


def test_supervisor_killed_mid_job_keeps_the_exit(tmp_path, tally):
    """kill -9 of the jobwrap while its (bound) job runs: the job's exit is still recorded."""
    rng = random.Random(7)
    lines = 60
    rig = Rig(tmp_path)
    rb = rig.runbook(TRIALS, lines, 0.006, code=0, detach=False)
    steps = [f"s{k}" for k in range(TRIALS)]
    try:
        rig.start("run", str(rb), "--auto")
        _per_step_trials(rig, steps, lambda s: _kill(rig.jobwrap_pid(s)), rng, lines)
        code = rig.finish(timeout=120)
        st = rig.state()
    finally:
        rig.cleanup()
    bad = []
    for s in steps:
        rec = st[s]
        ok = (
            rec["status"] == "succeeded"
            and rec.get("exit_code") == 0
            and rig.executions(s) == 1
            and rig.mirror_counts(s) == {f"{s} {i:05d}": 1 for i in range(lines)}
        )
        if not ok:
            bad.append(f"{s}: {rec['status']} {rec.get('reason')} {rec.get('message')}")
        tally.trial("supervisor kill -9: exit kept, run once", ok)
    assert not bad and code == 0, "\n".join(bad)


def test_bound_job_ending_as_its_agent_dies_keeps_its_exit(tmp_path, tally):
    """kill -9 of the agent while a bound job runs; the job (like a trainer that checkpoints on
    TERM) finishes and exits 0: recorded succeeded with exit 0, run once, never `lost`. The job
    runs until its stop request, so a kill that lands late on a loaded machine still hits this
    step, not the next step's launch (a job stopped before it ran is rightly `agent_lost`)."""
    rng = random.Random(11)
    lines = 60
    rig = Rig(tmp_path)
    rb = rig.runbook(TRIALS, lines, 0.006, code=0, detach=False, graceful=True)
    steps = [f"s{k}" for k in range(TRIALS)]
    try:
        rig.start("run", str(rb), "--auto")

        def attack(s: str) -> None:
            for pid in rig.agents():
                _kill(pid)

        _per_step_trials(rig, steps, attack, rng, lines)
        code = rig.finish(timeout=120)
        st = rig.state()
    finally:
        rig.cleanup()
    bad = []
    for s in steps:
        rec = st[s]
        ran_to_exit = rig.done(s)
        ok = (
            ran_to_exit
            and rec["status"] == "succeeded"
            and rec.get("exit_code") == 0
            and rig.executions(s) == 1
        )
        if not ok:
            bad.append(
                f"{s}: ran to exit {ran_to_exit}, {rec['status']} {rec.get('reason')} "
                f"exit {rec.get('exit_code')}, ran {rig.executions(s)}x"
            )
        tally.trial("agent kill -9 as a bound job exits: exit kept", ok)
    assert not bad and code == 0, "\n".join(bad)


class _Spool:
    """The box's spool on its own small tmpfs: a reboot wipes it (rm -rf where mount fails)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.tmpfs = self._mount()

    def _mount(self) -> bool:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(self.path)],
            capture_output=True,
        )
        return r.returncode == 0

    def reboot(self) -> None:
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.path)], check=True)
            self.tmpfs = self._mount()
        else:
            shutil.rmtree(self.path)
            self.path.mkdir()

    def close(self) -> None:
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


def _spool_trial(tmp: Path, seed: int) -> tuple[bool, str, bool]:
    rng = random.Random(seed)
    rig = Rig(tmp)
    spool = _Spool(rig.spool)
    lines = 80
    rb = rig.runbook(1, lines, 0.01, code=0, detach=True)
    try:
        rig.start("run", str(rb), "--auto")
        at = rng.randint(1, lines - 30)
        wait_for(lambda: rig.log_lines("s0") >= at, 60, "output", 0.002)
        rig.kill_client()  # the box reboots: client connection, agent and job are gone ...
        for pid in rig.agents():
            _kill(pid)
        rig.kill_jobs()
        spool.reboot()  # ... and so is the spool (tmpfs)
        rig.start("run", str(rb), "--auto")
        code = rig.finish(timeout=60)
        time.sleep(0.3)  # a wrongly relaunched job would have started by now
        rec = rig.state()["s0"]
        out = rig.consoles[-1]
        ok = (
            code == 1
            and rec["status"] == "lost"
            and rec.get("reason") == "spool_wiped"
            and rig.executions("s0") == 1
            and "past the end" not in out + str(rec.get("message"))
        )
        why = f"exit {code}, {rec['status']} {rec.get('reason')}: {rec.get('message')}; ran {rig.executions('s0')}x"
        return ok, why, spool.tmpfs
    finally:
        rig.cleanup()
        spool.close()


def test_wiped_spool_is_lost_with_its_reason_never_relaunched(tmp_path, tally):
    """Reboot with the spool on tmpfs mid-job: the next run records `lost` (spool wiped), runs
    nothing again and shows no bogus offset error. Four trials at a time (each ~3 s)."""
    results: dict[int, tuple[bool, str, bool]] = {}

    def worker(seeds: list[int]) -> None:
        for seed in seeds:
            try:
                results[seed] = _spool_trial(tmp_path / f"t{seed}", seed)
            except Exception as e:  # a trial that broke counts as not held, with its reason
                results[seed] = (False, f"{type(e).__name__}: {e}", False)

    threads = [threading.Thread(target=worker, args=(list(range(w, TRIALS, 4)),)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    bad = []
    for seed in range(TRIALS):
        ok, why, _ = results.get(seed, (False, "did not finish", False))
        tally.trial("spool wiped (tmpfs reboot): lost, not relaunched", ok)
        if not ok:
            bad.append(f"trial {seed}: {why}")
    assert not bad, "\n".join(bad)


def test_retry_on_lost_needs_idempotent(tmp_path):
    """A relaunch of a job whose fate is unknown must be declared safe: a located exit 2."""
    rig = Rig(tmp_path)
    rb = rig.runbook(1, 1, 0.0, extra="retry: {max: 2, on: [lost]}\n")
    out = rig.cli("validate", str(rb))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "idempotent: true" in out.stdout + out.stderr
    assert f"{rb}:" in out.stdout + out.stderr
    rb = rig.runbook(1, 1, 0.0, extra="retry: {max: 2, on: [lost]}\nidempotent: true\n")
    rig.cli("validate", str(rb), check=0)


def _launch_kill_trial(tmp: Path, seed: int) -> tuple[bool, bool, str]:
    """kill -9 of the jobwrap aimed at the job's launch (a random moment after the supervisor
    came up: before, while or after it spawns the job's leader). The job ran and is recorded
    with its exit, once; or it provably never ran and is `lost` as `never_started` (state and
    audit); never recorded `lost` or failed while it runs, never run twice.
    Returns (held, ran, what happened)."""
    rng = random.Random(seed)
    rig = Rig(tmp)
    lines = 6
    rb = rig.runbook(1, lines, 0.05, code=0, detach=bool(seed % 2))
    # at once (before the leader is spawned), early, or anywhere up to after the pgid record
    delay = rng.choice([0.0, rng.uniform(0, 0.02), rng.uniform(0, 0.15)])
    try:
        rig.start("run", str(rb), "--auto")
        wait_for(lambda: rig.jobwrap_pid("s0") or not _client_alive(rig), 60, "jobwrap", 0.0005)
        time.sleep(delay)
        d = rig.job_dir("s0")
        had_pgid = d is not None and (d / "pgid").exists()
        _kill(rig.jobwrap_pid("s0"))
        code = rig.finish(timeout=60)
        time.sleep(lines * 0.05 + 1.0)  # a job that runs on would have ended by now
        rec = rig.state()["s0"]
        steps = [r for r in rig.cli.audit() if r.get("event") == "step.state"]
        audited = steps[-1].get("reason") if steps else None
    finally:
        rig.cleanup()
    ran = rig.executions("s0")
    if ran == 1:
        ok = code == 0 and rec["status"] == "succeeded" and rec.get("exit_code") == 0
        ok = ok and rig.done("s0") and rig.mirror_counts("s0") == expected("s0", lines)
    else:
        ok = ran == 0 and code == 1 and rec["status"] == "lost"
        ok = ok and rec.get("reason") == audited == "never_started"
    where = f"pgid recorded at the kill: {had_pgid}, delay {delay * 1000:.0f} ms"
    return (
        ok,
        ran > 0,
        f"{where}; ran {ran}x, exit {code}, {rec['status']} {rec.get('reason')}: "
        f"{rec.get('message')}",
    )


def test_supervisor_killed_at_the_launch_keeps_the_fate(tmp_path, tally):
    """The launch window: the jobwrap killed between spawning the job's leader and recording
    its pgid used to leave a job that ran while the driver recorded it failed (`launch_error`,
    so a retry ran it twice) or `lost`; one killed before the spawn left no evidence that
    nothing ran. Each trial is tallied by where the kill landed (did the command run)."""
    bad = []
    for seed in range(24):
        ok, ran, why = _launch_kill_trial(tmp_path / f"t{seed}", seed)
        if ran:
            tally.trial("supervisor kill -9 at the launch, job ran: exit kept, run once", ok)
        else:
            tally.trial("supervisor kill -9 at the launch, never ran: never_started", ok)
        if not ok:
            bad.append(f"trial {seed}: {why}")
    assert not bad, "\n".join(bad)
