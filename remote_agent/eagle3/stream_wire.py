"""The hidden-state stream: frames on a socket from a producer (the SGLang dump hook, or the HF
reference producer) to the trainer, and the producer's bounded, deadline-guarded sender.

Address: `unix:/path/to.sock` (one box) or `tcp:HOST:PORT` (between boxes). The trainer listens;
every producer process that writes (attention-TP rank 0 of each DP group) connects and opens
with a HELLO naming what it serves; then one SAMPLE frame per sample.

Frame: a fixed 28-byte header `<4sBBHIQQ` (magic b"E3HS", protocol version, kind, 0, header
length, payload length, crc32 of header + payload), a JSON header, the payload. A frame that
ends early is a TruncatedFrame, a bad magic/version/size/crc a CorruptFrame: the reader drops
the connection and nothing of that frame reaches training.

  HELLO    {"meta": DumpMeta fields, "identity": {config_sha256, ...}, "rank", "pid", "host"}
  SAMPLE   {"sample_id", "tokens", "parts": [[name, dtype, shape, nbytes], ...]} + the bytes of
           input_ids int32 [T], final bf16 [T, H] and aux bf16 [T, K*H] (or aux_fp8 + aux_scale):
           the tensors a dense shard holds for that sample, decoded the way DumpReader does
  DROPPED  {"sample_id", "reason"}: the producer could not deliver it (ask again)

The sender (`StreamSender`) never blocks a forward past its deadline: the forward hands host
copies to a bounded queue; a full queue after `deadline_s` drops that batch's samples (counted,
logged, announced as DROPPED once the connection drains) instead of stalling SGLang past its
watchdog. A socket send that stalls `send_timeout_s` closes the connection (the trainer asks
again for what it did not receive).

Imports only the standard library at module level (torch lazily): the SGLang dump helper ships a
byte-identical copy of it next to sglang (sglang/srt/eagle3_dump/stream_wire.py).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import socket
import struct
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any

MAGIC = b"E3HS"
PROTOCOL = 1
HEAD = struct.Struct("<4sBBHIQQ")
HELLO, SAMPLE, DROPPED = 1, 2, 3
KINDS = {HELLO: "HELLO", SAMPLE: "SAMPLE", DROPPED: "DROPPED"}
MAX_HEADER = 1 << 20
MAX_PAYLOAD = 1 << 36  # 64 GiB: a 1M-token sample at Kimi width is ~57 GB

logger = logging.getLogger(__name__)


class StreamError(Exception):
    """Base of the stream's errors."""


class TruncatedFrame(StreamError):
    """The connection ended inside a frame (the producer died mid-sample)."""


class CorruptFrame(StreamError):
    """Bad magic, version, size or checksum."""


def parse_address(addr: str) -> tuple[int, Any]:
    """`unix:PATH` or `tcp:HOST:PORT` -> (socket family, address)."""
    kind, _, rest = addr.partition(":")
    if kind == "unix" and rest:
        return socket.AF_UNIX, rest
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        if host and port.isdigit():
            return socket.AF_INET, (host, int(port))
    raise ValueError(f"stream address {addr!r}: expected unix:PATH or tcp:HOST:PORT")


@dataclass
class Frame:
    kind: int
    header: dict[str, Any]
    payload: memoryview


