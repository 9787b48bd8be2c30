"""Issue 15, the command line: `eagle3` run by a person in a terminal shows a progress bar and a
readable summary, not `@@eagle3 {...}` lines; piped (or under the agent) it keeps the JSON lines.
A real pseudo-terminal (pty.openpty) and the real `eagle3 merge`."""

from __future__ import annotations

import json
import os
import pty
import random
import re
import select
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO


def sources(tmp_path: Path) -> list[str]:
    rng = random.Random(3)
    out = []
    for name in ("alpha", "beta"):
        p = tmp_path / f"{name}.jsonl"
        with p.open("w") as f:
            for k in range(400):
                n = rng.randint(4, 60)
                ids = [rng.randrange(1000) for _ in range(n)]
                rec = {"id": f"{name}-{k}", "source": name, "input_ids": ids, "loss_mask": [1] * n}
                f.write(json.dumps(rec) + "\n")
        out.append(str(p))
    return out


def merge_argv(tmp_path: Path) -> list[str]:
    out = tmp_path / "merged.jsonl"
    return [sys.executable, "-m", "remote_agent.eagle3", "merge", *sources(tmp_path), "--out",
            str(out), "--seed", "1", "--max-len", "200"]  # fmt: skip


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="120", TERM="xterm-256color")
    e.pop("EAGLE3_PROGRESS", None)
    e.update(extra)
    return e


def run_in_pty(argv: list[str], **extra: str) -> tuple[int, str]:
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env(**extra))
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            proc.kill()
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")


def test_a_person_in_a_terminal_sees_a_bar_and_a_summary(tmp_path):
    rc, shown = run_in_pty(merge_argv(tmp_path))
    assert rc == 0, shown
    assert "@@eagle3" not in shown and '{"kind"' not in shown
    assert "━" in shown  # rich's bar
    assert "result" in shown and "records" in shown  # the summary table of the result record
    assert "800" in shown  # the counts, readable


def test_piped_or_asked_for_json_it_keeps_the_machine_lines(tmp_path):
    piped = subprocess.run(merge_argv(tmp_path), capture_output=True, text=True, env=env())
    assert piped.returncode == 0, piped.stderr
    kinds = [
        json.loads(x[9:])["kind"] for x in piped.stderr.splitlines() if x.startswith("@@eagle3 ")
    ]
    assert "progress" in kinds and kinds[-1] == "result"
    rc, shown = run_in_pty(merge_argv(tmp_path), EAGLE3_PROGRESS="json")  # the agent's setting
    assert rc == 0 and '@@eagle3 {"kind":"result"' in shown


def test_metrics_read_as_figures_and_a_box_without_rich_gets_a_text_bar(tmp_path):
    code = (
        "from remote_agent.eagle3.progress import Progress, emit\n"
        "emit('metrics', step=120, loss=2.3456789012345678, acc=0.41234567890123456, lr=3e-05)\n"
        "p = Progress('train', 600, 'steps', interval=0)\n"
        "p.advance(300)\n"
        "emit('result', steps=600, out='drafter')\n"
    )
    rc, shown = run_in_pty([sys.executable, "-c", code])
    assert rc == 0 and "@@eagle3" not in shown
    assert "step 120 · loss 2.346 · acc 0.4123 · lr 3e-05" in shown
    assert "2.3456789012" not in shown
    # without rich (a bare box python): the same in plain text, the bar redrawn in place
    blocker = tmp_path / "norich"
    (blocker / "rich").mkdir(parents=True)
    (blocker / "rich" / "__init__.py").write_text("raise ImportError('no rich on this box')\n")
    rc, shown = run_in_pty([sys.executable, "-c", code], PYTHONPATH=f"{blocker}{os.pathsep}{REPO}")
    assert rc == 0 and "@@eagle3" not in shown, shown
    assert "train [###############...............] 300/600 steps" in shown
    assert "result: steps 600 · out drafter" in shown


def test_the_result_follows_one_final_bar_in_words_a_person_reads(tmp_path):
    """Issue 28 (polish): the result table comes after the bars' final state, drawn once (rich's
    stand-in for stderr no longer got a second view that redrew a stale bar at exit); booleans
    read yes/no, byte counts as sizes (also in the bar), nested objects as words, not JSON."""
    rc, shown = run_in_pty(merge_argv(tmp_path))
    assert rc == 0, shown
    bars, table = shown.rsplit("result", 1)
    assert "━" not in table and "merge-read" not in table, table  # nothing drawn after it
    assert "247.6 KiB/247.6 KiB" in bars and "253554" not in shown  # the bytes read, in sizes
    assert "budget_bytes 512.0 MiB" in table and '{"' not in table
    assert "alpha (records 400 · tokens 12,924" in table
    code = (
        "from remote_agent.eagle3.progress import Progress, emit\n"
        "p = Progress('verify', 3 << 30, 'bytes', interval=0)\n"
        "p.advance(1 << 30)\n"
        "p.finish()\n"
        "emit('result', ok=True, identical=False, bytes=123456789, shards=[])\n"
    )
    rc, shown = run_in_pty([sys.executable, "-c", code])
    assert rc == 0, shown
    assert "1.0 GiB/3.0 GiB" in shown
    bars, table = shown.rsplit("result", 1)
    assert "True" not in shown and "False" not in shown
    for row in (("ok", "yes"), ("identical", "no"), ("bytes", "117.7 MiB"), ("shards", "none")):
        assert re.search(rf"│ {row[0]} +│ {re.escape(row[1])} ", table), (row, table)
    assert "━" not in table
