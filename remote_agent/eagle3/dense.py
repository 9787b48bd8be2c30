"""The one on-disk format for hidden-state dumps (written by the SGLang hook and the HF reference
extractor alike, read by the trainer and `verify-dumps`).

Layout of a dump directory:

    meta.json                         DumpMeta: model, resolved capture ids, dtypes, versions
    shards/r{rank:03d}-{seq:06d}.safetensors
    errors/<name>.error.json          per-sample error markers (sample not dumped, and why)
    canary/                           the SGLang client's canary dump (same layout; not data)

Each shard is one safetensors file (mmap-able, no pickle) holding many samples back to back:

    input_ids  int32 [N]              the token ids the target saw (checked against the dataset)
    aux        bf16  [N, K*H]         residual stream entering the K capture layers, ascending ids
      or aux_fp8 float8_e4m3fn [N, K*H] + aux_scale float32 [N, K]  (per-token, per-layer scale)
    final      bf16  [N, H]           after the final norm: exactly what lm_head consumes

and, in its safetensors metadata, the shard's index: `samples` = JSON list of
[sample_id, row_offset, length]. A shard is written to a temporary name, fsynced and published
under its final name without ever replacing an existing shard, so a shard either exists
complete (with its index) or not at all; a sample counts as dumped exactly when it is in some
shard's index. Training starts by reading the shard headers only.

This module imports only the standard library at module level (torch and safetensors lazily):
the SGLang dump hook ships a byte-identical copy of it next to sglang.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import queue
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

FORMAT = "eagle3-dense"
FORMAT_VERSION = 1
FP8_MAX = 448.0  # largest finite float8_e4m3fn
DEFAULT_SHARD_BYTES = 2 << 30
AUX_DTYPES = ("bf16", "fp8_e4m3")
ERRORS_DIR = "errors"
CANARY_DIR = "canary"


class DumpFormatError(Exception):
    """The directory is not a valid dump (wrong meta, corrupt shard, duplicate sample)."""


class DumpWriteError(OSError):
    """A shard could not be written (full disk, permissions). Nothing partial is left behind;
    `sample_ids` are the samples that were in the lost shard (write them again)."""

    def __init__(self, code: int | None, message: str, sample_ids: list[str] | None = None):
        super().__init__(code, message)
        self.sample_ids: list[str] = list(sample_ids or [])


@dataclass(frozen=True)
class DumpMeta:
    model: str
    hidden_size: int
    num_layers: int
    aux_layer_ids: list[int]  # resolved, input-of-layer convention (HF hidden_states index)
    aux_dtype: str = "bf16"  # "bf16" | "fp8_e4m3"
    producer: str = "hf-reference"  # | "sglang-patch"
    final_norm: str = "post"
    aux_norm: str = "pre"
    versions: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids)

    def bytes_per_token(self) -> int:
        h, k = self.hidden_size, self.num_aux
        aux = k * h * (1 if self.aux_dtype == "fp8_e4m3" else 2) + (
            4 * k if self.aux_dtype == "fp8_e4m3" else 0
        )
        return aux + 2 * h + 4  # + final bf16 + int32 id

    def compatible_with(self, other: DumpMeta) -> list[str]:
        """Fields that differ in a way that makes two writers' shards unmixable."""
        keys = (
            "model",
            "hidden_size",
            "num_layers",
            "aux_layer_ids",
            "aux_dtype",
            "final_norm",
            "aux_norm",
            "format",
            "format_version",
        )
        return [k for k in keys if getattr(self, k) != getattr(other, k)]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DumpMeta:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def load(cls, root: Path) -> DumpMeta:
        path = Path(root) / "meta.json"
        try:
            return cls.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            raise DumpFormatError(f"{path}: missing; not a dump directory") from None
        except (ValueError, TypeError) as exc:
            raise DumpFormatError(f"{path}: unreadable dump meta: {exc}") from None


