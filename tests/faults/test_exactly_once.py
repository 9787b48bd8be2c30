"""Every line once: the console and the mirror show each job line exactly once across any
number of reattaches (client `kill -9` at random points, agent `kill -9`), each step runs
once, and its exit code is kept. Real CLI, real local agent, real jobs."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from tests.faults.jobrig import Rig, expected
from tests.faults.tally import trials
from tests.ssh.conftest import box, box2, ssh_cli, ssh_keys  # noqa: F401, F811  (real sshd fixtures)
from tests.ssh.sshd import agent_pids, ppid
from tests.support.waiting import wait_for

TRIALS = trials(20)
LINES, DT = 120, 0.006  # ~0.7 s of output per step: each kill lands mid-stream


def _shown_this_session(rig: Rig, step: str) -> int:
    return sum(1 for line in rig._out if f"│ {step} " in line)


def _one_chunk_repeated(console: dict[str, int], want: dict[str, int]) -> bool:
    """Every line shown, and the repeats (each line at most twice) form one contiguous run: the
    chunk the killed client was drawing, which no relaunch can know reached the terminal."""
    if set(console) != set(want) or any(n > 2 for n in console.values()):
        return False
    again = [i for i, line in enumerate(want) if console[line] == 2]
    return not again or again[-1] - again[0] + 1 == len(again)


def _verdicts(
    rig: Rig, steps: list[str], code: int, chunk_may_repeat: bool = False
) -> list[tuple[str, bool, str]]:
    st = rig.state()
    out = []
    for s in steps:
        console, mirror = rig.console_counts(s), rig.mirror_counts(s)
        want = expected(s, LINES)
        runs, rec = rig.executions(s), st[s]
        shown_ok = _one_chunk_repeated(console, want) if chunk_may_repeat else console == want
        ok = shown_ok and mirror == want and runs == 1 and rec.get("exit_code") == code
        dup = sum(n - 1 for n in console.values() if n > 1)
        why = (
            f"{s}: console {len(console)}/{LINES} lines, {dup} repeated; mirror "
            f"{sum(mirror.values())} lines; ran {runs}x; exit {rec.get('exit_code')}"
        )
        out.append((s, ok, why))
    return out


def test_console_and_mirror_once_across_client_kills(tmp_path, tally):
    """Kill -9 the client (engine + console) once per step at a random moment, restart it."""
    rng = random.Random(8)
    rig = Rig(tmp_path)
    rb = rig.runbook(TRIALS, LINES, DT, code=0)
    steps = [f"s{k}" for k in range(TRIALS)]
    try:
        rig.start("run", str(rb), "--auto")
        for s in steps:
            at = rng.randint(1, LINES - 20)
            wait_for(
                lambda s=s, at=at: _shown_this_session(rig, s) >= at or rig.log_lines(s) >= LINES,
                timeout=60,
                what=f"{s} on the console",
                interval=0.002,
            )
            time.sleep(rng.random() * 0.05)
            rig.kill_client()
            rig.start("run", str(rb), "--auto")
        assert rig.finish(timeout=120) == 0, rig.consoles[-1][-3000:]
        verdicts = _verdicts(rig, steps, 0, chunk_may_repeat=True)
    finally:
        rig.cleanup()
    for _, ok, _ in verdicts:
        tally.trial("client kill -9: mirror once, console loses nothing, repeats <= 1 chunk", ok)
    bad = [why for _, ok, why in verdicts if not ok]
    assert not bad, "\n".join(bad)


def test_console_and_mirror_once_across_agent_kills(tmp_path, tally):
    """Kill -9 the agent once per (detached) step at a random moment: the engine reconnects."""
    rng = random.Random(9)
    rig = Rig(tmp_path)
    rb = rig.runbook(TRIALS, LINES, DT, code=0)
    steps = [f"s{k}" for k in range(TRIALS)]
    try:
        rig.start("run", str(rb), "--auto")
        for s in steps:
            at = rng.randint(1, LINES - 20)
            wait_for(lambda s=s, at=at: rig.log_lines(s) >= at, 60, f"{s} output", 0.002)
            for pid in rig.agents():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        assert rig.finish(timeout=120) == 0, rig.consoles[-1][-3000:]
        verdicts = _verdicts(rig, steps, 0)
    finally:
        rig.cleanup()
    for _, ok, _ in verdicts:
        tally.trial("agent kill -9: console + mirror once", ok)
    bad = [why for _, ok, why in verdicts if not ok]
    assert not bad, "\n".join(bad)


@pytest.mark.sshd
def test_console_and_mirror_once_across_ssh_cuts(ssh_cli, box, tmp_path, tally):  # noqa: F811
    """Over a real sshd: the sshd session process is killed -9 once per step at a random
    console line (the connection drops; the engine reconnects and reattaches)."""
    rng = random.Random(10)
    rig = Rig(tmp_path, cli=ssh_cli, spool=box.home / ".eagle-tui" / "spool", host="box")
    rig.find_agents = lambda: agent_pids(box.tag)
    rb = rig.runbook(TRIALS, LINES, DT, code=0)
    steps = [f"s{k}" for k in range(TRIALS)]
    try:
        rig.start("run", str(rb), "--auto")
        for s in steps:
            at = rng.randint(1, LINES - 20)
            wait_for(
                lambda s=s, at=at: _shown_this_session(rig, s) >= at or rig.log_lines(s) >= LINES,
                timeout=60,
                what=f"{s} on the console",
                interval=0.002,
            )
            for pid in rig.agents():
                try:
                    os.kill(ppid(pid), signal.SIGKILL)  # the agent's parent: the sshd session
                except ProcessLookupError:
                    pass
        assert rig.finish(timeout=120) == 0, rig.consoles[-1][-3000:]
        verdicts = _verdicts(rig, steps, 0)
    finally:
        rig.cleanup()
    for _, ok, _ in verdicts:
        tally.trial("SSH cut (sshd session kill -9): console + mirror once", ok)
    bad = [why for _, ok, why in verdicts if not ok]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "landed",
    ["before the append", "mid-append", "after the append, not drawn", "after the append, drawn"],
)
def test_resume_point_from_the_mirror_cursor(tmp_path, landed):
    """The places a kill can land around one append (cursor written first, `shown` after the
    console drew it), resumed exactly: the mirror's size and the cursor say which."""
    from runbook.mirror import LogMirror, cursor_path, resume_point

    path = tmp_path / "m.log"
    LogMirror(path, 0, 0).append(10, b"0123456789")
    if landed.startswith("after the append"):
        m = LogMirror(path, 0, 0)
        m.append(25, b"***")  # 15 remote bytes, redacted to 3
        if landed == "after the append, drawn":
            m.mark_shown()
        assert resume_point(path, 0, 0) == (25, 13)
        # drawn: nothing to draw again; not drawn (killed while drawing): drawn once on resume
        want = b"" if landed == "after the append, drawn" else b"***"
        assert LogMirror(path, 0, 0).unshown() == want
        return
    cursor_path(path).write_text('{"before": [10, 10], "after": [25, 13], "shown": 10}')
    if landed == "mid-append":
        with open(path, "ab") as f:
            f.write(b"*")
    assert resume_point(path, 0, 0) == (10, 10)
    again = LogMirror(path, 0, 0)
    assert path.read_bytes() == b"0123456789" and (again.remote, again.size) == (10, 10)


