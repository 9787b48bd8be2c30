"""The trainer's end of the hidden-state stream: accepts producer connections, checks each
producer's HELLO against what the trainer expects, decodes SAMPLE frames and hands them on.

A connection that breaks (truncated or corrupt frame, producer killed) is closed and counted;
nothing of its unfinished frame is delivered, and `on_lost` tells the fetcher to ask again for
what it had not received. A producer whose identity differs is refused: its connection is
closed and `refused` holds the reason (the fetcher raises it; training never silently mixes
two models' states).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from remote_agent.eagle3 import stream_wire as wire
from remote_agent.eagle3.dense import DumpMeta

# what must agree between the producer's meta and the trainer's expectation
META_KEYS = ("hidden_size", "num_layers", "aux_layer_ids", "final_norm", "aux_norm")
IDENTITY_KEYS = ("config_sha256", "tokenizer_sha256", "weights_sha256")


def hello_problems(
    hello: dict[str, Any], expect: dict[str, Any], identity: dict[str, Any]
) -> list[str]:
    """Why a producer's HELLO is refused (empty: accepted). `expect`: meta fields the trainer
    requires (absent = take the producer's); `identity`: the target's model_identity; every key
    the producer states must match, and it must state config_sha256."""
    try:
        meta = DumpMeta.from_json(hello.get("meta") or {})
    except TypeError as exc:
        return [f"HELLO meta unreadable: {exc}"]
    expect = {"final_norm": "post", "aux_norm": "pre", **expect}  # what the trainer consumes
    problems = [
        f"{k} {getattr(meta, k)!r} != expected {expect[k]!r}"
        for k in META_KEYS
        if expect.get(k) is not None and getattr(meta, k) != expect[k]
    ]
    if meta.aux_dtype not in ("bf16", "fp8_e4m3"):
        problems.append(f"aux_dtype {meta.aux_dtype!r}")
    theirs = hello.get("identity") or {}
    if not theirs.get("config_sha256"):
        problems.append("the producer does not state its model's config_sha256")
    for key in IDENTITY_KEYS:
        if theirs.get(key) and identity.get(key) and theirs[key] != identity[key]:
            problems.append(f"{key} {str(theirs[key])[:12]} != the target's {identity[key][:12]}")
    if problems:
        problems.insert(0, f"producer {hello.get('host')}:{hello.get('pid')} serves {meta.model}")
    return problems


class StreamListener:
    def __init__(
        self,
        addr: str,
        expect: dict[str, Any],
        identity: dict[str, Any],
        on_sample: Callable[[str, dict[str, Any], DumpMeta], None],
        on_dropped: Callable[[str, str], None],
        on_lost: Callable[[str], None],
    ) -> None:
        self.addr = addr
        self.expect, self.identity = expect, identity
        self.on_sample, self.on_dropped, self.on_lost = on_sample, on_dropped, on_lost
        self.meta: DumpMeta | None = None
        self.refused: str | None = None
        self.stats = {"connections": 0, "samples": 0, "bytes": 0, "broken": 0, "refused": 0}
        self.hello_seen = threading.Event()
        family, address = wire.parse_address(addr)
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        if family == socket.AF_UNIX:
            path = Path(address)
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a stale socket of a killed trainer
        else:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(address)
        self._sock.listen(64)
        if family == socket.AF_INET and address[1] == 0:  # tests: an ephemeral port
            self.addr = f"tcp:{address[0]}:{self._sock.getsockname()[1]}"
        self._unix = address if family == socket.AF_UNIX else None
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="eagle3-listen", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.add(conn)
            self.stats["connections"] += 1
            threading.Thread(
                target=self._serve, args=(conn,), name="eagle3-stream-in", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        why = "closed"
        try:
            first = wire.read_frame(conn.recv_into)
            if first is None:
                return
            if first.kind != wire.HELLO:
                raise wire.CorruptFrame(f"first frame is {wire.KINDS[first.kind]}, not HELLO")
            problems = hello_problems(first.header, self.expect, self.identity)
            if problems:
                self.stats["refused"] += 1
                self.refused = "; ".join(problems)
                why = "refused"
                return
            meta = DumpMeta.from_json(first.header["meta"])
            if self.meta is None:
                self.meta = meta
            elif diff := meta.compatible_with(self.meta):
                self.stats["refused"] += 1
                self.refused = f"two producers differ in {', '.join(diff)}"
                why = "refused"
                return
            self.hello_seen.set()
            while not self._stop.is_set():
                frame = wire.read_frame(conn.recv_into)
                if frame is None:
                    return
                if frame.kind == wire.SAMPLE:
                    sample = wire.decode_sample(frame)
                    self.stats["samples"] += 1
                    self.stats["bytes"] += len(frame.payload)
                    self.on_sample(str(frame.header["sample_id"]), sample, meta)
                elif frame.kind == wire.DROPPED:
                    self.on_dropped(
                        str(frame.header.get("sample_id")), str(frame.header.get("reason"))
                    )
        except (wire.StreamError, OSError) as exc:
            self.stats["broken"] += 1
            why = f"{type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                self._conns.discard(conn)
            with contextlib.suppress(OSError):
                conn.close()
            if not self._stop.is_set():
                self.on_lost(why)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._sock.close()
        with self._lock:
            for c in list(self._conns):
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)
        if self._unix:
            with contextlib.suppress(OSError):
                os.unlink(self._unix)
        self._thread.join(timeout=5)
