"""Attacks on "bad input gets one located line and exit 2" (docs/SAFETY.md, Bad input)."""

from __future__ import annotations

import random
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from runbook.loader import RunbookError, load_text
from tests.faults.tally import trials

CLI = [sys.executable, "-c", "import sys; from eagle_tui.cli import main; sys.exit(main())"]


def _laughs(width: int, depth: int) -> str:
    lines = [f"a0: &a0 [{','.join(['lol'] * width)}]"]
    for d in range(1, depth):
        lines.append(f"a{d}: &a{d} [{','.join([f'*a{d - 1}'] * width)}]")
    return "\n".join(lines) + "\nname: x\nsteps: []\n"


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize("seed", range(trials(20)))
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


# ---------------------------------------------------------------- merge: empty data, full disk
EAGLE3 = [sys.executable, "-m", "remote_agent.eagle3"]


def _eagle3(*args: object, timeout: int = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EAGLE3, *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


def _said(run: subprocess.CompletedProcess[str]) -> list[str]:
    """What a person reads on stderr (progress records are for the engine)."""
    return [ln for ln in run.stderr.strip().splitlines() if not ln.startswith("@@eagle3 ")]


def _source(path: Path, n: int, seed: int) -> Path:
    from tests.eagle3.data.eagle3_data_helpers import random_records, write_records

    return write_records(path, random_records(n, seed=seed, prefix=f"r{seed}"), "orig")


@pytest.mark.parametrize("seed", range(trials(20)))
def test_empty_source_is_not_a_dataset(tmp_path: Path, seed: int, tally) -> None:
    rnd = random.Random(seed)
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    full = _source(tmp_path / "full.jsonl", rnd.randint(1, 20), seed)
    # an empty source alone, or every record capped away
    args = [f"a={empty}"] if seed % 2 else [f"a={full}", "--cap", "a=0"]
    out = tmp_path / "m.jsonl"
    run = _eagle3("merge", *args, "--out", out)
    lines = _said(run)
    held = run.returncode == 2 and len(lines) == 1 and not out.exists()
    if seed < 4:  # deliberately empty: allowed, and verify still refuses it unless told the same
        made = _eagle3("merge", *args, "--out", out, "--allow-empty")
        check = _eagle3("verify", out)
        ok = _eagle3("verify", out, "--allow-empty")
        held = held and made.returncode == 0 and check.returncode != 0 and ok.returncode == 0
    tally.trial("empty tokenized source passes merge + verify", held)
    assert held, (run.returncode, run.stderr)


@pytest.fixture
def tiny_disk(tmp_path: Path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)]).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_merge_on_a_full_disk(tmp_path: Path, tiny_disk: Path, tally) -> None:
    src = _source(tmp_path / "src.jsonl", 400, 1)  # ~1 MB of JSONL: never fits in 256 KiB
    rnd = random.Random(3)
    for trial in range(trials(20)):
        for p in tiny_disk.iterdir():  # a different amount of free space each trial
            p.unlink()
        (tiny_disk / "filler").write_bytes(b"x" * rnd.randint(0, 200_000))
        out = tiny_disk / "m.jsonl"
        run = _eagle3("merge", f"a={src}", "--out", out)
        lines = _said(run)
        left = sorted(p.name for p in tiny_disk.iterdir() if p.name != "filler")
        held = (
            run.returncode == 1
            and len(lines) == 1
            and "no space left" in lines[0]
            and "Traceback" not in run.stderr
            and left == []
        )
        tally.trial("ENOSPC during eagle3 merge", held)
        assert held, (trial, run.returncode, run.stderr[-2000:], left)


def test_requires_cycles_are_named_and_located(tally) -> None:
    """A random cycle among random steps: one problem, at the first step of the cycle it names,
    naming exactly that cycle in requires order (a -> b: a requires b)."""
    rnd = random.Random(19)
    for _ in range(trials(20)):
        ids = [f"s{i}" for i in range(rnd.randint(2, 9))]
        ring = rnd.sample(ids, rnd.randint(2, len(ids)))
        requires = {sid: set() for sid in ids}
        for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
            requires[a].add(b)
        for i, sid in enumerate(ids):  # acyclic extras: only on steps outside the ring, earlier
            if sid not in ring and i:
                requires[sid].add(rnd.choice(ids[:i]))
        steps = "".join(
            f"  - id: {sid}\n    title: t\n    run: echo\n    requires: [{', '.join(sorted(requires[sid]))}]\n"
            for sid in ids
        )
        try:
            load_text(f"name: x\nsteps:\n{steps}", "rb.yaml")
            found = []
        except RunbookError as exc:
            found = [p for p in exc.problems if "cycle" in p]
        named = found[0].rsplit("cycle: ", 1)[1].split(" -> ") if len(found) == 1 else []
        loop = named[:-1]
        start = ids.index(named[0]) if named else -1
        held = (
            len(found) == 1
            and named[0] == named[-1]
            and sorted(loop) == sorted(ring)
            and all(b in requires[a] for a, b in zip(named, named[1:], strict=False))
            and found[0].startswith(f"rb.yaml:{6 + 4 * start}:15: steps[{start}].requires:")
        )
        assert tally.trial("requires cycle named and located", held), (found, ring)


LAX_SIZES = ["5kb!", "1GiB of it", "٣GiB", "1e3", "5.", "-1GiB", "0x10", "1,5GiB", "GiB", "1 G i B"]


@pytest.mark.parametrize("size", LAX_SIZES)
def test_lax_size_strings_refused_and_located(size: str, tally) -> None:
    """ByteSize alone reads some of these (junk after the unit, any Unicode digit): never us."""
    text = f"name: x\nsteps:\n  - id: a\n    title: t\n    run: echo\n    preconditions:\n      - check: disk_free\n        path: /\n        min: '{size}'\n"
    try:
        load_text(text, "rb.yaml")
        problems: list[str] = []
    except RunbookError as exc:
        problems = list(exc.problems)
    held = (
        len(problems) == 1
        and problems[0].startswith("rb.yaml:9:")
        and f"cannot read size {size!r}" in problems[0]
    )
    assert tally.trial("lax size string refused, located", held), problems
