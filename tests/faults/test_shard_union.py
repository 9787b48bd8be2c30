"""Attacks on "every sample exactly once over the union of the shards": a sharded dump (two
shards of the tiny target, the real HF extractor) is damaged at random, a copy per trial: a
shard file deleted, a shard file copied into the other shard, a whole shard dir removed, a
shard dir renamed to another count, a sample file moved into the shard that does not own it.
verify-dumps must fail (exit 1) with a located line naming the damaged path; the undamaged
union must pass."""

from __future__ import annotations

import random
import shutil
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eagle3" / "extraction"))

from eagle3_standins import write_dataset  # noqa: E402

from remote_agent.eagle3.cli import main  # noqa: E402

LENGTHS = [11, 7, 19, 5, 23, 9, 14, 6, 17, 8, 12, 21, 10, 13]
TRIALS = 12


def _extract(model, data, out, shard: str) -> int:
    return main(
        ["extract", "--backend", "hf", "--model", str(model), "--dataset", str(data), "--out",
         str(out), "--disk-margin-gb", "0", "--min-free-gb", "0", "--progress-interval", "0",
         "--shard-mb", "0.005", "--shard", shard]
    )  # fmt: skip


def _attack(root: Path, rng: random.Random) -> tuple[str, Path]:
    parts = sorted(root.glob("shard-*"))
    part = rng.choice(parts)
    other = next(p for p in parts if p != part)
    files = sorted((part / "shards").glob("r*.safetensors"))
    kind = rng.choice(["delete file", "duplicate file", "remove shard", "rename count", "move"])
    if kind == "delete file":
        rng.choice(files).unlink()
        return kind, part
    if kind == "duplicate file":
        src = rng.choice(files)
        dst = other / "shards" / ("r777-" + src.name.split("-", 1)[1])
        shutil.copy(src, dst)
        return kind, dst
    if kind == "remove shard":
        shutil.rmtree(part)
        return kind, part
    if kind == "rename count":
        new = root / part.name.replace("-of-02", "-of-03")
        part.rename(new)
        return kind, new
    src = rng.choice(files)
    dst = other / "shards" / src.name.replace("r000-", "r555-")
    src.rename(dst)
    return kind, other


def test_damaged_unions_are_located(tiny_target, tmp_path, tally, capsys):
    data = write_dataset(tmp_path / "merged.jsonl", LENGTHS)
    base = tmp_path / "base"
    for i in range(2):
        assert _extract(tiny_target, data, base, f"{i}/2") == 0
    capsys.readouterr()
    assert main(["verify-dumps", str(base), "--dataset", str(data), "--no-values"]) == 0
    rng = random.Random(1818)
    bad = []
    for t in range(TRIALS):
        root = tmp_path / f"t{t}"
        shutil.copytree(base, root)
        kind, where = _attack(root, rng)
        capsys.readouterr()
        code = main(["verify-dumps", str(root), "--dataset", str(data), "--no-values"])
        out = capsys.readouterr().out
        located = any(line.strip().startswith(str(where)) for line in out.splitlines())
        held = code == 1 and located
        tally.trial(f"shard union damaged ({kind}): verify-dumps fails, located", held)
        if not held:
            bad.append(f"{kind} at {where}: exit {code}\n{out}")
    assert not bad, "\n".join(bad)
