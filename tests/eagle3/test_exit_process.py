"""`python -m remote_agent.eagle3` under torchrun leaves without the interpreter's teardown once
its output is flushed (distributed.exit_process): gloo's threads aborted that teardown after a
finished 2-rank training (SIGABRT, and torchrun called the run failed). A plain run exits the
ordinary way."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.paths import REPO

SCRIPT = (
    "import atexit, sys\n"
    "from remote_agent.eagle3.distributed import exit_process\n"
    "atexit.register(lambda: print('teardown ran', flush=True))\n"
    "print('result line', end='')\n"  # unflushed: exit_process must flush it
    "sys.stderr.write('progress line')\n"
    "exit_process(3)\n"
)


def _run(world: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WORLD_SIZE": world, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def test_a_torchrun_rank_flushes_its_output_and_skips_the_teardown():
    got = _run("2")
    assert got.returncode == 3
    assert got.stdout == "result line" and got.stderr == "progress line"  # nothing lost
    assert "teardown ran" not in got.stdout


def test_a_plain_run_exits_the_ordinary_way():
    got = _run("1")
    assert got.returncode == 3
    assert got.stdout == "result lineteardown ran\n"
