"""The union of a sharded extraction's dumps checked as a whole (verify-dumps): the shard dirs,
samples in the wrong shard, duplicates, and what is missing per owning shard.

Apart from `sharding.py` because it reads the dumps: `dense.py` (the format, shipped into SGLang
and hash-pinned) asks `sharding.parts_of` for a root's shard dumps, so `sharding.py` must not
import the format back (docs/ARCHITECTURE.md, the import graph test)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from remote_agent.eagle3.dense import DumpReader
from remote_agent.eagle3.extraction.sharding import (
    Shard,
    parts_of,
    read_marker,
    shard_of,
    union_problems,
)


def union_report(root: Path, dataset: Any) -> list[str]:
    """Located lines for what makes a sharded root unfit beyond the per-sample checks of
    verify-dumps: the shard dirs themselves, samples dumped by a shard that does not own them,
    each duplicate with both files, and the missing samples counted per owning shard."""
    count, lines = union_problems(root)
    if count is None:
        return lines
    present: dict[int, Path] = {}
    for part in parts_of(root):
        marker = read_marker(part)
        if marker is None or not (part / "meta.json").exists():
            continue
        present[marker.index] = part
        reader = DumpReader(part)
        wrong = [s for s in reader.ids() if shard_of(s, count) != marker.index]
        reader.close()
        if wrong:
            lines.append(
                f"{part}: {len(wrong)} sample(s) owned by another shard, e.g. {wrong[0]!r} "
                f"(shard {shard_of(wrong[0], count)}); was it extracted with another count?"
            )
    reader = DumpReader(root)
    for sid, first, again in reader.duplicates:
        lines.append(f"{again}: sample {sid!r} again (first in {first})")
    missing: dict[int, list[str]] = {}
    for sid in dataset.ids():
        if sid not in reader:
            missing.setdefault(shard_of(sid, count), []).append(sid)
    reader.close()
    for index, ids in sorted(missing.items()):
        where = present.get(index) or Path(root) / Shard(index, count).name
        state = "" if index in present else " (no dump: that shard never ran)"
        lines.append(
            f"{where}{state}: {len(ids)} sample(s) missing, e.g. {ids[0]!r}; re-run "
            f"extraction with --shard {index}/{count} to dump exactly these"
        )
    return lines