def _tmp_name(path: Path) -> Path:
    return path.with_name(f"{path.name}.tmp.{os.getpid()}.{uuid.uuid4().hex[:8]}")


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _publish_no_clobber(tmp: Path, path: Path) -> None:
    """Give a finished temporary file its final name; FileExistsError if that name is taken.

    A hard link is atomic and fails on an existing name, so two writers that share a rank tag
    can never replace each other's shards. Filesystems without hard links fall back to a
    check-then-rename (only racy against such a second writer)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (
            errno.EPERM,
            errno.ENOTSUP,
            errno.EOPNOTSUPP,
            errno.EXDEV,
            errno.EMLINK,
        ):
            raise
        if path.exists():
            raise FileExistsError(errno.EEXIST, "exists", str(path)) from None
        os.replace(tmp, path)
        return
    tmp.unlink(missing_ok=True)


def init_dump_dir(root: Path, meta: DumpMeta) -> DumpMeta:
    """Create the directory or check that an existing one holds the same kind of dump."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "shards").mkdir(exist_ok=True)
    meta_path = root / "meta.json"
    if meta_path.exists():
        existing = DumpMeta.load(root)
        diff = meta.compatible_with(existing)
        if diff:
            raise DumpFormatError(
                f"{meta_path}: existing dump differs in {', '.join(diff)}; "
                "use a new directory or delete this one"
            )
        return existing
    _atomic_write_bytes(meta_path, (json.dumps(asdict(meta), indent=1) + "\n").encode())
    return meta


def quantize_fp8(aux, num_aux: int):
    """bf16/fp32 [N, K*H] -> (float8_e4m3fn [N, K*H], float32 scale [N, K])."""
    import torch

    n = aux.shape[0]
    blocks = aux.float().reshape(n, num_aux, -1)
    scale = blocks.abs().amax(dim=-1).clamp(min=1e-12) / FP8_MAX
    q = (blocks / scale.unsqueeze(-1)).to(torch.float8_e4m3fn)
    return q.reshape(n, -1), scale


def dequantize_fp8(q, scale, dtype=None):
    import torch

    n, k = scale.shape
    out = q.float().reshape(n, k, -1) * scale.unsqueeze(-1)
    return out.reshape(n, -1).to(dtype or torch.bfloat16)


_SAFETENSORS_DTYPES = {
    "torch.bfloat16": "BF16",
    "torch.float32": "F32",
    "torch.int32": "I32",
    "torch.float8_e4m3fn": "F8_E4M3",
}


def write_safetensors(f: BinaryIO, tensors: dict[str, list], metadata: dict[str, str]) -> int:
    """Stream a safetensors file whose tensors are given as lists of row blocks (concatenated
    along dim 0 on disk). Writing the blocks in place skips the concatenated copy and the
    serialisation buffer of `safetensors.torch.save_file`: one pass over memory, so the writer
    keeps up with the disk. Layout as safetensors writes it: u64-LE header length, JSON header
    padded with spaces to 8 bytes, then the data, widest dtype first so every tensor is aligned
    when the file is mmapped. Returns the bytes written."""
    import torch

    def itemsize(blocks: list) -> int:
        return blocks[0].element_size()

    header: dict[str, Any] = {"__metadata__": metadata}
    order = sorted(tensors, key=lambda name: (-itemsize(tensors[name]), name))
    offset = 0
    for name in order:
        blocks = tensors[name]
        first = blocks[0]
        if any(b.dtype != first.dtype or b.shape[1:] != first.shape[1:] for b in blocks):
            raise ValueError(f"{name}: blocks differ in dtype or trailing shape")
        size = sum(b.numel() for b in blocks) * first.element_size()
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[str(first.dtype)],
            "shape": [sum(int(b.shape[0]) for b in blocks), *map(int, first.shape[1:])],
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)
    f.write(len(raw).to_bytes(8, "little"))
    f.write(raw)
    for name in order:
        for block in tensors[name]:
            if block.numel():
                f.write(memoryview(block.contiguous().view(torch.uint8).numpy()))
    return 8 + len(raw) + offset


