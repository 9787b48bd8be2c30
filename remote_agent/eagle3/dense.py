"""The one on-disk format for hidden-state dumps (written by the SGLang hook and the HF reference
extractor alike, read by the trainer and `verify-dumps`).

Layout of a dump directory:

    meta.json                         DumpMeta: model, resolved capture ids, dtypes, versions
    shards/r{rank:03d}-{seq:06d}.safetensors

Each shard is one safetensors file (mmap-able, no pickle) holding many samples back to back:

    input_ids  int32 [N]              the token ids the target saw (checked against the dataset)
    aux        bf16  [N, K*H]         residual stream entering the K capture layers, ascending ids
      or aux_fp8 float8_e4m3fn [N, K*H] + aux_scale float32 [N, K]  (per-token, per-layer scale)
    final      bf16  [N, H]           after the final norm: exactly what lm_head consumes

and, in its safetensors metadata, the shard's index: `samples` = JSON list of
[sample_id, row_offset, length]. A shard is written to a temporary name, fsynced and renamed,
so a shard either exists complete (with its index) or not at all; a sample counts as dumped
exactly when it is in some shard's index. Training starts by reading the shard headers only.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "eagle3-dense"
FORMAT_VERSION = 1
FP8_MAX = 448.0  # largest finite float8_e4m3fn
DEFAULT_SHARD_BYTES = 2 << 30


class DumpFormatError(Exception):
    """The directory is not a valid dump (wrong meta, corrupt shard, duplicate sample)."""


class DumpWriteError(OSError):
    """A shard could not be written (full disk, permissions). Nothing partial is left behind."""


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


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}.{uuid.uuid4().hex[:8]}")
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


def init_dump_dir(root: Path, meta: DumpMeta) -> DumpMeta:
    """Create the directory or check that an existing one holds the same kind of dump."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "shards").mkdir(exist_ok=True)
    meta_path = root / "meta.json"
    if meta_path.exists():
        existing = DumpMeta.from_json(json.loads(meta_path.read_text()))
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


class ShardWriter:
    """Accumulates samples and writes shards of about `shard_bytes` each.

    With `background=True` a finished shard is written by one thread while the next fills; the
    hand-off queue holds one shard, so at most two shards' worth of host memory is in use
    (backpressure: `add` blocks while the writer is behind).
    """

    def __init__(
        self,
        root: Path,
        meta: DumpMeta,
        rank: int = 0,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        background: bool = False,
    ) -> None:
        self.root = Path(root)
        self.meta = init_dump_dir(self.root, meta)
        self.rank = rank
        self.shard_bytes = shard_bytes
        self.shards_dir = self.root / "shards"
        self._seq = self._next_seq()
        self._reset_buffer()
        self.samples_written = 0
        self.bytes_written = 0
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
        seqs = [
            int(p.name[len(prefix) : len(prefix) + 6])
            for p in self.shards_dir.glob(f"{prefix}*.safetensors")
        ]
        return max(seqs, default=-1) + 1

    def _reset_buffer(self) -> None:
        self._ids: list = []
        self._aux: list = []
        self._final: list = []
        self._index: list[list] = []
        self._rows = 0
        self._bytes = 0

    def add(self, sample_id: str, input_ids, aux, final) -> None:
        """Queue one sample (tensors on any device; copied to host here)."""
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
        self._ids.append(input_ids.detach().to("cpu", torch.int32))
        self._aux.append(aux.detach().to("cpu", torch.bfloat16))
        self._final.append(final.detach().to("cpu", torch.bfloat16))
        self._index.append([sample_id, self._rows, t])
        self._rows += t
        self._bytes += t * self.meta.bytes_per_token()
        if self._bytes >= self.shard_bytes:
            self.flush()

    def flush(self) -> Path | None:
        """Seal the current shard (if any). Returns its path (or its future path in background mode)."""
        if not self._index:
            return None
        import torch

        tensors = {
            "input_ids": torch.cat(self._ids),
            "final": torch.cat(self._final),
        }
        aux = torch.cat(self._aux)
        if self.meta.aux_dtype == "fp8_e4m3":
            tensors["aux_fp8"], tensors["aux_scale"] = quantize_fp8(aux, self.meta.num_aux)
        else:
            tensors["aux"] = aux
        metadata = {
            "format": FORMAT,
            "format_version": str(FORMAT_VERSION),
            "samples": json.dumps(self._index, separators=(",", ":")),
        }
        path = self.shards_dir / f"r{self.rank:03d}-{self._seq:06d}.safetensors"
        n = len(self._index)
        self._seq += 1
        self._reset_buffer()
        if self._queue is not None:
            self._queue.put((path, tensors, metadata, n))
            return path
        self._write(path, tensors, metadata, n)
        return path

    def _write(self, path: Path, tensors: dict, metadata: dict, n: int) -> None:
        from safetensors.torch import save_file

        tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        try:
            save_file(tensors, str(tmp), metadata=metadata)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise DumpWriteError(exc.errno, f"writing {path}: {exc.strerror or exc}") from exc
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.samples_written += n
        self.bytes_written += path.stat().st_size

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

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class SampleRef:
    shard: Path
    offset: int
    length: int


class DumpReader:
    """Read-only view of a dump directory built from shard headers alone (no data scan)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        meta_path = self.root / "meta.json"
        if not meta_path.exists():
            raise DumpFormatError(f"{meta_path}: missing; not a dump directory")
        self.meta = DumpMeta.from_json(json.loads(meta_path.read_text()))
        if self.meta.format != FORMAT:
            raise DumpFormatError(f"{meta_path}: format {self.meta.format!r}, expected {FORMAT!r}")
        self.index: dict[str, SampleRef] = {}
        self.duplicates: list[tuple[str, Path, Path]] = []
        self.shards = sorted(
            p for p in (self.root / "shards").glob("r*.safetensors") if ".tmp." not in p.name
        )
        for shard in self.shards:
            for sample_id, offset, length in self.shard_index(shard):
                ref = SampleRef(shard, int(offset), int(length))
                if sample_id in self.index:
                    self.duplicates.append((sample_id, self.index[sample_id].shard, shard))
                    continue
                self.index[sample_id] = ref
        self._handles: dict[Path, Any] = {}

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

    def _handle(self, shard: Path):
        from safetensors import safe_open

        h = self._handles.get(shard)
        if h is None:
            h = safe_open(str(shard), framework="pt")
            self._handles[shard] = h
        return h

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

    def __iter__(self) -> Iterator[str]:
        return iter(self.index)
