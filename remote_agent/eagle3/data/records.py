"""The tokenized-record contract shared by every stage after tokenization.

One JSON object per line: {"id": str, "source": str, "input_ids": [int], "loss_mask": [0|1]}.
`loss_mask[t] == 1` means position t is a supervised (assistant) token. Later stages never
re-tokenize: they carry `input_ids` and check them (a dump's echoed ids must equal these).

A merged file OUT.jsonl has two companions written by `eagle3 merge`:
  OUT.manifest.json  what `eagle3 verify` checks (counts, sha256 of OUT.jsonl and inputs, ...)
  OUT.index.json     {"data_size", "data_sha256", "records": [[id, byte_offset, n_tokens, n_trainable], ...]}
The index lets the trainer read any record by id without scanning the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput, located

RECORD_KEYS = ("id", "source", "input_ids", "loss_mask")


@dataclass(frozen=True)
class Record:
    id: str
    source: str
    input_ids: list[int]
    loss_mask: list[int]

    def to_json(self) -> str:
        return json.dumps(
            {
                "id": self.id,
                "source": self.source,
                "input_ids": self.input_ids,
                "loss_mask": self.loss_mask,
            },
            separators=(",", ":"),
        )

    @property
    def trainable(self) -> int:
        return sum(self.loss_mask)


def parse_record(
    line: str | bytes, path: object, lineno: int, vocab_size: int | None = None
) -> Record:
    """Validate one line; any problem is a BadInput naming `path:lineno` and what to fix."""
    try:
        obj: Any = json.loads(line)
    except ValueError as exc:
        raise BadInput(
            located(path, lineno, f"not valid JSON ({exc.args[0] if exc.args else exc})")
        ) from None
    if not isinstance(obj, dict):
        raise BadInput(located(path, lineno, f"expected a JSON object, got {type(obj).__name__}"))
    missing = [k for k in RECORD_KEYS if k not in obj]
    if missing:
        raise BadInput(located(path, lineno, f"missing field(s) {', '.join(missing)}"))
    rid, source, ids, mask = obj["id"], obj["source"], obj["input_ids"], obj["loss_mask"]
    if not isinstance(rid, str) or not rid:
        raise BadInput(located(path, lineno, "field 'id' must be a non-empty string"))
    if not isinstance(source, str):
        raise BadInput(located(path, lineno, "field 'source' must be a string"))
    if not isinstance(ids, list) or not all(type(t) is int for t in ids):
        raise BadInput(
            located(path, lineno, f"record {rid!r}: 'input_ids' must be a list of integers")
        )
    if not isinstance(mask, list) or not all(m in (0, 1) and type(m) is int for m in mask):
        raise BadInput(located(path, lineno, f"record {rid!r}: 'loss_mask' must be a list of 0/1"))
    if len(ids) != len(mask):
        raise BadInput(
            located(
                path,
                lineno,
                f"record {rid!r}: {len(ids)} input_ids but {len(mask)} loss_mask entries",
            )
        )
    if not ids:
        raise BadInput(located(path, lineno, f"record {rid!r}: empty input_ids"))
    if vocab_size is not None:
        bad = next((t for t in ids if t < 0 or t >= vocab_size), None)
        if bad is not None:
            raise BadInput(
                located(
                    path,
                    lineno,
                    f"record {rid!r}: token id {bad} outside the vocabulary [0, {vocab_size})",
                )
            )
    elif min(ids) < 0:
        raise BadInput(located(path, lineno, f"record {rid!r}: negative token id {min(ids)}"))
    return Record(rid, source, ids, mask)


def iter_records(path: Path, vocab_size: int | None = None) -> Iterator[tuple[int, int, Record]]:
    """(line number, byte offset, record) for every non-empty line; raises BadInput on the first bad one."""
    path = Path(path)
    if not path.exists():
        raise BadInput(f"{path}: no such file")
    offset = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            start = offset
            offset += len(raw)
            if raw.strip():
                yield lineno, start, parse_record(raw, path, lineno, vocab_size)


def index_path(data_path: Path) -> Path:
    data_path = Path(data_path)
    return data_path.with_name(data_path.name.removesuffix(".jsonl") + ".index.json")


def manifest_path(data_path: Path) -> Path:
    data_path = Path(data_path)
    return data_path.with_name(data_path.name.removesuffix(".jsonl") + ".manifest.json")


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = Path(f"{path}.tmp.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class DatasetIndex:
    """Random access to a tokenized JSONL by record id, from OUT.index.json (built if absent)."""

    def __init__(self, data_path: Path, entries: list[list]) -> None:
        self.data_path = Path(data_path)
        self.entries = entries  # [id, offset, n_tokens, n_trainable]
        self.by_id = {e[0]: i for i, e in enumerate(entries)}
        self._file = None

    @classmethod
    def open(cls, data_path: Path, build_if_missing: bool = True) -> DatasetIndex:
        data_path = Path(data_path)
        ipath = index_path(data_path)
        size = data_path.stat().st_size
        if ipath.exists():
            obj = json.loads(ipath.read_text())
            if obj.get("data_size") == size:
                return cls(data_path, obj["records"])
            if not build_if_missing:
                raise BadInput(f"{ipath}: stale index (data size changed); rebuild it")
        elif not build_if_missing:
            raise BadInput(f"{ipath}: missing index")
        entries = [
            [r.id, off, len(r.input_ids), r.trainable] for _, off, r in iter_records(data_path)
        ]
        write_json_atomic(ipath, {"data_size": size, "data_sha256": None, "records": entries})
        return cls(data_path, entries)

    def __len__(self) -> int:
        return len(self.entries)

    def ids(self) -> list[str]:
        return [e[0] for e in self.entries]

    def length(self, rid: str) -> int:
        return self.entries[self.by_id[rid]][2]

    def read(self, rid: str) -> Record:
        i = self.by_id[rid]
        if self._file is None:
            self._file = open(self.data_path, "rb")
        self._file.seek(self.entries[i][1])
        return parse_record(self._file.readline(), self.data_path, None)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