class ShardWriter:
    """Accumulates samples and writes shards of about `shard_bytes` each.

    With `background=True` a finished shard is written by one thread while the next fills; the
    hand-off queue holds one shard, so at most two shards' worth of host memory is in use
    (backpressure: `add` blocks while the writer is behind). `min_free_bytes` refuses a shard
    (DumpWriteError, ENOSPC) when writing it would leave less than that free on the filesystem.
    """

    def __init__(
        self,
        root: Path,
        meta: DumpMeta,
        rank: int = 0,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        background: bool = False,
        min_free_bytes: int = 0,
    ) -> None:
        self.root = Path(root)
        self.meta = init_dump_dir(self.root, meta)
        if self.meta.aux_dtype not in AUX_DTYPES:
            raise DumpFormatError(
                f"aux_dtype {self.meta.aux_dtype!r}; expected one of {AUX_DTYPES}"
            )
        self.rank = rank
        self.shard_bytes = shard_bytes
        self.min_free_bytes = min_free_bytes
        self.shards_dir = self.root / "shards"
        self._seq_lock = threading.Lock()
        self._seq = self._next_seq()
        self._reset_buffer()
        self.samples_written = 0
        self.bytes_written = 0
        self.write_seconds = 0.0  # writer busy time: assemble + save + fsync + publish
        self._error: BaseException | None = None
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        if background:
            self._queue = queue.Queue(maxsize=1)
            self._thread = threading.Thread(
                target=self._drain, name="eagle3-shard-writer", daemon=True
            )
            self._thread.start()

    def _next_seq(self) -> int:
        prefix = f"r{self.rank:03d}-"
        seqs = []
        for p in self.shards_dir.glob(f"{prefix}*.safetensors"):
            digits = p.name[len(prefix) : len(prefix) + 6]
            if digits.isdigit():
                seqs.append(int(digits))
        return max(seqs, default=-1) + 1

    def _reset_buffer(self) -> None:
        self._ids: list = []
        self._aux: list = []
        self._scale: list = []
        self._final: list = []
        self._index: list[list] = []
        self._rows = 0
        self._bytes = 0
        self._started: float | None = None

    @property
    def buffered_samples(self) -> int:
        return len(self._index)

    def buffer_age(self) -> float:
        """Seconds since the oldest buffered sample was added (0 when the buffer is empty)."""
        return 0.0 if self._started is None else time.monotonic() - self._started

    def add(self, sample_id: str, input_ids, aux, final, aux_scale=None) -> None:
        """Queue one sample (tensors on any device; copied to host here). For an fp8 dump, aux
        may come already quantized (float8_e4m3fn, with `aux_scale` float32 [T, K], e.g. done on
        the GPU before the copy); otherwise it is quantized here."""
        import torch

        self._raise_pending()
        t = int(input_ids.shape[0])
        if aux.shape[0] != t or final.shape[0] != t:
            raise ValueError(
                f"{sample_id}: rows differ: ids {t}, aux {aux.shape[0]}, final {final.shape[0]}"
            )
        if (
            aux.shape[1] != self.meta.num_aux * self.meta.hidden_size
            or final.shape[1] != self.meta.hidden_size
        ):
            raise ValueError(
                f"{sample_id}: widths aux {aux.shape[1]} / final {final.shape[1]} do not match "
                f"{self.meta.num_aux} x {self.meta.hidden_size}"
            )
        if self.meta.aux_dtype == "fp8_e4m3":
            if aux_scale is None:
                aux, aux_scale = quantize_fp8(aux.detach(), self.meta.num_aux)
            elif aux.dtype != torch.float8_e4m3fn or tuple(aux_scale.shape) != (
                t,
                self.meta.num_aux,
            ):
                raise ValueError(f"{sample_id}: pre-quantized aux must be fp8 with a [T, K] scale")
            self._aux.append(aux.detach().to("cpu"))
            self._scale.append(aux_scale.detach().to("cpu", torch.float32))
        elif aux_scale is not None:
            raise ValueError(f"{sample_id}: aux_scale given for a bf16 dump")
        else:
            self._aux.append(aux.detach().to("cpu", torch.bfloat16))
        self._ids.append(input_ids.detach().to("cpu", torch.int32))
        self._final.append(final.detach().to("cpu", torch.bfloat16))
        self._index.append([sample_id, self._rows, t])
        if self._started is None:
            self._started = time.monotonic()
        self._rows += t
        self._bytes += t * self.meta.bytes_per_token()
        if self._bytes >= self.shard_bytes:
            self.flush()

    def flush(self) -> Path | None:
        """Seal the current shard (if any). Returns its path (or its future path in background
        mode, where concatenation, fp8 quantization and the write happen on the writer thread)."""
        if not self._index:
            return None
        parts = (self._ids, self._aux, self._final, self._scale)
        index = self._index
        with self._seq_lock:
            path = self.shards_dir / f"r{self.rank:03d}-{self._seq:06d}.safetensors"
            self._seq += 1
        self._reset_buffer()
        if self._queue is not None:
            self._queue.put((path, parts, index))
            return path
        return self._write(path, parts, index)

    def _assemble(self, parts: tuple[list, list, list, list], index: list[list]):
        """The shard's tensors as lists of row blocks (written back to back, never concatenated
        in memory) and its metadata."""
        ids, aux, final, scale = parts
        tensors = {"input_ids": ids, "final": final}
        if self.meta.aux_dtype == "fp8_e4m3":
            tensors["aux_fp8"], tensors["aux_scale"] = aux, scale
        else:
            tensors["aux"] = aux
        metadata = {
            "format": FORMAT,
            "format_version": str(FORMAT_VERSION),
            "producer": self.meta.producer,
            "rank": str(self.rank),
            "samples": json.dumps(index, separators=(",", ":")),
        }
        return tensors, metadata

    def _check_space(self, nbytes: int, ids: list[str]) -> None:
        if self.min_free_bytes <= 0:
            return
        free = shutil.disk_usage(self.shards_dir).free
        if free < nbytes + self.min_free_bytes:
            raise DumpWriteError(
                errno.ENOSPC,
                f"{self.shards_dir}: {free} bytes free; a {nbytes}-byte shard would leave less "
                f"than the {self.min_free_bytes}-byte reserve",
                ids,
            )

    def _write(self, path: Path, parts: tuple[list, ...], index: list[list]) -> Path:
        ids = [entry[0] for entry in index]
        start = time.monotonic()
        tensors, metadata = self._assemble(parts, index)
        nbytes = sum(t.numel() * t.element_size() for blocks in tensors.values() for t in blocks)
        self._check_space(nbytes, ids)
        tmp = _tmp_name(path)
        try:
            with open(tmp, "wb") as f:
                write_safetensors(f, tensors, metadata)
                f.flush()
                os.fsync(f.fileno())
            for _ in range(1000):
                try:
                    _publish_no_clobber(tmp, path)
                    break
                except FileExistsError:  # another writer took this name: take the next free one
                    with self._seq_lock:
                        self._seq = max(self._seq, self._next_seq())
                        path = self.shards_dir / f"r{self.rank:03d}-{self._seq:06d}.safetensors"
                        self._seq += 1
            else:
                raise DumpWriteError(errno.EEXIST, f"{path}: no free shard name", ids)
            _fsync_dir(path.parent)
        except DumpWriteError:
            tmp.unlink(missing_ok=True)
            raise
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise DumpWriteError(exc.errno, f"writing {path}: {exc.strerror or exc}", ids) from exc
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.write_seconds += time.monotonic() - start
        self.samples_written += len(index)
        self.bytes_written += path.stat().st_size
        return path

    def _drain(self) -> None:
        assert self._queue is not None
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self._error is None:
                    self._write(*item)
            except BaseException as exc:  # surfaced to the producer on its next call
                self._error = exc
            finally:
                self._queue.task_done()

    def _raise_pending(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def close(self) -> None:
        """Flush what is buffered and wait for background writes; raises the first write error."""
        try:
            self.flush()
        finally:
            if self._queue is not None and self._thread is not None:
                self._queue.put(None)
                self._thread.join()
                self._queue = None
        self._raise_pending()

    def abort(self) -> None:
        """Drop what is buffered (it was never sealed) and stop the background thread."""
        self._reset_buffer()
        if self._queue is not None and self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._queue = None
        self._error = None

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- error markers: one small JSON per sample that could not be dumped ----

_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


def safe_name(sample_id: str) -> str:
    """A file name for a sample id that can never escape the directory (hashed when unsafe)."""
    if _SAFE_NAME.fullmatch(sample_id) and not sample_id.startswith("."):
        return sample_id
    return "h-" + hashlib.sha256(sample_id.encode()).hexdigest()[:40]


def error_marker_path(root: Path, sample_id: str) -> Path:
    return Path(root) / ERRORS_DIR / f"{safe_name(sample_id)}.error.json"


def write_error_marker(root: Path, sample_id: str, reason: str, **fields: Any) -> Path:
    path = error_marker_path(root, sample_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"sample_id": sample_id, "reason": reason, "time": time.time(), **fields}
    _atomic_write_bytes(path, (json.dumps(record, default=str) + "\n").encode())
    return path


def _parts_of(root: Path) -> list[Path]:
    """A sharded extraction's shard dumps (extraction/sharding.py); [] where this module runs as
    SGLang's dump helper (sglang/srt/eagle3_dump/, no remote_agent there: it writes one dump)."""
    try:
        from remote_agent.eagle3.extraction.sharding import parts_of
    except ImportError:
        return []
    return parts_of(root)


def read_error_markers(root: Path) -> dict[str, dict[str, Any]]:
    """sample id -> marker record, for every complete marker under root/errors (under each
    shard's errors/ for a sharded extraction's root)."""
    out: dict[str, dict[str, Any]] = {}
    paths = (p for part in _parts_of(root) or [Path(root)] for p in (part / ERRORS_DIR).glob("*"))
    for path in sorted(p for p in paths if p.name.endswith(".error.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # vanished or being replaced: the next scan sees it
        if isinstance(record, dict) and isinstance(record.get("sample_id"), str):
            record["path"] = str(path)
            out[record["sample_id"]] = record
    return out


def clear_error_marker(root: Path, sample_id: str) -> None:
    error_marker_path(root, sample_id).unlink(missing_ok=True)


@dataclass(frozen=True)
class SampleRef:
    shard: Path
    offset: int
    length: int


class DumpReader:
    """Read-only view of a dump directory built from shard headers alone (no data scan).

    `refresh()` picks up shards published since the last scan (shards are immutable)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        # a sharded extraction's root: the union of its shard dumps (extraction/sharding.py)
        self.parts = [p for p in _parts_of(self.root) if (p / "meta.json").exists()] or [self.root]
        self.meta = DumpMeta.load(self.parts[0])
        if self.meta.format != FORMAT:
            raise DumpFormatError(
                f"{self.parts[0] / 'meta.json'}: format {self.meta.format!r}, expected {FORMAT!r}"
            )
        for part in self.parts[1:]:
            diff = self.meta.compatible_with(DumpMeta.load(part))
            if diff:
                raise DumpFormatError(
                    f"{part / 'meta.json'}: differs from {self.parts[0].name} in "
                    f"{', '.join(diff)}; every shard must come from the same model and settings"
                )
        self.index: dict[str, SampleRef] = {}
        self.duplicates: list[tuple[str, Path, Path]] = []
        self.shards: list[Path] = []
        self._seen: set[Path] = set()
        self._handles: dict[Path, Any] = {}
        self.refresh()

    def refresh(self) -> list[str]:
        """Index shards not seen before; returns the sample ids they added."""
        new = sorted(
            p
            for part in self.parts
            for p in (part / "shards").glob("r*.safetensors")
            if ".tmp." not in p.name and p not in self._seen
        )
        added: list[str] = []
        for shard in new:
            entries = self.shard_index(shard)
            self._seen.add(shard)
            self.shards.append(shard)
            for sample_id, offset, length in entries:
                ref = SampleRef(shard, int(offset), int(length))
                if sample_id in self.index:
                    self.duplicates.append((sample_id, self.index[sample_id].shard, shard))
                    continue
                self.index[sample_id] = ref
                added.append(sample_id)
        self.shards.sort()
        return added

    @staticmethod
    def shard_index(shard: Path) -> list[list]:
        from safetensors import safe_open

        try:
            with safe_open(str(shard), framework="pt") as f:
                metadata = f.metadata() or {}
        except Exception as exc:  # safetensors raises its own error types
            raise DumpFormatError(f"{shard}: unreadable shard header: {exc}") from exc
        if metadata.get("format") != FORMAT or "samples" not in metadata:
            raise DumpFormatError(f"{shard}: not an {FORMAT} shard (no sample index)")
        return json.loads(metadata["samples"])

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, sample_id: object) -> bool:
        return sample_id in self.index

    def ids(self) -> list[str]:
        return list(self.index)

    def total_tokens(self) -> int:
        return sum(ref.length for ref in self.index.values())

    def total_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.shards)

    def _handle(self, shard: Path):
        from safetensors import safe_open

        h = self._handles.get(shard)
        if h is None:
            h = safe_open(str(shard), framework="pt")
            self._handles[shard] = h
        return h

    def input_ids(self, sample_id: str):
        """int32 [T] ids of one sample (reads only that slice)."""
        ref = self.index[sample_id]
        return self._handle(ref.shard).get_slice("input_ids")[ref.offset : ref.offset + ref.length]

    def get(self, sample_id: str, dequantize: bool = True) -> dict[str, Any]:
        """{'input_ids': int32 [T], 'aux': bf16 [T, K*H], 'final': bf16 [T, H]} of one sample."""
        ref = self.index[sample_id]
        h = self._handle(ref.shard)
        sl = slice(ref.offset, ref.offset + ref.length)
        out = {
            "input_ids": h.get_slice("input_ids")[sl],
            "final": h.get_slice("final")[sl],
        }
        if self.meta.aux_dtype == "fp8_e4m3":
            q = h.get_slice("aux_fp8")[sl]
            scale = h.get_slice("aux_scale")[sl]
            out["aux"] = dequantize_fp8(q, scale) if dequantize else q
            if not dequantize:
                out["aux_scale"] = scale
        else:
            out["aux"] = h.get_slice("aux")[sl]
        return out

    def close(self) -> None:
        self._handles.clear()

    def __iter__(self) -> Iterator[str]:
        return iter(self.index)
