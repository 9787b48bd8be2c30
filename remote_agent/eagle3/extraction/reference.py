"""The HF reference extractor: any transformers causal LM, the SGLang capture convention, token-
budget batches, data parallel under torchrun, the same dense format. It is the oracle for the
patch's output and the engine of the demo and the GPU tests.

Data parallel: rank 0 decides which samples are already dumped (checked against the dataset) and
broadcasts that, so every rank sees the same pending set; pending samples sorted by length are
dealt round robin (rank r takes r, r+W, ...), which balances tokens and is disjoint; each rank
writes its own `r{rank:03d}-*` shards. Resume = run again: finished shards are kept, samples in
them are skipped, the rest (including any unsealed buffer of a killed run) are redone.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote_agent.eagle3.dense import DumpFormatError, DumpMeta, DumpWriteError, ShardWriter
from remote_agent.eagle3.distributed import Dist
from remote_agent.eagle3.errors import BadInput, Eagle3Error, Failed
from remote_agent.eagle3.extraction.capture import (
    AuxCapture,
    HostCopier,
    capture_batch,
    decoder_of,
    pad_batch,
    plan_batches,
    resolve_layer_ids,
    text_config,
)
from remote_agent.eagle3.extraction.common import disk_preflight, existing_samples
from remote_agent.eagle3.extraction.dataset import Dataset, open_dataset
from remote_agent.eagle3.extraction.sharding import parse_shard, restrict
from remote_agent.eagle3.progress import Progress, emit

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass
class ReferenceOptions:
    model: Path
    dataset: Path
    out: Path
    layers: list[int] | None = None
    token_budget: int = 16384
    max_batch: int = 512
    dtype: str = "auto"  # auto (bf16 on GPU, fp32 on CPU) | bf16 | fp16 | fp32
    aux_dtype: str = "bf16"
    shard_mb: float = 2048
    device: str = "auto"
    limit: int | None = None
    min_free_gb: float = 1.0
    disk_margin_gb: float = 1.0
    attn_implementation: str | None = None
    trust_remote_code: bool = False
    require_manifest: bool = True
    progress_interval: float = 5.0
    shard: str | None = None  # "I/N": only that shard's samples (extraction/sharding.py)
    extra: dict[str, Any] = field(default_factory=dict)


def torch_dtype(name: str, device) -> Any:
    import torch

    if name == "auto":
        name = "bf16" if device.type == "cuda" else "fp32"
    if name not in DTYPES:
        raise BadInput(f"--dtype {name!r}: use one of auto, {', '.join(DTYPES)}")
    return getattr(torch, DTYPES[name])


def hf_model_class(path: Path) -> Any:
    """The transformers auto class that loads this target: Kimi-K2.5 (`model_type: kimi_k25`,
    a vision-language wrapper) is an image-text-to-text model in transformers 5, not a causal LM."""
    import json

    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    try:
        model_type = json.loads((Path(path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        model_type = None
    return AutoModelForImageTextToText if model_type == "kimi_k25" else AutoModelForCausalLM


def load_model(path: Path, dtype, device, attn: str | None = None, trust_remote_code: bool = False):
    if not (Path(path) / "config.json").exists():
        raise BadInput(f"{path}: not a Hugging Face model directory (no config.json)")
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": trust_remote_code}
    if attn:
        kwargs["attn_implementation"] = attn
    # no device_map: in transformers 5 any device_map (even one device) requires accelerate
    model = hf_model_class(path).from_pretrained(str(path), **kwargs)
    return model.to(device).eval()


def _versions() -> dict[str, str]:
    import safetensors
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "python": platform.python_version(),
    }


def build_meta(
    model, model_path: Path, ids: list[int], opts: ReferenceOptions, world: int
) -> DumpMeta:
    from remote_agent.eagle3.patching.hashes import sha256_file

    cfg = text_config(model.config)
    config_json = Path(model_path) / "config.json"
    return DumpMeta(
        model=str(Path(model_path).resolve()),
        hidden_size=int(cfg.hidden_size),
        num_layers=int(cfg.num_hidden_layers),
        aux_layer_ids=ids,
        aux_dtype=opts.aux_dtype,
        producer="hf-reference",
        versions={**_versions(), "config_sha256": sha256_file(config_json)},
        extra={
            "output_layer_ids": [i - 1 for i in ids],
            "model_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            "world_size": world,
            "token_budget": opts.token_budget,
            **opts.extra,
        },
    )


def _prepare(dist: Dist, dataset: Dataset, opts: ReferenceOptions, meta: DumpMeta) -> list[str]:
    """Rank 0: create/check the dump dir, find finished samples, check disk; broadcast."""
    outcome: tuple[str, Any]
    if dist.rank == 0:
        try:
            from remote_agent.eagle3.dense import init_dump_dir
            from remote_agent.eagle3.extraction.identity import record_identity

            record_identity(opts.out, opts.model, "extract")  # a resume must use the same model
            init_dump_dir(opts.out, meta)
            done, problems = existing_samples(opts.out, dataset)
            if problems:
                raise Failed(
                    f"{opts.out}: {len(problems)} dumped samples do not match the dataset, e.g. "
                    + "; ".join(problems[:3])
                )
            ids = dataset.ids()[: opts.limit] if opts.limit else dataset.ids()
            pending = [s for s in ids if s not in done]
            disk_preflight(
                opts.out, dataset.total_tokens(pending), meta.bytes_per_token(), opts.disk_margin_gb
            )
            outcome = ("ok", pending)
        except DumpFormatError as exc:
            outcome = ("bad", str(exc))
        except Eagle3Error as exc:
            outcome = ("bad" if isinstance(exc, BadInput) else "failed", str(exc))
    else:
        outcome = ("", None)
    outcome = dist.broadcast(outcome)
    if outcome[0] == "bad":
        raise BadInput(outcome[1])
    if outcome[0] == "failed":
        raise Failed(outcome[1])
    return outcome[1]


def extract_loop(decoder, layers, layer_ids, batches, writer: ShardWriter, device, on_batch=None):
    """Capture and write every batch of (sample ids, input_ids, attention_mask, lengths); the
    copy of batch i to the host overlaps the forward of batch i+1. Returns the token count."""
    import torch

    from remote_agent.eagle3.dense import quantize_fp8

    copier = HostCopier(device)
    fp8 = writer.meta.aux_dtype == "fp8_e4m3"
    tokens = 0
    inflight = None

    def write(item) -> int:
        sids, lens, handle = item
        got = copier.finish(handle)
        off = 0
        for sid, n in zip(sids, lens, strict=True):
            rows = slice(off, off + n)
            scale = got[3][rows] if fp8 else None
            writer.add(sid, got[0][rows], got[1][rows], got[2][rows], aux_scale=scale)
            off += n
        return off

    with AuxCapture(layers, layer_ids) as capture, torch.inference_mode():
        for sids, input_ids, mask, lens in batches:
            got_ids, aux, final = capture_batch(
                decoder, capture, input_ids, mask, torch.bfloat16, lens
            )
            # fp8 aux is quantized on the device: half the copy, no CPU work
            extra = quantize_fp8(aux, len(layer_ids)) if fp8 else (aux,)
            handle = copier.start(got_ids, extra[0], final, *extra[1:])
            if inflight is not None:
                tokens += write(inflight)
                if on_batch is not None:
                    on_batch(len(inflight[0]), tokens)
            inflight = (sids, lens, handle)
        if inflight is not None:
            tokens += write(inflight)
            if on_batch is not None:
                on_batch(len(inflight[0]), tokens)
    return tokens


def _advance(progress: Progress, n: int, rank: int, tokens: int, start: float, writer) -> None:
    elapsed = max(time.monotonic() - start, 1e-9)
    progress.advance(
        n,
        rank=rank,
        tokens=tokens,
        tokens_per_s=round(tokens / elapsed, 1),
        gb_written=round(writer.bytes_written / 1e9, 6),
    )


def run_reference(opts: ReferenceOptions) -> dict[str, Any]:
    import torch

    dist = Dist.from_env(opts.device)
    try:
        return _run(dist, opts, torch)
    finally:
        dist.close()


def _run(dist: Dist, opts: ReferenceOptions, torch) -> dict[str, Any]:
    dataset = open_dataset(opts.dataset, opts.require_manifest)
    dataset = restrict(dataset, parse_shard(opts.shard) if opts.shard else None)
    dtype = torch_dtype(opts.dtype, dist.device)
    model = load_model(
        opts.model, dtype, dist.device, opts.attn_implementation, opts.trust_remote_code
    )
    decoder, layers = decoder_of(model)
    cfg = text_config(model.config)
    try:
        ids = resolve_layer_ids(int(cfg.num_hidden_layers), opts.layers)
    except ValueError as exc:
        raise BadInput(f"--layers: {exc}") from None
    meta = build_meta(model, opts.model, ids, opts, dist.world)
    pending = _prepare(dist, dataset, opts, meta)
    order = sorted(pending, key=lambda s: (-dataset.length(s), s))
    mine = order[dist.rank :: dist.world]
    batches = plan_batches(
        [(s, dataset.length(s)) for s in mine], opts.token_budget, opts.max_batch
    )
    pad_id = next(
        (
            v
            for v in (cfg.pad_token_id, getattr(cfg, "eos_token_id", None), 0)
            if isinstance(v, int)
        ),
        0,
    )
    writer = ShardWriter(
        opts.out,
        meta,
        rank=dist.rank,
        shard_bytes=int(opts.shard_mb * (1 << 20)),
        background=True,
        min_free_bytes=int(opts.min_free_gb * 1e9),
    )
    progress = Progress("extract", len(mine), "samples", interval=opts.progress_interval)
    tokens = 0
    start = time.monotonic()

    def batches_from_dataset():
        for batch in batches:  # reading the next batch overlaps the device's work
            seqs = [dataset.input_ids(s) for s in batch]
            input_ids, mask = pad_batch(seqs, pad_id, dist.device)
            yield batch, input_ids, mask, [len(q) for q in seqs]

    def on_batch(n: int, total: int) -> None:
        _advance(progress, n, dist.rank, total, start, writer)

    closed = False
    try:
        tokens = extract_loop(
            decoder, layers, ids, batches_from_dataset(), writer, dist.device, on_batch
        )
        closed = True
        writer.close()
    except DumpWriteError as exc:
        raise Failed(
            f"writing shards failed ({exc}); nothing partial was kept: free space and run the "
            "same command again to resume"
        ) from None
    finally:
        if not closed:  # interrupted: sealed shards stay, the unsealed buffer is redone next run
            writer.abort()
    elapsed = time.monotonic() - start
    progress.finish(
        rank=dist.rank,
        tokens=tokens,
        tokens_per_s=round(tokens / max(elapsed, 1e-9), 1),
        gb_written=round(writer.bytes_written / 1e9, 6),
    )
    samples, tok, nbytes = dist.sum([float(len(mine)), float(tokens), float(writer.bytes_written)])
    wall = dist.max(elapsed)
    summary = {
        "ok": True,
        "backend": "hf",
        "out": str(opts.out),
        "world_size": dist.world,
        "samples": int(samples),
        "skipped_existing": len(dataset) - len(pending) if not opts.limit else None,
        "tokens": int(tok),
        "seconds": round(wall, 3),
        "tokens_per_s": round(tok / wall, 1) if wall > 0 else None,
        "bytes_written": int(nbytes),
        "bytes_per_token": round(nbytes / tok, 1) if tok else None,
        "layer_ids": ids,
    }
    if dist.rank == 0:
        emit("result", **summary)
    return summary
