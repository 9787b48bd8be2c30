"""Samples split over shards (hosts, or servers): which shard owns a sample, one dump per shard,
and the union of the shards read back as one dump.

Assignment: shard = sha256(sample id) mod N (the first 8 bytes, big-endian). Chosen over
contiguous ranges of the file order because it depends on the id alone: a re-run, a resumed
box, verify-dumps and any later reader compute the same owner without the dataset's order or
length, appending samples never moves an old one, and tokens spread evenly in expectation
(merge shuffles, but a hash does not rely on it). A lost box resumes exactly its own missing
samples: its shard's ids minus those its dump already holds.

Several servers under one shard (e.g. two TP-4 servers on a box): server k of K under host
shard i of N takes global shard i + N*k of N*K. N divides N*K, so h mod N*K = i + N*k
implies h mod N = i: the servers' shards partition exactly the host's shard, every server
has its own dump, and the union is still shards 0..N*K-1 of one assignment.

Layout: `<root>/shard-<i>-of-<n>/` is an ordinary dump (meta.json, shards/, errors/) plus
`shard.json` (index, count, assignment); `<root>` itself has no meta.json. Readers given
`<root>` (DumpReader, verify-dumps, the trainer's data.dump) see the union.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput
from remote_agent.wire.atomic_write import write_atomic

ASSIGNMENT = "sha256(sample_id)[:8] mod count"
MARKER = "shard.json"
_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
_DIR = re.compile(r"^shard-(\d+)-of-(\d+)$")


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    @property
    def name(self) -> str:
        return f"shard-{self.index:02d}-of-{self.count:02d}"

    def owns(self, sample_id: str) -> bool:
        return shard_of(sample_id, self.count) == self.index

    def split(self, k: int, parts: int) -> Shard:
        """Part k of `parts` of this shard (several servers under one host's shard): a shard of
        count*parts whose samples all belong to this one."""
        return Shard(self.index + self.count * k, self.count * parts)


def shard_of(sample_id: str, count: int) -> int:
    digest = hashlib.sha256(sample_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count


def parse_shard(text: str) -> Shard:
    """`I/N` (as `--shard ${host_rank}/${host_count}` writes it), 0 <= I < N."""
    m = _SPEC.match(text)
    if not m:
        raise BadInput(f"--shard {text!r}: write INDEX/COUNT, e.g. 0/2")
    index, count = int(m.group(1)), int(m.group(2))
    if count < 1 or index >= count:
        raise BadInput(f"--shard {text!r}: the index must be in 0..COUNT-1 and COUNT >= 1")
    return Shard(index, count)


def restrict(dataset: Any, shard: Shard | None) -> Any:
    """The dataset as one shard sees it: ids(), len, `in` and token sums over its samples only
    (so resume, the disk preflight and verification all count the shard's samples)."""
    if shard is None:
        return dataset
    from remote_agent.eagle3.extraction.dataset import Dataset

    keep = frozenset(s for s in dataset.ids() if shard.owns(s))

    class ShardView(Dataset):
        def ids(self) -> list[str]:
            return [s for s in self.index.ids() if s in keep]

        def __len__(self) -> int:
            return len(keep)

        def __contains__(self, sample_id: object) -> bool:
            return sample_id in keep

        def total_tokens(self, ids: list[str] | None = None) -> int:
            return sum(self.length(i) for i in (self.ids() if ids is None else ids))

    return ShardView(dataset.path, dataset.index, dataset.manifest)


def prepare_dir(root: Path, shard: Shard, dataset: Path, write: bool = True) -> Path:
    """`<root>/<shard name>` with its shard.json; refuses a root already split another way."""
    root = Path(root)
    if (root / "meta.json").exists():
        raise BadInput(f"{root}: holds an unsharded dump; give sharded extraction another --out")
    for part in parts_of(root):
        other = _DIR.match(part.name)
        if other and int(other.group(2)) != shard.count:
            raise BadInput(
                f"{part}: {root} is already split into {int(other.group(2))} shards, not "
                f"{shard.count}; resume with --shard I/{int(other.group(2))} (the assignment "
                "depends on the count) or use another --out"
            )
    path = root / shard.name
    if write:
        path.mkdir(parents=True, exist_ok=True)
        record = {
            "index": shard.index,
            "count": shard.count,
            "assignment": ASSIGNMENT,
            "dataset": Path(dataset).name,
        }
        write_atomic(path / MARKER, json.dumps(record, indent=1) + "\n")
    return path


def parts_of(root: Path) -> list[Path]:
    """The shard dumps under a union root, in shard order; [] for a plain dump or no dir."""
    root = Path(root)
    if (root / "meta.json").exists() or not root.is_dir():
        return []
    return sorted(
        (p for p in root.iterdir() if p.is_dir() and _DIR.match(p.name)),
        key=lambda p: int(_DIR.match(p.name).group(1)),  # type: ignore[union-attr]
    )


def read_marker(part: Path) -> Shard | None:
    try:
        data = json.loads((Path(part) / MARKER).read_text())
        return Shard(int(data["index"]), int(data["count"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def union_problems(root: Path) -> tuple[int | None, list[str]]:
    """(the shard count, located problems with the set of shard dirs: mixed counts, a dir
    whose shard.json disagrees with its name, a shard with no dump). Missing shard dirs are
    not listed here: their samples show up as missing, each with its owner."""
    counts, problems = set(), []
    for part in parts_of(root):
        m = _DIR.match(part.name)
        assert m
        named = Shard(int(m.group(1)), int(m.group(2)))
        counts.add(named.count)
        marker = read_marker(part)
        if marker is None:
            problems.append(f"{part}: no readable {MARKER} (not written by sharded extraction)")
        elif marker != named:
            problems.append(
                f"{part / MARKER}: says shard {marker.index}/{marker.count}, the dir name "
                f"{named.index}/{named.count}"
            )
        if not (part / "meta.json").exists():
            problems.append(f"{part}: no meta.json (its extraction never started)")
    if len(counts) > 1:
        problems.append(f"{root}: shard dirs of different counts {sorted(counts)}")
    return (counts.pop() if len(counts) == 1 else None), problems
