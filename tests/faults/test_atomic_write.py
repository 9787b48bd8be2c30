"""Attack on the one atomic write (remote_agent/wire/atomic_write.py): a real `kill -9` of the
writing process, mid-write or at a random moment, leaves the old content or the complete new
one."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from remote_agent.wire.atomic_write import TEMP_MARK, atomic_path, write_atomic
from tests.faults.tally import trials
from tests.support.paths import REPO

# A record that proves itself whole: generation, payload, sha256 of both.
WRITER = r"""
import hashlib, sys, time
from pathlib import Path
from remote_agent.wire.atomic_write import AtomicWriter, atomic_path

def record(gen):
    body = (f"{gen}:".encode() + bytes([gen % 251]) * (256 * 1024 + gen * 997))
    return body + hashlib.sha256(body).hexdigest().encode()

path, how = Path(sys.argv[1]), sys.argv[2]
if how == "stall":  # half written, never renamed: the parent kills it here
    with AtomicWriter(path) as f:
        data = record(10**6)
        f.write(data[: len(data) // 2])
        f.flush()
        print("mid", flush=True)
        time.sleep(60)
elif how == "loop":
    print("go", flush=True)  # started: the parent's random delay now lands among the writes
    gen = 1
    while True:
        with AtomicWriter(path) as f:
            f.write(record(gen))
        gen += 1
elif how == "dirloop":
    print("go", flush=True)
    gen = 1
    while True:
        with atomic_path(path) as tmp:
            tmp.mkdir()
            (tmp / "a").write_bytes(record(gen))
            (tmp / "b").write_bytes(record(gen))
        gen += 1
"""


def _whole(data: bytes) -> int | None:
    """The record's generation if it is complete and uncorrupted, else None."""
    body, digest = data[:-64], data[-64:]
    if hashlib.sha256(body).hexdigest().encode() != digest:
        return None
    return int(body.split(b":", 1)[0])


def _start(path: Path, how: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), how], stdout=subprocess.PIPE, text=True, env=env
    )


def _kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    if proc.stdout:
        proc.stdout.close()


def test_kill_between_write_and_rename_leaves_the_old_file(tmp_path: Path, tally) -> None:
    path = tmp_path / "state.json"
    write_atomic(path, "old\n")
    for _ in range(trials(3)):
        proc = _start(path, "stall")
        assert proc.stdout and proc.stdout.readline().strip() == "mid"
        _kill(proc)
        leftovers = [p.name for p in tmp_path.iterdir() if p != path]
        held = path.read_text() == "old\n" and all(n.startswith(".") for n in leftovers)
        assert tally.trial("atomic write: kill -9 between write and rename", held), leftovers
        assert all(TEMP_MARK in n for n in leftovers)  # hidden, marked: sweepers can find them


def test_kill_at_a_random_moment_leaves_old_or_new_never_partial(tmp_path: Path, tally) -> None:
    rng = random.Random(19)
    path = tmp_path / "record.bin"
    path.write_bytes(b"0:" + hashlib.sha256(b"0:").hexdigest().encode())  # generation 0: the old
    last = 0
    for _ in range(trials(10)):
        proc = _start(path, "loop")
        assert proc.stdout and proc.stdout.readline().strip() == "go"
        time.sleep(rng.uniform(0.02, 0.3))
        _kill(proc)
        gen = _whole(path.read_bytes())
        held = gen is not None  # some complete generation, never a torn one
        assert tally.trial("atomic write: kill -9 at a random moment (file)", held)
        last = max(last, gen or 0)
    assert last > 1  # the writer got through several renames: the kills landed mid-stream


def test_kill_while_replacing_a_directory_never_leaves_a_partial_one(tmp_path: Path, tally) -> None:
    rng = random.Random(7)
    path = tmp_path / "step-00000001"
    for _ in range(trials(6)):
        proc = _start(path, "dirloop")
        assert proc.stdout and proc.stdout.readline().strip() == "go"
        time.sleep(rng.uniform(0.02, 0.3))
        _kill(proc)
        # Delete-then-rename may leave no directory; a present one is whole and of one generation.
        if path.exists():
            gens = {_whole((path / n).read_bytes()) for n in ("a", "b")}
            held = len(gens) == 1 and None not in gens
        else:
            held = True
        assert tally.trial("atomic write: kill -9 while replacing a directory", held)


def test_mode_text_and_failure_cleanup(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "secret"
    write_atomic(path, "tóken\n", mode=0o600)
    assert path.read_text(encoding="utf-8") == "tóken\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    try:
        with atomic_path(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("writer failed")
    except RuntimeError:
        pass
    assert path.read_text(encoding="utf-8") == "tóken\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["secret"]  # temp removed
