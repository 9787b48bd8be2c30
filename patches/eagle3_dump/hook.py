"""The dump hook: called from `DeepseekV2ForCausalLM.forward` after the aux hidden states are
unpacked, with the model, the ForwardBatch, the final (post-norm) hidden states [rows, H] and the
aux states (ascending capture layers; packed [rows, K*H] on 0.5.23, a list of K [rows, H] on
0.5.14: compat.py holds every such release difference).

What it does for one forward (reference: sglang-dump-patch.md §6.2):
1. returns at once unless this is a plain extend (prefill), not under CUDA-graph capture or
   torch.compile, some rid carries the dump prefix, and this process is a writer (attention-TP
   rank 0 of its attention-DP group on the last pipeline stage; a rank that cannot be read is
   a DumpConfigError, never rank 0);
2. validates the capture configuration once (capture on, width K*H, expected layer ids) and
   raises a clear DumpConfigError otherwise: a misconfigured server fails at its first dump;
3. splits the rows per request (`extend_seq_lens_cpu`, falling back to `.tolist()`), drops the
   padding rows after the real ones, turns `prefix_len > 0` (chunked prefill, radix hit) into an
   error marker instead of a partial dump, and copies the kept rows to the host before it
   returns (prefill CUDA-graph buffers are reused by the next replay);
4. hands the batch to one writer thread through a bounded queue (backpressure, bounded host
   memory): a full queue blocks the forward at most EAGLE3_DUMP_DEADLINE_S (kept well under
   SGLang's --watchdog-timeout, 300 s by default); then that batch's samples are dropped,
   counted (`stats()["overflow"]`) and get error markers, and the forward returns. The thread
   appends samples to dense shards (`dense.ShardWriter`, rank-tagged), sealing a shard on size,
   after EAGLE3_DUMP_FLUSH_S, on a flush request and at exit; I/O errors never reach the
   forward: they are counted and become per-sample error markers;
5. in stream mode (EAGLE3_DUMP_MODE=stream|both) also, or instead, hands the samples to the
   trainer over a socket (`stream_wire.StreamSender`, same bounded queue and deadline rule:
   a consumer that stops reading costs dropped samples, announced to it, never a stalled
   forward). The stream opens with a HELLO carrying the dump's metadata and the model's
   identity; every sample carries its id and token ids.

Control rids (after the prefix): `__eagle3__:canary:<nonce>` is dumped into `<dir>/canary/` and
sealed at once, the canaries of one forward in one shard (the client waits for it before sending
data, and compares it with SGLang's own return_hidden_states); `__eagle3__:flush:<nonce>` seals
the current shard. Environment, read once per process:

  EAGLE3_DUMP_DIR          dump directory; set means enabled (read by the patched module)
  EAGLE3_DUMP_RID_PREFIX   dump only rids with this prefix; sample id = the rest ("dump-")
  EAGLE3_DUMP_LAYER_IDS    expected resolved capture ids, e.g. "2,30,58" (default [2, L//2, L-3])
  EAGLE3_DUMP_AUX_DTYPE    bf16 | fp8_e4m3 (default bf16)
  EAGLE3_DUMP_QUEUE        forward batches queued for the writer thread (default 4)
  EAGLE3_DUMP_SYNC         1: write in the forward thread (tests, debugging)
  EAGLE3_DUMP_SHARD_MB     shard size in MiB (default 2048)
  EAGLE3_DUMP_FLUSH_S      seal a partial shard after this many seconds (default 10)
  EAGLE3_DUMP_MIN_FREE_MB  refuse a shard that would leave less free space (default 1024)
  EAGLE3_DUMP_MODEL        model name for meta.json (default: the served --model-path, else
                           the config's name or path)
  EAGLE3_DUMP_MODE         dense | stream | both (default dense)
  EAGLE3_DUMP_DEADLINE_S   longest a forward waits for queue room (default 20)
  EAGLE3_STREAM_ADDR       the trainer's stream address: unix:PATH or tcp:HOST:PORT; with
                           `{k}` in it, one per data-parallel trainer rank (a sample id
                           `@k/<id>` goes to rank k's address)
  EAGLE3_STREAM_SEND_TIMEOUT_S  a send stalled this long drops the connection (default 60)

Needs only torch, safetensors and the standard library.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import compat, dense, stream_wire
from .compat import DumpConfigError

__all__ = ["DumpConfigError", "dump", "reset", "stats"]

PATCH_VERSION = 1
CONTROL = "__eagle3__:"
CANARY = CONTROL + "canary:"
FLUSH = CONTROL + "flush:"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    root: Path
    rid_prefix: str = "dump-"
    layer_ids: tuple[int, ...] | None = None
    aux_dtype: str = "bf16"
    queue_depth: int = 4
    sync: bool = False
    shard_bytes: int = 2048 << 20
    flush_s: float = 10.0
    min_free_bytes: int = 1024 << 20
    model_name: str | None = None
    mode: str = "dense"
    deadline_s: float = 20.0
    stream_addr: str | None = None
    send_timeout_s: float = 60.0

    @property
    def dense(self) -> bool:
        return self.mode in ("dense", "both")

    @property
    def stream(self) -> bool:
        return self.mode in ("stream", "both")

    @classmethod
    def from_env(cls, env: Any = os.environ) -> Settings:
        root = env.get("EAGLE3_DUMP_DIR", "")
        if not root:
            raise DumpConfigError("EAGLE3_DUMP_DIR is not set")
        try:
            ids = env.get("EAGLE3_DUMP_LAYER_IDS", "").replace(" ", "")
            s = cls(
                root=Path(root),
                rid_prefix=env.get("EAGLE3_DUMP_RID_PREFIX", "dump-"),
                layer_ids=tuple(int(x) for x in ids.split(",")) if ids else None,
                aux_dtype=env.get("EAGLE3_DUMP_AUX_DTYPE", "bf16"),
                queue_depth=int(env.get("EAGLE3_DUMP_QUEUE", "4")),
                sync=env.get("EAGLE3_DUMP_SYNC", "0") not in ("", "0", "false", "no"),
                shard_bytes=int(float(env.get("EAGLE3_DUMP_SHARD_MB", "2048")) * (1 << 20)),
                flush_s=float(env.get("EAGLE3_DUMP_FLUSH_S", "10")),
                min_free_bytes=int(float(env.get("EAGLE3_DUMP_MIN_FREE_MB", "1024")) * (1 << 20)),
                model_name=env.get("EAGLE3_DUMP_MODEL") or None,
                mode=env.get("EAGLE3_DUMP_MODE", "dense") or "dense",
                deadline_s=float(env.get("EAGLE3_DUMP_DEADLINE_S", "20")),
                stream_addr=env.get("EAGLE3_STREAM_ADDR") or None,
                send_timeout_s=float(env.get("EAGLE3_STREAM_SEND_TIMEOUT_S", "60")),
            )
        except ValueError as exc:
            raise DumpConfigError(f"bad EAGLE3_DUMP_* setting: {exc}") from None
        if s.aux_dtype not in dense.AUX_DTYPES:
            raise DumpConfigError(
                f"EAGLE3_DUMP_AUX_DTYPE={s.aux_dtype!r}; use one of {dense.AUX_DTYPES}"
            )
        if not s.rid_prefix or s.queue_depth < 1 or s.shard_bytes <= 0 or s.flush_s <= 0:
            raise DumpConfigError(
                "EAGLE3_DUMP_RID_PREFIX must be non-empty; QUEUE, SHARD_MB, FLUSH_S > 0"
            )
        if s.mode not in ("dense", "stream", "both"):
            raise DumpConfigError(f"EAGLE3_DUMP_MODE={s.mode!r}; use dense, stream or both")
        if not 0 < s.deadline_s < 300 or s.send_timeout_s <= 0:
            raise DumpConfigError(
                "EAGLE3_DUMP_DEADLINE_S must be in (0, 300): under SGLang's watchdog timeout; "
                "EAGLE3_STREAM_SEND_TIMEOUT_S > 0"
            )
        if s.stream:
            try:
                stream_wire.parse_address(stream_wire.destination(s.stream_addr or "", 0))
            except ValueError as exc:
                raise DumpConfigError(f"EAGLE3_STREAM_ADDR: {exc}") from None
        return s


# ---- process-wide state (one writer per scheduler process) ----

_lock = threading.Lock()
_settings: Settings | None = None
_dumper: _Dumper | None = None
_failure: DumpConfigError | None = None
_NOT_SET = object()
_rank: Any = _NOT_SET


def _get_settings() -> Settings:
    global _settings
    if _settings is None:
        _settings = Settings.from_env()
    return _settings


def _writer_rank(model) -> int | None:
    """This process's rank tag when it writes dumps, else None (compat.writer_rank: fails
    closed with a DumpConfigError when the rank cannot be read)."""
    return compat.writer_rank(model)


def _rank_tag(model) -> int | None:
    global _rank
    if _rank is _NOT_SET:
        _rank = _writer_rank(model)
    return _rank


def _capturing() -> bool:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return True
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and compiler.is_compiling())


def dump(model, forward_batch, hidden_states, aux_hidden_states) -> None:
    """Entry point from the patched forward (see the module docstring)."""
    if not compat.plain_extend(forward_batch.forward_mode) or _capturing():
        return
    rids = getattr(forward_batch, "rids", None)
    if not rids:
        return
    settings = _get_settings()
    if not any(isinstance(r, str) and r.startswith(settings.rid_prefix) for r in rids):
        return
    rank = _rank_tag(model)
    if rank is None:
        return
    aux_hidden_states = compat.packed_aux(aux_hidden_states)  # 0.5.14 hands a list
    _get_dumper(model, hidden_states, aux_hidden_states, rank, settings).handle(
        forward_batch, rids, hidden_states, aux_hidden_states
    )


def _get_dumper(model, hidden_states, aux, rank: int, settings: Settings) -> _Dumper:
    global _dumper, _failure
    if _dumper is not None:
        return _dumper
    with _lock:
        if _failure is not None:
            raise _failure
        if _dumper is None:
            try:
                _dumper = _Dumper(model, hidden_states, aux, rank, settings)
            except DumpConfigError as exc:
                _failure = exc
                logger.error("eagle3 dump: %s", exc)
                raise
            atexit.register(_dumper.close)
    return _dumper


def reset() -> None:
    """Seal and stop the writer, forget settings and rank (tests; env changes)."""
    global _dumper, _failure, _settings, _rank
    with _lock:
        if _dumper is not None:
            _dumper.close()
            atexit.unregister(_dumper.close)
        _dumper, _failure, _settings, _rank = None, None, None, _NOT_SET


def stats() -> dict[str, int]:
    if _dumper is None:
        return {}
    out = dict(_dumper.stats)
    if _dumper.stream is not None:
        out.update({f"stream_{k}": v for k, v in _dumper.stream.stats.items()})
    return out


# ---- validation and metadata ----


def validate(model, hidden_states, aux, settings: Settings) -> tuple[int, int, list[int]]:
    """(hidden size, layer count, capture ids) or a DumpConfigError saying what to fix."""
    import torch

    if not getattr(model, "capture_aux_hidden_states", False) or aux is None:
        raise DumpConfigError(
            "EAGLE3_DUMP_DIR is set but aux hidden-state capture is off: start SGLang with "
            "--enable-return-aux-hidden-states --speculative-algorithm EAGLE3 (0.5.23), or with "
            "an EAGLE3 drafter (0.5.14: `eagle3 sglang-launch extract --draft-model DIR`)"
        )
    config = model.config
    hidden, layers = int(config.hidden_size), int(config.num_hidden_layers)
    ids = [int(i) for i in model.model.layers_to_capture]
    expected = list(settings.layer_ids) if settings.layer_ids else [2, layers // 2, layers - 3]
    if sorted(ids) != sorted(expected):
        raise DumpConfigError(
            f"the model captures layers {ids} but {expected} are expected "
            "(EAGLE3_DUMP_LAYER_IDS, default [2, L//2, L-3]); check "
            "--return-aux-hidden-state-layer-ids, or on 0.5.14 the drafter's eagle_config "
            "(SGLang adds 1 to every id when the first is 1)"
        )
    if len(set(ids)) != len(ids) or not all(0 < i < layers for i in ids):
        raise DumpConfigError(f"capture layers {ids} must be distinct and inside (0, {layers})")
    width = len(ids) * hidden
    if not torch.is_tensor(aux) or aux.dim() != 2 or aux.shape[1] != width:
        shape = tuple(aux.shape) if torch.is_tensor(aux) else type(aux).__name__
        raise DumpConfigError(
            f"aux hidden states are {shape}; expected [tokens, {len(ids)} x {hidden} = {width}]"
        )
    if not torch.is_tensor(hidden_states) or hidden_states.dim() != 2:
        raise DumpConfigError("final hidden states are not a [tokens, hidden] tensor")
    if hidden_states.shape[1] != hidden:
        raise DumpConfigError(
            f"final hidden states have width {hidden_states.shape[1]}, not {hidden}"
        )
    return hidden, layers, sorted(ids)


def _installed_record() -> dict[str, Any]:
    path = Path(__file__).with_name("INSTALLED.json")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _model_file_sha256(model) -> str | None:
    import hashlib
    import sys

    module = sys.modules.get(type(model).__module__)
    path = getattr(module, "__file__", None)
    if not path:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def build_meta(model, hidden: int, layers: int, ids: list[int], settings: Settings, rank: int):
    import torch

    installed = _installed_record()
    sha = _model_file_sha256(model)
    served = compat.served_model()  # the Kimi wrapper's text config has no _name_or_path
    name = (
        settings.model_name
        or served.get("model_path")
        or getattr(model.config, "_name_or_path", "")
        or "unknown"
    )
    return dense.DumpMeta(
        model=str(name),
        hidden_size=hidden,
        num_layers=layers,
        aux_layer_ids=ids,
        aux_dtype=settings.aux_dtype,
        producer="sglang-patch",
        versions={
            "sglang": _version("sglang"),
            "torch": torch.__version__,
            "eagle3_dump_patch": str(PATCH_VERSION),
            "deepseek_v2_sha256": sha or "unknown",
        },
        extra={
            "output_layer_ids": [i - 1 for i in ids],
            "patched_sha256_expected": installed.get("patched_sha256"),
            "deepseek_v2_is_reviewed_patch": bool(sha) and sha == installed.get("patched_sha256"),
            "writer_rank": rank,
            "host": socket.gethostname(),
            "parallel": compat.parallel_summary(),
            "model_class": type(model).__name__,
            "architectures": list(getattr(model.config, "architectures", None) or []),
            **served,
            "config_sha256": _config_sha256(served.get("model_path") or str(name)),
        },
    )


def _config_sha256(model_path: str) -> str | None:
    """sha256 of the served model's config.json: the identity the trainer checks the stream
    against (the same key as extraction/identity.py's model_identity)."""
    import hashlib

    try:
        return hashlib.sha256((Path(model_path) / "config.json").read_bytes()).hexdigest()
    except OSError:
        return None


def _host_lengths(cpu_list, tensor, n: int, name: str) -> list[int]:
    """Per-request lengths from the host list, else from the device tensor (gpu_only path)."""
    if cpu_list is not None:
        values = [int(x) for x in cpu_list]
    elif tensor is not None:
        values = [int(x) for x in tensor.tolist()]
    else:
        raise DumpConfigError(f"ForwardBatch has neither {name}_cpu nor {name}")
    if len(values) < n:
        raise DumpConfigError(f"ForwardBatch.{name} has {len(values)} entries for {n} rids")
    return values[:n]


def _to_host(t, dtype):
    """A host copy that the forward can no longer overwrite (the copy completes here)."""
    t = t.detach()
    if t.device.type == "cpu":
        return t.to(dtype, copy=True)
    return t.to(dtype).to("cpu")


@dataclass
class _Batch:
    samples: list[tuple[str, Any, Any, Any]]  # sample id, ids [T], aux [T, K*H], final [T, H]
    markers: list[tuple[str, str, dict[str, Any]]]
    flush: bool = False


_STOP = object()


class _Dumper:
    def __init__(self, model, hidden_states, aux, rank: int, settings: Settings) -> None:
        hidden, layers, ids = validate(model, hidden_states, aux, settings)
        self.settings, self.rank = settings, rank
        self.hidden, self.width = hidden, len(ids) * hidden
        self.meta = build_meta(model, hidden, layers, ids, settings, rank)
        self.root = settings.root
        self.info = {
            "rank": rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "sglang": self.meta.versions.get("sglang"),
            "patch_version": PATCH_VERSION,
        }
        self.stats = {
            "samples": 0,
            "tokens": 0,
            "duplicates": 0,
            "markers": 0,
            "io_errors": 0,
            "marker_errors": 0,
            "shards": 0,
            "overflow": 0,
        }
        self._overflow: list[tuple[str, str]] = []  # dropped at the deadline: markers to write
        self._overflow_lock = threading.Lock()
        self.stream: stream_wire.StreamRouter | None = None
        if settings.stream:
            self.stream = stream_wire.StreamRouter(
                settings.stream_addr or "",
                self.hello(),
                settings.aux_dtype,
                len(ids),
                queue_depth=settings.queue_depth,
                deadline_s=settings.deadline_s,
                send_timeout_s=settings.send_timeout_s,
            )
        self._main: dense.ShardWriter | None = None
        self._main_error: str | None = None
        self._canary: dense.ShardWriter | None = None
        self._seen: set[str] = set()
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        if not settings.sync:
            self._queue = queue.Queue(maxsize=settings.queue_depth)
            self._thread = threading.Thread(
                target=self._run, name="eagle3-dump-writer", daemon=True
            )
            self._thread.start()
        if not self.meta.extra["deepseek_v2_is_reviewed_patch"]:
            logger.warning(
                "eagle3 dump: %s sha256 %s is not the reviewed patched file %s",
                type(model).__module__,
                self.meta.versions["deepseek_v2_sha256"],
                self.meta.extra["patched_sha256_expected"],
            )
        logger.info(
            "eagle3 dump: writer rank %d -> %s (layers %s, hidden %d, %s aux, queue %d)",
            rank,
            self.root,
            ids,
            hidden,
            settings.aux_dtype,
            settings.queue_depth,
        )

    def hello(self) -> dict[str, Any]:
        """The stream's opening frame: what this producer serves (checked by the trainer)."""
        from dataclasses import asdict

        return {
            "meta": asdict(self.meta),
            "identity": {"config_sha256": self.meta.extra.get("config_sha256")},
            **self.info,
        }

    # -- forward thread --

    def handle(self, fb, rids, hidden_states, aux) -> None:
        import torch

        n = len(rids)
        seq = _host_lengths(
            getattr(fb, "extend_seq_lens_cpu", None),
            getattr(fb, "extend_seq_lens", None),
            n,
            "extend_seq_lens",
        )
        pre = _host_lengths(
            getattr(fb, "extend_prefix_lens_cpu", None),
            getattr(fb, "extend_prefix_lens", None),
            n,
            "extend_prefix_lens",
        )
        total = sum(seq)
        for name, t in (("final", hidden_states), ("aux", aux), ("input_ids", fb.input_ids)):
            if t is None or t.shape[0] < total:
                rows = None if t is None else t.shape[0]
                raise DumpConfigError(
                    f"{name} has {rows} rows but the batch extends {total} tokens: a layout that "
                    "splits rows across ranks is on (layernorm SP, attn-TP input scattering, "
                    "context parallel); turn it off for extraction"
                )
        if aux.shape[1] != self.width or hidden_states.shape[1] != self.hidden:
            raise DumpConfigError(
                f"aux/final widths changed to {aux.shape[1]}/{hidden_states.shape[1]}"
            )
        prefix = self.settings.rid_prefix
        keep: list[tuple[str, int, int]] = []
        batch = _Batch([], [])
        off = 0
        for rid, length, plen in zip(rids, seq, pre, strict=True):
            if isinstance(rid, str) and rid.startswith(prefix):
                sid = rid[len(prefix) :]
                if sid.startswith(FLUSH):
                    batch.flush = True
                elif plen != 0:
                    reason = (
                        f"partial request: prefix_len {plen} (chunked prefill or a radix-cache "
                        "hit); run with --chunked-prefill-size -1 --disable-radix-cache"
                    )
                    batch.markers.append(
                        (sid, reason, {"kind": "partial", "prefix_len": plen, "seq_len": length})
                    )
                else:
                    keep.append((sid, off, length))
            off += length
        if keep:
            lo, hi = keep[0][1], keep[-1][1] + keep[-1][2]
            final_h = _to_host(hidden_states[lo:hi], torch.bfloat16)
            aux_h = _to_host(aux[lo:hi], torch.bfloat16)
            ids_h = _to_host(fb.input_ids[lo:hi], torch.int32)
            for sid, o, length in keep:
                a, b = o - lo, o - lo + length
                batch.samples.append((sid, ids_h[a:b], aux_h[a:b], final_h[a:b]))
        if self.stream is not None:
            self.stream.offer([s for s in batch.samples if not s[0].startswith(CANARY)])
            if not self.settings.dense:  # canaries still go to <dir>/canary/ (the client's check)
                batch.samples = [s for s in batch.samples if s[0].startswith(CANARY)]
            # on disk a sample is its dataset id, without the `@k/` route tag of the stream
            batch.samples = [(stream_wire.route(s[0])[1], *s[1:]) for s in batch.samples]
            batch.markers = [(stream_wire.route(m[0])[1], *m[1:]) for m in batch.markers]
        if batch.samples or batch.markers or batch.flush:
            self._submit(batch)

    def _submit(self, batch: _Batch) -> None:
        """Hand over to the writer; blocks while it is behind (backpressure) at most
        settings.deadline_s, then drops the batch's samples (counted, each gets an error marker
        from the writer thread) so the forward returns before SGLang's watchdog fires."""
        if self._queue is not None:
            try:
                self._queue.put(batch, timeout=self.settings.deadline_s)
                return
            except queue.Full:
                pass
            if self._thread is not None and self._thread.is_alive():
                self._drop(batch)
                return
            logger.error("eagle3 dump: writer thread gone; writing in the forward thread")
            self._queue = None
        self._process(batch)

    def _drop(self, batch: _Batch) -> None:
        reason = (
            f"dump back-pressure: the writer took nothing for {self.settings.deadline_s:g}s "
            "(EAGLE3_DUMP_DEADLINE_S; a slow or stuck disk); sample dropped so the forward could "
            "return: send it again"
        )
        dropped = [sid for sid, *_ in batch.samples if not sid.startswith(CANARY)]
        dropped += [sid for sid, _, _ in batch.markers]
        with self._overflow_lock:
            self._overflow.extend((sid, reason) for sid in dropped)
        self.stats["overflow"] += len(dropped)
        logger.error(
            "eagle3 dump: %d sample(s) dropped (%d total): %s",
            len(dropped),
            self.stats["overflow"],
            reason,
        )

    def _write_overflow_markers(self) -> None:
        with self._overflow_lock:
            pending, self._overflow = self._overflow, []
        for sid, reason in pending:
            self._marker(sid, reason, kind="overflow")

    # -- writer thread --

    def _run(self) -> None:
        assert self._queue is not None
        tick = min(1.0, self.settings.flush_s / 2)
        while True:
            try:
                item = self._queue.get(timeout=tick)
            except queue.Empty:
                item = None
            if item is _STOP:
                self._write_overflow_markers()
                self._seal()
                return
            try:  # this thread must outlive any error, or the forward would block on put
                self._write_overflow_markers()
                if item is not None:
                    self._process(item)
                self._seal_if_old()
            except Exception:
                self.stats["io_errors"] += 1
                logger.exception("eagle3 dump: writer error")

    def _process(self, batch: _Batch) -> None:
        for sid, reason, fields in batch.markers:
            self._marker(sid, reason, **fields)
        canaries = [s for s in batch.samples if s[0].startswith(CANARY)]
        for sid, ids, aux, final in batch.samples:
            if sid.startswith(CANARY):
                continue
            try:
                self._add(sid, ids, aux, final)
            except Exception as exc:  # never let one sample stop the writer
                logger.exception("eagle3 dump: sample %s failed", sid)
                self._marker(sid, f"dump failed: {type(exc).__name__}: {exc}", kind="error")
        if canaries:
            self._write_canaries(canaries)
        if batch.flush:
            self._seal()
        elif self._queue is None:
            self._seal_if_old()

    def _main_writer(self) -> dense.ShardWriter | None:
        if self._main is None and self._main_error is None:
            try:
                self._main = dense.ShardWriter(
                    self.root,
                    self.meta,
                    rank=self.rank,
                    shard_bytes=self.settings.shard_bytes,
                    min_free_bytes=self.settings.min_free_bytes,
                )
                self._seen = set(dense.DumpReader(self.root).ids())
            except (dense.DumpFormatError, OSError) as exc:
                self._main_error = f"dump directory unusable: {exc}"
                logger.error("eagle3 dump: %s", self._main_error)
        return self._main

    def _add(self, sid: str, ids, aux, final) -> None:
        writer = self._main_writer()
        if writer is None:
            self._marker(sid, self._main_error or "dump directory unusable", kind="config")
            return
        if sid in self._seen:  # already on disk or buffered: a client retry
            self.stats["duplicates"] += 1
            return
        self._seen.add(sid)
        shards = writer.samples_written
        try:
            writer.add(sid, ids, aux, final)
        except dense.DumpWriteError as exc:
            self._io_error(exc)
        self._count(writer, shards, int(ids.shape[0]))

    def _count(self, writer: dense.ShardWriter, before: int, tokens: int) -> None:
        self.stats["tokens"] += tokens
        if writer.samples_written != before:
            self.stats["shards"] += 1
            self.stats["samples"] = writer.samples_written

    def _write_canaries(self, samples: list[tuple[str, Any, Any, Any]]) -> None:
        """The canaries of one forward go into one shard, sealed at once: the client reads
        "these requests shared a forward" off the shard they landed in."""
        root = self.root / dense.CANARY_DIR
        try:
            if self._canary is None:
                try:
                    self._canary = dense.ShardWriter(root, self.meta, rank=self.rank)
                except dense.DumpFormatError:  # a stale canary of another model: disposable
                    import shutil

                    shutil.rmtree(root, ignore_errors=True)
                    self._canary = dense.ShardWriter(root, self.meta, rank=self.rank)
            for sid, ids, aux, final in samples:
                self._canary.add(sid, ids, aux, final)
            self._canary.flush()
        except dense.DumpWriteError as exc:
            for sid, *_ in samples:
                self._marker(sid, f"canary write failed: {exc}", kind="io", errno=exc.errno)
        except Exception as exc:  # never let a canary stop the writer
            logger.exception("eagle3 dump: canary failed")
            for sid, *_ in samples:
                self._marker(sid, f"canary failed: {type(exc).__name__}: {exc}", kind="error")

    def _seal(self) -> None:
        if self._main is None or not self._main.buffered_samples:
            return
        before = self._main.samples_written
        try:
            self._main.flush()
        except dense.DumpWriteError as exc:
            self._io_error(exc)
        except Exception:  # not an I/O error: a bug; keep the writer alive, say so loudly
            self.stats["io_errors"] += 1
            logger.exception("eagle3 dump: sealing a shard failed")
        self._count(self._main, before, 0)
        logger.info("eagle3 dump: %s", self.stats)

    def _seal_if_old(self) -> None:
        if self._main is not None and self._main.buffer_age() >= self.settings.flush_s:
            self._seal()

    def _io_error(self, exc: dense.DumpWriteError) -> None:
        self.stats["io_errors"] += 1
        logger.error("eagle3 dump: write failed (%d samples): %s", len(exc.sample_ids), exc)
        for sid in exc.sample_ids:
            self._seen.discard(sid)
            self._marker(sid, f"write failed: {exc}", kind="io", errno=exc.errno)

    def _marker(self, sid: str, reason: str, **fields: Any) -> None:
        self.stats["markers"] += 1
        try:
            dense.write_error_marker(
                self.root, sid, reason, rid=self.settings.rid_prefix + sid, **self.info, **fields
            )
        except OSError as exc:  # the disk may be full: count, never raise
            self.stats["marker_errors"] += 1
            logger.error("eagle3 dump: cannot write error marker for %s: %s", sid, exc)

    def close(self) -> None:
        """Seal what is buffered and stop the writer thread (atexit, reset)."""
        if self._closed:
            return
        self._closed = True
        if self.stream is not None:
            self.stream.drain(timeout=60)
            self.stream.close()
        if self._queue is not None and self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout=600)
        else:
            self._seal()
