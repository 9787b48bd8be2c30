"""The merged dataset as the extractors see it: ids, lengths and token ids by sample id, with the
manifest checked first (a dataset without its manifest was never verified: refuse)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote_agent.eagle3.data.records import DatasetIndex, manifest_path
from remote_agent.eagle3.errors import BadInput, Failed

CONTROL_PREFIX = "__eagle3__:"  # reserved for the client's canary/flush requests


@dataclass
class Dataset:
    path: Path
    index: DatasetIndex
    manifest: dict[str, Any] | None

    def ids(self) -> list[str]:
        return self.index.ids()

    def length(self, sample_id: str) -> int:
        return self.index.length(sample_id)

    def input_ids(self, sample_id: str) -> list[int]:
        return self.index.read(sample_id).input_ids

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, sample_id: object) -> bool:
        return sample_id in self.index.by_id

    def total_tokens(self, ids: list[str] | None = None) -> int:
        if ids is None:
            return sum(e[2] for e in self.index.entries)
        return sum(self.length(i) for i in ids)


def open_dataset(path: Path, require_manifest: bool = True) -> Dataset:
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such dataset file; produce it with `eagle3 merge`")
    mpath = manifest_path(path)
    manifest = None
    if mpath.exists():
        try:
            manifest = json.loads(mpath.read_text())
        except ValueError as exc:
            raise BadInput(f"{mpath}: not valid JSON ({exc})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != "eagle3-merged":
            raise BadInput(f"{mpath}: not an eagle3-merged manifest")
        if manifest.get("file") not in (None, path.name):
            raise BadInput(f"{mpath}: describes {manifest.get('file')!r}, not {path.name!r}")
    elif require_manifest:
        raise BadInput(
            f"{mpath}: missing manifest for {path.name}; only a merged, verified dataset can be "
            "extracted (`eagle3 merge` writes it, `eagle3 verify` checks it)"
        )
    index = DatasetIndex.open(path)
    if len(index.by_id) != len(index.entries):
        raise BadInput(f"{path}: duplicate sample ids; re-run `eagle3 merge`")
    if manifest is not None and manifest.get("records") not in (None, len(index)):
        raise Failed(
            f"{path}: {len(index)} records but the manifest says {manifest['records']}; "
            "run `eagle3 verify`"
        )
    reserved = next((i for i in index.ids() if i.startswith(CONTROL_PREFIX)), None)
    if reserved is not None:
        raise BadInput(
            f"{path}: sample id {reserved!r} uses the reserved prefix {CONTROL_PREFIX!r}"
        )
    return Dataset(path, index, manifest)
