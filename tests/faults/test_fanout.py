"""Fan-out keeps the single-host promises per host: with two hosts streaming at once, the
client (engine + console) is killed -9 mid-stream and restarted, and an agent is killed -9;
every host's mirror holds each of its lines exactly once, each host's job ran once, and the
fan-out step succeeds. Real CLI, real local agents (`local` and `localhost-agent`), real jobs."""

from __future__ import annotations

import os
import random
import signal
import textwrap
import time

from tests.faults.jobrig import Rig, expected, wait_for

LINES, DT = 120, 0.006
HOSTS = ("local", "localhost-agent")
FANOUTS = 3


def _runbook(rig: Rig):
    body = f"name: {rig.name}\nsteps:\n"
    for k in range(FANOUTS):
        body += textwrap.dedent(f"""\
          - id: f{k}
            title: Fan-out {k}
            hosts: [{", ".join(HOSTS)}]
            detach: true
            run: python3 {rig.work}/job.py {rig.work} s{k}${{host_rank}} {LINES} {DT} 0 0
        """)
    return rig.cli.runbook(body)


def _verdicts(rig: Rig) -> list[tuple[bool, str]]:
    st = rig.state()
    out = []
    for k in range(FANOUTS):
        for r, host in enumerate(HOSTS):
            job, child = f"s{k}{r}", f"f{k}.{host}"
            mirror = rig.mirror_counts(child)
            runs = rig.executions(job)
            ok = mirror == expected(job, LINES) and runs == 1 and st[child]["exit_code"] == 0
            out.append((ok, f"{child}: mirror {sum(mirror.values())} lines, ran {runs}x"))
        if st[f"f{k}"]["status"] != "succeeded":
            out.append((False, f"f{k}: {st[f'f{k}']['status']}"))
    return out


def test_each_host_once_across_client_and_agent_kills(tmp_path, tally):
    rng = random.Random(18)
    rig = Rig(tmp_path)
    rb = _runbook(rig)
    try:
        rig.start("run", str(rb), "--auto")
        for k in range(FANOUTS):
            at = rng.randint(10, LINES - 30)
            child = f"f{k}.{HOSTS[1]}"
            wait_for(lambda c=child, at=at: rig.log_lines(c) >= at, 60, child, 0.002)
            if k % 2 == 0:
                rig.kill_client()
                time.sleep(rng.random() * 0.2)  # the jobs stream on meanwhile
                rig.start("run", str(rb), "--auto")
            else:
                for pid in rig.agents():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        assert rig.finish(timeout=120) == 0, rig.consoles[-1][-3000:]
        verdicts = _verdicts(rig)
    finally:
        rig.cleanup()
    for ok, _ in verdicts:
        tally.trial("fan-out, client or agent kill -9: every host's lines once, run once", ok)
    bad = [why for ok, why in verdicts if not ok]
    assert not bad, "\n".join(bad)
