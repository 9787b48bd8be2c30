"""Checking a dump directory against its dataset: every sample present exactly once, ids equal,
shapes and dtypes right, no NaN/Inf, no error markers; and bytes per token."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote_agent.eagle3.dense import DumpReader, read_error_markers
from remote_agent.eagle3.extraction.dataset import Dataset
from remote_agent.eagle3.progress import Progress

CHUNK_ROWS = 4096
# the Report's lists of problems, each a reason the dump is not fit to train on
PROBLEMS = ("missing", "extra", "duplicates", "mismatched", "bad_shape", "nonfinite", "markers")


@dataclass
class Report:
    samples: int = 0
    tokens: int = 0
    shard_bytes: int = 0
    shards: int = 0
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    bad_shape: list[str] = field(default_factory=list)
    nonfinite: list[str] = field(default_factory=list)
    markers: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(getattr(self, key) for key in PROBLEMS)

    def to_json(self, limit: int = 20) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ok": self.ok,
            "samples": self.samples,
            "tokens": self.tokens,
            "shards": self.shards,
            "bytes": self.shard_bytes,
            "bytes_per_token": round(self.shard_bytes / self.tokens, 2) if self.tokens else None,
            "meta_bytes_per_token": self.meta.get("bytes_per_token"),
            "per_sample_format_bytes_per_token": self.meta.get("per_sample_bytes_per_token"),
        }
        for key in PROBLEMS:
            values = getattr(self, key)
            out[key] = len(values)
            if values:
                out[f"{key}_examples"] = values[:limit]
        return out


def _expected_shapes(meta, n: int) -> dict[str, tuple[tuple[int, ...], str]]:
    k, h = meta.num_aux, meta.hidden_size
    shapes = {"input_ids": ((n,), "I32"), "final": ((n, h), "BF16")}
    if meta.aux_dtype == "fp8_e4m3":
        shapes["aux_fp8"] = ((n, k * h), "F8_E4M3")
        shapes["aux_scale"] = ((n, k), "F32")
    else:
        shapes["aux"] = ((n, k * h), "BF16")
    return shapes


def verify_dump(root: Path, dataset: Dataset, check_values: bool = True) -> Report:
    import torch
    from safetensors import safe_open

    reader = DumpReader(root)
    meta = reader.meta
    report = Report(
        meta={
            "model": meta.model,
            "producer": meta.producer,
            "hidden_size": meta.hidden_size,
            "num_layers": meta.num_layers,
            "aux_layer_ids": meta.aux_layer_ids,
            "aux_dtype": meta.aux_dtype,
            "bytes_per_token": meta.bytes_per_token(),
            "per_sample_bytes_per_token": (meta.num_aux + 1) * meta.hidden_size * 2,
        }
    )
    report.duplicates = [d[0] for d in reader.duplicates]
    report.missing = [s for s in dataset.ids() if s not in reader]
    report.extra = [s for s in reader.ids() if s not in dataset]
    markers = read_error_markers(root)
    report.markers = [  # markers of dumped or foreign ids are stale: ignore them
        f"{sid}: {m.get('reason')}"
        for sid, m in markers.items()
        if sid in dataset and sid not in reader
    ]
    progress = Progress("verify-dumps", len(reader.shards), "shards")
    for shard in reader.shards:
        entries = DumpReader.shard_index(shard)
        n = sum(int(e[2]) for e in entries)
        report.shards += 1
        report.shard_bytes += shard.stat().st_size
        with safe_open(str(shard), framework="pt") as f:
            got = {
                name: (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype())
                for name in f.keys()  # noqa: SIM118 (safe_open is not a dict)
            }
            want = _expected_shapes(meta, n)
            if got != want:
                report.bad_shape.append(f"{shard.name}: tensors {got}, expected {want}")
                progress.advance()
                continue
            if [e[1] for e in entries] != [
                sum(int(x[2]) for x in entries[:i]) for i in range(len(entries))
            ]:
                report.bad_shape.append(f"{shard.name}: sample rows are not contiguous")
            ids = f.get_slice("input_ids")[:]
            for sid, off, length in entries:
                ref = reader.index.get(sid)
                if ref is None or ref.shard != shard:
                    continue  # a duplicate: counted above
                report.samples += 1
                report.tokens += int(length)
                rows = ids[int(off) : int(off) + int(length)]
                if sid in dataset and rows.tolist() != dataset.input_ids(sid):
                    report.mismatched.append(sid)
            if check_values:
                bad_rows = _nonfinite_rows(f, meta, n, torch)
                if bad_rows:
                    for sid, off, length in entries:
                        if any(int(off) <= r < int(off) + int(length) for r in bad_rows):
                            report.nonfinite.append(sid)
        progress.advance()
    progress.finish()
    reader.close()
    return report


def _nonfinite_rows(f, meta, n: int, torch) -> list[int]:
    names = ["final", "aux_fp8", "aux_scale"] if meta.aux_dtype == "fp8_e4m3" else ["final", "aux"]
    bad: set[int] = set()
    for start in range(0, n, CHUNK_ROWS):
        for name in names:
            t = f.get_slice(name)[start : start + CHUNK_ROWS].float()
            rows = (~torch.isfinite(t)).reshape(t.shape[0], -1).any(dim=1).nonzero().flatten()
            bad.update(start + int(r) for r in rows)
    return sorted(bad)
