"""The merged dataset's manifest (OUT.manifest.json) and the facts merge and verify share.

Field list: docs/CONTRACTS.md. Two properties make a merged file checkable on its own:
- records are ordered by `shuffle_key(seed, source, id)`, strictly ascending, so verify detects a
  reordered, duplicated or foreign line, and a changed seed, from the data alone;
- `self_sha256` covers every other manifest field, so a hand-edited manifest is caught too.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput

FORMAT = "eagle3-merged"
VERSION = 1
HIST_MIN = 16  # smallest histogram bucket bound; bounds are powers of two


def shuffle_key(seed: int, source: str, rid: str) -> int:
    """64-bit sort key: the merge's shuffle order (a keyed hash, independent of input order)."""
    data = f"{seed}\0{source}\0{rid}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def hist_bound(n: int) -> int:
    """Upper bound of n's histogram bucket: the smallest power of two >= n (at least HIST_MIN)."""
    return max(HIST_MIN, 1 << (max(n, 1) - 1).bit_length())


def histogram_json(counts: dict[int, int]) -> list[list[int]]:
    """[[bound, records], ...] ascending: records with previous bound < length <= bound."""
    return [[b, counts[b]] for b in sorted(counts)]


@dataclass
class SourceStats:
    records: int = 0
    tokens: int = 0
    trainable_tokens: int = 0
    sha256: str = ""
    dropped_duplicates: int = 0
    truncated: int = 0
    capped: int = 0
    dropped_untrainable: int = 0


def tool_version() -> str:
    try:
        from importlib.metadata import version

        return version("eagle-tui")
    except Exception:
        return "0+unknown"


def self_sha256(manifest: dict[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k != "self_sha256"}
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def build_manifest(
    *,
    file: str,
    sha256: str,
    sources: dict[str, SourceStats],
    dropped_sources: list[str],
    histogram: dict[int, int],
    seed: int,
    max_len: int | None,
) -> dict[str, Any]:
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "file": file,
        "sha256": sha256,
        "records": sum(s.records for s in sources.values()),
        "tokens": sum(s.tokens for s in sources.values()),
        "trainable_tokens": sum(s.trainable_tokens for s in sources.values()),
        "sources": {name: asdict(s) for name, s in sources.items()},
        "dropped_sources": dropped_sources,
        "length_histogram": histogram_json(histogram),
        "seed": seed,
        "max_len": max_len,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tool_version": tool_version(),
    }
    manifest["self_sha256"] = self_sha256(manifest)
    return manifest


# Field -> accepted JSON types, for reading a manifest back.
_FIELDS: dict[str, tuple[type, ...]] = {
    "format": (str,),
    "version": (int,),
    "file": (str,),
    "sha256": (str,),
    "records": (int,),
    "tokens": (int,),
    "trainable_tokens": (int,),
    "sources": (dict,),
    "dropped_sources": (list,),
    "length_histogram": (list,),
    "seed": (int,),
    "max_len": (int, type(None)),
    "created_at": (str,),
    "tool_version": (str,),
    "self_sha256": (str,),
}
_SOURCE_FIELDS = tuple(SourceStats.__dataclass_fields__)


def load_manifest(path: Path) -> dict[str, Any]:
    """The manifest, with every field present and of the right type (BadInput otherwise)."""
    path = Path(path)
    try:
        obj = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise BadInput(f"{path}: no manifest (was the file written by `eagle3 merge`?)") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror})") from None
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise BadInput(f"{path}: expected a JSON object")
    for key, types in _FIELDS.items():
        if key not in obj:
            raise BadInput(f"{path}: missing field {key!r}")
        value = obj[key]
        if isinstance(value, bool) or not isinstance(value, types):
            raise BadInput(f"{path}: field {key!r} has the wrong type ({type(value).__name__})")
    for name, stats in obj["sources"].items():
        if not isinstance(stats, dict):
            raise BadInput(f"{path}: sources.{name} must be an object")
        for key in _SOURCE_FIELDS:
            value = stats.get(key)
            want = str if key == "sha256" else int
            if isinstance(value, bool) or not isinstance(value, want):
                raise BadInput(f"{path}: sources.{name}.{key} missing or of the wrong type")
    if not all(isinstance(n, str) for n in obj["dropped_sources"]):
        raise BadInput(f"{path}: dropped_sources must be a list of source names")
    for row in obj["length_histogram"]:
        if not (
            isinstance(row, list)
            and len(row) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in row)
        ):
            raise BadInput(f"{path}: length_histogram rows must be [bound, count] integer pairs")
    return obj