def test_arrival_times_follow_the_mirror_through_a_cut_back(tmp_path):
    """The `.times` sidecar says when each mirrored byte arrived; a resume that cuts the mirror
    back drops the entries past the cut, a torn last entry is ignored, and the bytes fetched
    again get their new arrival time (never a time from the lost attempt)."""
    from runbook.mirror import ChunkTimes, LogMirror, cursor_path, times_path

    path = tmp_path / "m.log"
    m = LogMirror(path, 0, 0)
    m.append(4, b"one\n")
    m.append(8, b"two\n")
    m.close()
    first = ChunkTimes.read(path)
    assert first.ends == [4, 8] and first.at(0) == first.times[0] and first.at(5) == first.times[1]
    assert first.at(8) is None  # no byte there yet
    # a kill mid-append of a third chunk: the cursor says before=(8, 8), the mirror holds 2 bytes
    cursor_path(path).write_text('{"before": [8, 8], "after": [14, 14], "shown": 8}')
    with open(path, "ab") as f:
        f.write(b"th")
    with open(times_path(path), "ab") as f:
        f.write(b"14 9999999999")  # torn: no newline
    assert ChunkTimes.read(path).ends == [4, 8]
    again = LogMirror(path, 0, 0)
    assert again.size == 8 and times_path(path).read_bytes().count(b"\n") == 2
    again.append(14, b"three\n")
    again.close()
    after = ChunkTimes.read(path)
    assert after.ends == [4, 8, 14] and after.times[:2] == first.times
    assert after.times[2] >= first.times[1] and after.times[2] < 9999999999


def test_arrival_times_follow_a_growing_mirror_reading_only_what_was_appended(tmp_path):
    """The full-log viewer rescans every 0.5 s: each round takes only the entries appended
    since, none past the confirmed size, none twice; a file that shrank starts over."""
    from runbook.mirror import ChunkTimes, LogMirror, times_path

    path = tmp_path / "m.log"
    m = LogMirror(path, 0, 0)
    m.append(4, b"one\n")
    t = ChunkTimes.read(path)
    assert t.ends == [4] and t.read_to == times_path(path).stat().st_size
    m.append(8, b"two\n")
    m.append(14, b"three\n")
    found = t.scan(limit=8)  # 14 is not confirmed yet
    assert found.start == t.read_to and found.ends == [8]
    t.apply(found)
    t.apply(found)  # stale: applied already
    assert t.ends == [4, 8]
    t.apply(t.scan())
    assert t.ends == [4, 8, 14] and t.read_to == times_path(path).stat().st_size
    assert t.scan().ends == []
    m.close()
    times_path(path).write_bytes(b"4 1.0\n")  # cut back by a resume
    shrunk = t.scan()
    assert shrunk.reset
    t.apply(shrunk)
    t.apply(t.scan())
    assert (t.ends, t.times) == ([4], [1.0])
