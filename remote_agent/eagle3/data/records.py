"""The tokenized-record contract shared by every stage after tokenization.

One JSON object per line: {"id": str, "source": str, "input_ids": [int], "loss_mask": [0|1]}.
`loss_mask[t] == 1` means position t is a supervised (assistant) token. Later stages never
re-tokenize: they carry `input_ids` and check them (a dump's echoed ids must equal these).

A merged file OUT.jsonl has two companions written by `eagle3 merge`:
  OUT.manifest.json  what `eagle3 verify` checks (counts, sha256 of OUT.jsonl and inputs, ...)
  OUT.index.json     {"data_size", "data_sha256", "records": [[id, byte_offset, n_tokens, n_trainable,
                     line_crc32], ...]}  (line_crc32: 8 hex digits; optional)
The index lets the trainer read any record by id without scanning the file.

Two readers with identical results: `parse_record` (json.loads, returns lists) and `parse_raw`, which
recognises the canonical layout that every stage writes and validates it with byte operations
(about 10x faster; merge and verify scan ~100 M tokens) and falls back to `parse_record` otherwise.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput, located

RECORD_KEYS = ("id", "source", "input_ids", "loss_mask")
# Dumps store input_ids as int32, so no stage may carry a larger id even without a vocabulary.
MAX_TOKEN_ID = 2**31 - 1


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
    line: str | bytes,
    path: object,
    lineno: int | None,
    vocab_size: int | None = None,
    default_source: str | None = None,
) -> Record:
    """Validate one line; any problem is a BadInput naming `path:lineno` and what to fix.
    `default_source` (merge: the file's source name) stands in for a missing 'source'."""
    try:
        obj: Any = json.loads(line)
    except ValueError as exc:
        raise BadInput(
            located(path, lineno, f"not valid JSON ({exc.args[0] if exc.args else exc})")
        ) from None
    except RecursionError:
        raise BadInput(located(path, lineno, "not valid JSON (nested too deeply)")) from None
    if not isinstance(obj, dict):
        raise BadInput(located(path, lineno, f"expected a JSON object, got {type(obj).__name__}"))
    if "source" not in obj and default_source is not None:
        obj["source"] = default_source
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
    elif max(ids) > MAX_TOKEN_ID:
        raise BadInput(
            located(path, lineno, f"record {rid!r}: token id {max(ids)} does not fit in int32")
        )
    return Record(rid, source, ids, mask)


@dataclass(frozen=True)
class RawRecord:
    """A validated record kept as its canonical JSON pieces: `ids_text` is b"5,17,3" exactly as
    written between the brackets, `mask_text` b"0,1,1". Cheap to hash, truncate and re-emit."""

    id: str
    source: str
    ids_text: bytes
    mask_text: bytes
    n_tokens: int
    n_trainable: int

    def line(self, source: str | None = None) -> bytes:
        """The canonical line (with newline); byte-identical to `Record.to_json()` + newline."""
        src = self.source if source is None else source
        return b"".join(
            (
                b'{"id":',
                json.dumps(self.id).encode(),
                b',"source":',
                json.dumps(src).encode(),
                b',"input_ids":[',
                self.ids_text,
                b'],"loss_mask":[',
                self.mask_text,
                b"]}\n",
            )
        )

    def truncated(self, max_len: int) -> RawRecord:
        """The first max_len positions."""
        if self.n_tokens <= max_len:
            return self
        ids = self.ids_text.split(b",", max_len)[:max_len]
        mask = self.mask_text[: 2 * max_len - 1]
        return RawRecord(self.id, self.source, b",".join(ids), mask, max_len, mask.count(b"1"))

    def token_ids(self):  # -> numpy int64 array
        import numpy as np

        return np.fromstring(self.ids_text, dtype=np.int64, sep=",")  # validated digits only

    def mask_array(self):  # -> numpy bool array
        import numpy as np

        return np.frombuffer(self.mask_text[0::2], dtype=np.uint8) == ord("1")


_DIGITS_COMMA = b"0123456789,"
_IDS_KEY = b',"input_ids":['
_MASK_KEY = b',"loss_mask":['
_POWERS = None  # 10, 100, ..., 10**10 as numpy int64, made on first use (numpy import is lazy)


def _fast_pieces(body: bytes) -> tuple[bytes, bytes, bytes] | None:
    """(head JSON, ids text, mask text) when `body` has the canonical layout, else None.

    The two list keys are found from the right: the list texts after them may hold only digits,
    commas and 0/1, and inside a JSON string a quote is always escaped, so neither key can be
    matched inside the id or source strings."""
    if not (body.startswith(b'{"id":') and body.endswith(b"]}")):
        return None
    m = body.rfind(_MASK_KEY)
    if m <= 0 or body[m - 1 : m] != b"]":
        return None
    i = body.rfind(_IDS_KEY, 0, m)
    if i <= 0:
        return None
    ids = body[i + len(_IDS_KEY) : m - 1]
    mask = body[m + len(_MASK_KEY) : -2]
    if not ids or ids.translate(None, _DIGITS_COMMA) or ids[:1] == b"," or ids[-1:] == b",":
        return None
    n = ids.count(b",") + 1
    if len(mask) != 2 * n - 1 or mask[0::2].translate(None, b"01") or mask[1::2].strip(b","):
        return None
    return body[:i] + b"}", ids, mask


def _ids_valid(ids: bytes, n: int, vocab_size: int | None) -> bool:
    """The digits-and-commas text `ids` holds n canonical JSON integers below the limit.

    One numeric parse does it all: an empty element stops the parse (count differs), an id that
    does not fit is clamped to int64 max (fails the range check), and a leading zero ("007",
    invalid JSON) makes the text longer than the digits of the parsed values."""
    global _POWERS
    import numpy as np

    if _POWERS is None:
        _POWERS = 10 ** np.arange(1, 11, dtype=np.int64)
    limit = MAX_TOKEN_ID + 1 if vocab_size is None else vocab_size
    try:
        values = np.fromstring(ids, dtype=np.int64, sep=",")
    except ValueError:
        return False
    if len(values) != n or int(values.max()) >= limit:
        return False
    digits = int(np.searchsorted(_POWERS, values, side="right").sum()) + n
    return digits + n - 1 == len(ids)


def parse_raw(
    line: bytes | str,
    path: object,
    lineno: int | None,
    vocab_size: int | None = None,
    default_source: str | None = None,
) -> RawRecord:
    """Like `parse_record` (same acceptance, same messages) but returns a `RawRecord`."""
    if isinstance(line, str):
        line = line.encode("utf-8", "surrogatepass")
    body = line[:-1] if line.endswith(b"\n") else line
    pieces = _fast_pieces(body)
    if pieces is not None:
        head, ids, mask = pieces
        try:
            obj = json.loads(head)
        except (ValueError, RecursionError):
            obj = None
        n = len(mask) // 2 + 1
        if (
            isinstance(obj, dict)
            and (obj.keys() == {"id", "source"} or (obj.keys() == {"id"} and default_source))
            and isinstance(obj["id"], str)
            and obj["id"]
            and isinstance(obj.setdefault("source", default_source), str)
            and _ids_valid(ids, n, vocab_size)
        ):
            return RawRecord(obj["id"], obj["source"], ids, mask, n, mask.count(b"1"))
    rec = parse_record(line, path, lineno, vocab_size, default_source)  # raises located messages
    return RawRecord(
        rec.id,
        rec.source,
        ",".join(map(str, rec.input_ids)).encode(),
        ",".join(map(str, rec.loss_mask)).encode(),
        len(rec.input_ids),
        rec.trainable,
    )


def line_digest(line: bytes) -> str:
    """Per-line CRC-32 (hex) stored in the index, so verify can name an edited record. Only a
    locator: the file's sha256 in the manifest is what proves integrity."""
    return f"{zlib.crc32(line):08x}"


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
    from remote_agent.eagle3.atomic import write_bytes_atomic

    # json.dumps (C encoder) then one write: json.dump to a file iterates in pure Python.
    write_bytes_atomic(Path(path), json.dumps(obj, separators=(",", ":")).encode() + b"\n")


INDEX_PROBES = 9  # records an index is checked against before it is trusted


def _stale(data_path: Path, size: int, obj: dict) -> str | None:
    """Why an index no longer describes its JSONL (None: it does). The size alone is not enough:
    a file rewritten with the same size (ids renamed with an equal-length prefix, as the online
    bench does on each attempt) kept a stale index that named the old ids. So a few records,
    first and last included, must still start at their offsets with their ids (and line CRCs,
    where the index has them): content, not mtime, so a copied dataset keeps its index."""
    if obj.get("data_size") != size:
        return "data size changed"
    entries = obj.get("records") or []
    if not entries:
        return None if size == 0 else "index lists no records"
    step = max(1, (len(entries) - 1) // (INDEX_PROBES - 1))
    probes = {*range(0, len(entries), step), len(entries) - 1}
    with open(data_path, "rb") as f:
        for i in sorted(probes):
            entry = entries[i]
            f.seek(entry[1])
            line = f.readline()
            try:
                rid = json.loads(line).get("id")
            except (ValueError, AttributeError):
                rid = None
            if rid != entry[0]:
                return f"record {i} at byte {entry[1]} is {rid!r}, the index says {entry[0]!r}"
            if len(entry) > 4 and entry[4] and line_digest(line) != entry[4]:
                return f"record {entry[0]!r} changed (line CRC)"
    return None


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
            stale = _stale(data_path, size, obj)
            if stale is None:
                return cls(data_path, obj["records"])
            if not build_if_missing:
                raise BadInput(f"{ipath}: stale index ({stale}); rebuild it")
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