def frame_buffers(kind: int, header: dict[str, Any], parts: list) -> list:
    """The buffers of one frame (header struct, JSON, payload parts: bytes or memoryviews)."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    size = sum(len(memoryview(p).cast("B")) for p in parts)
    crc = zlib.crc32(raw)
    for p in parts:
        crc = zlib.crc32(memoryview(p).cast("B"), crc)
    return [HEAD.pack(MAGIC, PROTOCOL, kind, 0, len(raw), size, crc), raw, *parts]


def _read_exact(read, n: int, what: str) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = read(view[got:])
        if not k:
            raise TruncatedFrame(f"connection ended {got} of {n} bytes into the {what}")
        got += k
    return buf


def read_frame(read) -> Frame | None:
    """One frame from `read(memoryview) -> nbytes` (a socket's recv_into, a file's readinto);
    None on a clean end between frames."""
    first = bytearray(HEAD.size)
    view, got = memoryview(first), 0
    while got < HEAD.size:
        k = read(view[got:])
        if not k:
            if got == 0:
                return None
            raise TruncatedFrame(f"connection ended {got} bytes into a frame header")
        got += k
    magic, version, kind, _, hlen, plen, crc = HEAD.unpack(first)
    if magic != MAGIC:
        raise CorruptFrame(f"bad magic {bytes(magic)!r} (not an eagle3 hidden-state stream)")
    if version != PROTOCOL:
        raise CorruptFrame(f"stream protocol {version}; this side speaks {PROTOCOL}")
    if kind not in KINDS or hlen > MAX_HEADER or plen > MAX_PAYLOAD:
        raise CorruptFrame(f"bad frame: kind {kind}, header {hlen} B, payload {plen} B")
    raw = _read_exact(read, hlen, "frame header")
    payload = _read_exact(read, plen, "sample payload")
    if zlib.crc32(payload, zlib.crc32(raw)) != crc:
        raise CorruptFrame(f"{KINDS[kind]} frame checksum mismatch")
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise CorruptFrame(f"unreadable frame header: {exc}") from None
    if not isinstance(header, dict):
        raise CorruptFrame("frame header is not a JSON object")
    return Frame(kind, header, memoryview(payload))


# ---- samples: the tensors a dense shard holds for one sample ----

_DTYPES = {"int32": "int32", "bfloat16": "bfloat16", "float32": "float32"}


def _dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def sample_frame(sample_id: str, ids, aux, final, aux_dtype: str, num_aux: int) -> list:
    """Buffers of a SAMPLE frame: host tensors cast/quantized as a dense shard stores them."""
    import torch

    from . import dense

    tensors = [("input_ids", ids.to(torch.int32)), ("final", final.to(torch.bfloat16))]
    if aux_dtype == "fp8_e4m3":
        q, scale = dense.quantize_fp8(aux, num_aux)
        tensors += [("aux_fp8", q), ("aux_scale", scale.to(torch.float32))]
    else:
        tensors.append(("aux", aux.to(torch.bfloat16)))
    parts, spec = [], []
    for name, t in tensors:
        t = t.contiguous()
        data = t.view(torch.uint8).numpy() if t.numel() else b""
        parts.append(memoryview(data).cast("B") if t.numel() else b"")
        spec.append([name, _dtype_name(t), list(t.shape), t.numel() * t.element_size()])
    header = {"sample_id": sample_id, "tokens": int(ids.shape[0]), "parts": spec}
    return frame_buffers(SAMPLE, header, parts)


def decode_sample(frame: Frame) -> dict[str, Any]:
    """{'input_ids' int32 [T], 'aux' bf16 [T, K*H], 'final' bf16 [T, H]} (as DumpReader.get)."""
    import torch

    from . import dense

    spec, at, out = frame.header.get("parts"), 0, {}
    if not isinstance(spec, list):
        raise CorruptFrame("SAMPLE frame without parts")
    for entry in spec:
        try:
            name, dtype, shape, nbytes = entry
            tdtype = getattr(torch, dtype)
        except (TypeError, ValueError, AttributeError):
            raise CorruptFrame(f"bad part {entry!r}") from None
        chunk = frame.payload[at : at + int(nbytes)]
        at += int(nbytes)
        count = 1
        for s in shape:
            count *= int(s)
        if len(chunk) != count * torch.empty((), dtype=tdtype).element_size():
            raise CorruptFrame(f"part {name}: {len(chunk)} bytes for shape {shape} {dtype}")
        flat = torch.frombuffer(chunk, dtype=torch.uint8) if count else None
        out[name] = (
            flat.view(tdtype).reshape(shape)
            if flat is not None
            else torch.empty(shape, dtype=tdtype)
        )
    if at != len(frame.payload):
        raise CorruptFrame(f"payload has {len(frame.payload) - at} bytes past its parts")
    if "aux_fp8" in out:
        out["aux"] = dense.dequantize_fp8(out.pop("aux_fp8"), out.pop("aux_scale"))
    t = int(frame.header.get("tokens", -1))
    for name in ("input_ids", "aux", "final"):
        if name not in out or out[name].shape[0] != t:
            raise CorruptFrame(f"SAMPLE {frame.header.get('sample_id')!r}: {name} rows != {t}")
    return out


# ---- routing: one trainer process per destination ----

ROUTE = re.compile(r"@(\d{1,4})/(.+)", re.S)


def route(sample_id: str) -> tuple[int, str]:
    """`@k/<id>` (a data-parallel trainer's rank k asked for it) -> (k, id); else (0, id)."""
    m = ROUTE.fullmatch(sample_id)
    return (int(m.group(1)), m.group(2)) if m else (0, sample_id)


def destination(template: str, k: int) -> str:
    """Rank k's address: `{k}` in the template is replaced (`unix:/run/s-{k}.sock`); a plain
    address serves rank 0 only."""
    if "{k}" in template:
        return template.replace("{k}", str(k))
    if k != 0:
        raise ValueError(
            f"sample for trainer rank {k} but EAGLE3_STREAM_ADDR {template!r} has no {{k}}"
        )
    return template


# ---- the producer's sender ----

_STOP = object()


class StreamSender:
    """Bounded hand-off from the forward to one sender thread that owns the connection.

    `offer(samples)` returns within `deadline_s` whatever the consumer does: the samples are
    queued, or (queue still full at the deadline) dropped, counted in `stats["overflow"]` and
    announced to the consumer as DROPPED frames once the connection drains. Host memory held is
    at most `queue_depth` forwards' rows plus the one being sent."""

    def __init__(
        self,
        addr: str,
        hello: dict[str, Any],
        aux_dtype: str,
        num_aux: int,
        queue_depth: int = 4,
        deadline_s: float = 20.0,
        send_timeout_s: float = 60.0,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.family, self.address = parse_address(addr)
        self.addr, self.hello = addr, hello
        self.aux_dtype, self.num_aux = aux_dtype, num_aux
        self.deadline_s, self.send_timeout_s = deadline_s, send_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.stats = {
            "sent": 0,
            "bytes": 0,
            "overflow": 0,
            "unsent": 0,
            "send_errors": 0,
            "connects": 0,
            "dropped_notices": 0,
        }
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, queue_depth))
        self._dropped: deque = deque(maxlen=100_000)  # (sample id, reason) to announce
        self._sock: socket.socket | None = None
        self._closed = False
        self.fault = os.environ.get("EAGLE3_STREAM_FAULT", "")  # tests: "die_mid_frame:N"
        self._thread = threading.Thread(target=self._run, name="eagle3-stream", daemon=True)
        self._thread.start()

    # -- forward thread --

    def offer(self, samples: list[tuple[str, Any, Any, Any]]) -> bool:
        """Queue (sample id, ids, aux, final) host tensors; False: dropped at the deadline."""
        if not samples:
            return True
        try:
            self._queue.put(samples, timeout=self.deadline_s)
            return True
        except queue.Full:
            self.stats["overflow"] += len(samples)
            reason = (
                f"stream back-pressure: the consumer at {self.addr} took nothing for "
                f"{self.deadline_s:g}s (EAGLE3_DUMP_DEADLINE_S); sample dropped so the forward "
                "could return"
            )
            for sid, *_ in samples:
                self._dropped.append((sid, reason))
            logger.error(
                "eagle3 stream: %d sample(s) dropped (%s total): %s",
                len(samples),
                self.stats["overflow"],
                reason,
            )
            return False

    # -- sender thread --

    def _connect(self) -> socket.socket | None:
        if self._sock is not None:
            return self._sock
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        sock.settimeout(self.connect_timeout_s)
        try:
            sock.connect(self.address)
            sock.settimeout(self.send_timeout_s)
            if self.family == socket.AF_INET:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._send(sock, frame_buffers(HELLO, self.hello, []))
        except OSError as exc:
            sock.close()
            logger.error("eagle3 stream: no consumer at %s: %s", self.addr, exc)
            return None
        self.stats["connects"] += 1
        self._sock = sock
        return sock

    def _send(self, sock: socket.socket, buffers: list) -> None:
        n = self.fault.startswith("die_mid_frame:") and self.stats["sent"] >= int(
            self.fault.split(":")[1]
        )
        for i, b in enumerate(buffers):
            if n and i == len(buffers) - 1:  # fault injection: half a frame, then die
                view = memoryview(b).cast("B")
                sock.sendall(view[: len(view) // 2])
                os._exit(17)
            sock.sendall(b)
            self.stats["bytes"] += len(memoryview(b).cast("B"))

    def _broken(self, exc: BaseException) -> None:
        self.stats["send_errors"] += 1
        logger.error("eagle3 stream: connection to %s lost: %s", self.addr, exc)
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock = None

    def _announce_dropped(self, sock: socket.socket) -> None:
        while self._dropped:
            sid, reason = self._dropped[0]
            self._send(sock, frame_buffers(DROPPED, {"sample_id": sid, "reason": reason}, []))
            self._dropped.popleft()
            self.stats["dropped_notices"] += 1

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=0.5)
            except queue.Empty:
                item = None
            if item is _STOP:
                break
            try:  # this thread must survive anything, or the forward would fill the queue
                sock = self._connect() if (item is not None or self._dropped) else None
                if sock is None:
                    if item is not None:
                        self.stats["unsent"] += len(item)
                    continue
                self._announce_dropped(sock)
                for sid, ids, aux, final in item or []:
                    self._send(
                        sock, sample_frame(sid, ids, aux, final, self.aux_dtype, self.num_aux)
                    )
                    self.stats["sent"] += 1
            except OSError as exc:  # the consumer asks again for what it did not receive
                self._broken(exc)
            except Exception:
                self.stats["send_errors"] += 1
                logger.exception("eagle3 stream: sender error")
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def drain(self, timeout: float = 60.0) -> bool:
        """Wait until everything queued was handed to the socket (tests, shutdown)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self._queue.empty() and not self._dropped:
                time.sleep(0.05)
                if self._queue.empty():
                    return True
            time.sleep(0.01)
        return False

    def close(self, timeout: float = 30.0) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout=timeout)


class StreamRouter:
    """A StreamSender per destination rank, made on first use; `offer` splits a forward's
    samples by their `@k/` route tag (stripped: the stream carries the dataset's id)."""

    def __init__(self, template: str, hello: dict[str, Any], aux_dtype: str, num_aux: int,
                 **kw: Any) -> None:  # fmt: skip
        parse_address(destination(template, 0))
        self.template, self.hello, self.aux_dtype, self.num_aux = (
            template,
            hello,
            aux_dtype,
            num_aux,
        )
        self.kw = kw
        self.senders: dict[int, StreamSender] = {}
        self.misrouted = 0

    def offer(self, samples: list[tuple[str, Any, Any, Any]]) -> bool:
        groups: dict[int, list] = {}
        for sid, *rows in samples:
            k, plain = route(sid)
            groups.setdefault(k, []).append((plain, *rows))
        ok = True
        for k, group in groups.items():
            sender = self.senders.get(k)
            if sender is None:
                try:
                    addr = destination(self.template, k)
                except ValueError as exc:
                    self.misrouted += len(group)
                    logger.error("eagle3 stream: %d sample(s) dropped: %s", len(group), exc)
                    ok = False
                    continue
                sender = StreamSender(
                    addr, {**self.hello, "dest_rank": k}, self.aux_dtype, self.num_aux, **self.kw
                )
                self.senders[k] = sender
            ok = sender.offer(group) and ok
        return ok

    @property
    def stats(self) -> dict[str, int]:
        out = {"misrouted": self.misrouted, "destinations": len(self.senders)}
        for sender in self.senders.values():
            for key, value in sender.stats.items():
                out[key] = out.get(key, 0) + value
        return out

    def drain(self, timeout: float = 60.0) -> bool:
        return all([sender.drain(timeout) for sender in self.senders.values()])

    def close(self, timeout: float = 30.0) -> None:
        for sender in self.senders.values():
            sender.close(timeout)
