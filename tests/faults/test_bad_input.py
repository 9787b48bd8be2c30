"""Attacks on "bad input gets one located line and exit 2" (docs/SAFETY.md, Bad input)."""

from __future__ import annotations

import random
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from runbook.loader import RunbookError, load_text

CLI = [sys.executable, "-c", "import sys; from eagle_tui.cli import main; sys.exit(main())"]


def _laughs(width: int, depth: int) -> str:
    lines = [f"a0: &a0 [{','.join(['lol'] * width)}]"]
    for d in range(1, depth):
        lines.append(f"a{d}: &a{d} [{','.join([f'*a{d - 1}'] * width)}]")
    return "\n".join(lines) + "\nname: x\nsteps: []\n"


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize("seed", range(20))
def test_alias_bomb_validate(tmp_path: Path, seed: int, tally) -> None:
    rnd = random.Random(seed)
    rb = tmp_path / "rb.yaml"
    rb.write_text(_laughs(rnd.randint(8, 12), rnd.randint(7, 9)))
    try:
        p = subprocess.run(
            [*CLI, "validate", str(rb)],
            capture_output=True,
            text=True,
            timeout=20,
            preexec_fn=_limit_memory,
        )
        lines = p.stderr.strip().splitlines() + p.stdout.strip().splitlines()
        held = p.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"{rb}:")
    except subprocess.TimeoutExpired:
        held = False
    tally.trial("billion-laughs runbook at validate", held)
    assert held


TAGS = ["!!python/object:os.system", "!!python/name:os.system", "!foo", "!!binary", "!!set", "!<x>"]


@pytest.mark.parametrize("tag", TAGS)
@pytest.mark.parametrize("where", ["name", "steps", "value"])
def test_unknown_tags_refused(tag: str, where: str, tally) -> None:
    text = {
        "name": f"name: {tag} x\nsteps: []\n",
        "steps": f"name: x\nsteps: {tag}\n  - id: a\n    run: echo\n",
        "value": f"name: x\nsteps:\n  - id: a\n    run: {tag} echo\n",
    }[where]
    try:
        load_text(text, "rb.yaml")
        held = False
    except RunbookError as exc:
        held = any(p.startswith("rb.yaml:") and "tag" in p for p in exc.problems)
    tally.trial("unknown YAML tag in runbook", held)
    assert held
