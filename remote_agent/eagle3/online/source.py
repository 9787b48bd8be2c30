"""Online training data: the trainer asks the producer for samples by id, in training order, and
trains on what streams back (`eagle3 train --online URL`).

* Order: exactly the offline one (data.Plan's seeded global shuffle of the sample ids per
  epoch, first-fit packing), built from the dataset index alone, so online training on the same
  samples equals offline training from a dump of them, and a checkpoint's (epoch, step) means
  the same batches in both modes.
* Pipeline: a requester keeps up to `online.window` samples requested ahead of training
  (`request_batch` per /generate, `concurrency` requests in flight); the listener receives
  them on the stream; the loader thread (data.Loader) packs and pins batches from them while
  the GPU trains on the previous one. Host memory: at most `window` samples.
* Faults: a sample not received within `sample_timeout_s`, announced DROPPED by the producer
  (its back-pressure deadline), or in flight on a connection that broke, is asked for again;
  a copy that arrives twice is used once. `producer_wait_s` without any sample arriving is a
  clear error (resumable). The dataset's token ids are checked against every streamed sample
  (data.Loader), the producer's identity against the target at its HELLO (listener.py).
* Resume: the checkpoint's (epoch, step) position; the requests restart from its first sample,
  so within an epoch no sample is trained twice and none is skipped, whichever side crashed.
* Cache: with `cache_gb` > 0, received samples are also kept in a ring of files under
  `cache_dir` (oldest evicted first); later epochs and resumes read what is still there.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from remote_agent.eagle3.dense import DumpMeta, safe_name
from remote_agent.eagle3.drafter.train.data import Loader, Plan, is_holdout
from remote_agent.eagle3.errors import BadInput, Failed
from remote_agent.eagle3.online.reforward import Reforwards, rows_digest


class RingCache:
    """One safetensors file per sample under `root`, at most `max_bytes` in all (oldest out)."""

    def __init__(self, root: Path, max_bytes: int, meta: DumpMeta) -> None:
        from dataclasses import asdict

        self.root, self.max_bytes = Path(root), int(max_bytes)
        self.root.mkdir(parents=True, exist_ok=True)
        stamp = self.root / "meta.json"
        want = json.dumps(asdict(meta), sort_keys=True)
        if not stamp.exists() or stamp.read_text() != want:  # another model's states: discard
            for f in self.root.glob("*.safetensors"):
                f.unlink(missing_ok=True)
            stamp.write_text(want)
        files = sorted(self.root.glob("*.safetensors"), key=lambda f: f.stat().st_mtime)
        self._files: OrderedDict[str, tuple[Path, int]] = OrderedDict()
        for f in files:
            self._files[f.stem] = (f, f.stat().st_size)
        self.bytes = sum(n for _, n in self._files.values())
        self.bytes_written = 0
        self._lock = threading.Lock()

    def put(self, sample_id: str, sample: dict[str, Any]) -> None:
        from safetensors.torch import save_file

        name = safe_name(sample_id)
        path = self.root / f"{name}.safetensors"
        tmp = path.with_name(path.name + ".tmp")
        save_file({k: v.contiguous() for k, v in sample.items()}, str(tmp), {"id": sample_id})
        os.replace(tmp, path)
        size = path.stat().st_size
        with self._lock:
            old = self._files.pop(name, None)
            self.bytes += size - (old[1] if old else 0)
            self._files[name] = (path, size)
            self.bytes_written += size
            while self.bytes > self.max_bytes and len(self._files) > 1:
                _, (victim, n) = self._files.popitem(last=False)
                victim.unlink(missing_ok=True)
                self.bytes -= n

    def get(self, sample_id: str) -> dict[str, Any] | None:
        from safetensors import safe_open

        with self._lock:
            entry = self._files.get(safe_name(sample_id))
        if entry is None:
            return None
        try:
            with safe_open(str(entry[0]), framework="pt") as f:
                if (f.metadata() or {}).get("id") != sample_id:
                    return None
                return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        except Exception:  # evicted meanwhile, or a torn file of a killed run: stream it again
            return None

    def __contains__(self, sample_id: object) -> bool:
        return isinstance(sample_id, str) and safe_name(sample_id) in self._files


def expected_meta(target: Path, aux_layer_ids: list[int] | None) -> dict[str, Any]:
    """The meta fields a producer must match: the target's shapes, the drafter's layers."""
    path = Path(target) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path}: unreadable ({exc})") from None
    cfg = cfg.get("text_config") or cfg
    return {
        "hidden_size": cfg.get("hidden_size"),
        "num_layers": cfg.get("num_hidden_layers"),
        "aux_layer_ids": sorted(aux_layer_ids) if aux_layer_ids else None,
    }


class OnlineFetcher:
    """Requests samples from the producer ahead of training and hands them out by id (the
    `get(sample_id)` of a DumpReader, so data.Loader assembles online batches unchanged)."""

    def __init__(
        self,
        opts,
        listen: str,
        expect: dict[str, Any],
        identity: dict[str, Any],
        dataset_index,
        route: str = "",
    ) -> None:
        from remote_agent.eagle3.http_client import HttpClient
        from remote_agent.eagle3.online.listener import StreamListener

        self.opts, self.index = opts, dataset_index
        self.rid_prefix = opts.rid_prefix + route  # `@k/`: the hook streams it to rank k
        try:
            self.http = HttpClient(  # a reply is "computed": the rows come on the stream
                opts.server if "://" in opts.server else f"http://{opts.server}",
                max(60.0, opts.sample_timeout_s),
            )
        except ValueError:
            raise BadInput(f"online.server {opts.server!r}: expected http://HOST:PORT") from None
        self._cond = threading.Condition()
        self._want: dict[str, float] = {}  # requested, not received: sample id -> asked at
        self._again: set[str] = set()  # ask again now (dropped, connection lost)
        self._have: dict[str, dict[str, Any]] = {}
        self._order: Iterator[str] | None = None
        self._ahead: list[str] = []  # the order's next ids, not yet consumed
        self._repeat: dict[str, int] = {}  # ids due again (next epoch) while still held/asked
        # occurrences the loader consumed before the requester reached them in the order (it
        # runs on its own thread): skipped when the requester gets there, never asked twice
        self._early: dict[str, int] = {}
        self._probed: str | None = None
        self.cache: RingCache | None = None
        self.reforwards = Reforwards()  # online.compare_reforwards: a sample's rows asked again
        self.error: BaseException | None = None
        self.last_arrival = time.monotonic()
        self.last_problem = ""
        self.stats = {
            "requested": 0,
            "received": 0,
            "duplicates": 0,
            "unrequested": 0,
            "retries": 0,
            "dropped": 0,
            "lost_connections": 0,
            "request_errors": 0,
            "cache_hits": 0,
        }
        self.listener = StreamListener(
            listen, expect, identity, self._arrived, self._dropped, self._lost
        )
        self._pool = ThreadPoolExecutor(max(1, opts.concurrency), thread_name_prefix="eagle3-req")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- listener callbacks --

    def _arrived(self, sid: str, sample: dict[str, Any], meta: DumpMeta) -> None:
        wanted = sid in self._want  # read unlocked, as the cache does: arrivals follow requests
        if self.cache is not None and wanted:  # cached before it is handed out
            self.cache.put(sid, sample)
        track = wanted and self.opts.compare_reforwards
        digest = rows_digest(sample) if track else None  # hashed outside the lock
        with self._cond:
            if sid in self._want:
                del self._want[sid]
                self._again.discard(sid)
                self._have[sid] = sample
                if digest is not None:
                    self.reforwards.see(sid, digest)
                self.stats["received"] += 1
                self.last_arrival = time.monotonic()
                self._cond.notify_all()
            elif sid in self._have:
                self.stats["duplicates"] += 1
                return
            else:
                self.stats["unrequested"] += 1

    def _dropped(self, sid: str, reason: str) -> None:
        with self._cond:
            self.stats["dropped"] += 1
            self.last_problem = f"{sid}: {reason}"
            if sid in self._want:
                self._again.add(sid)
                self._cond.notify_all()

    def _lost(self, why: str) -> None:
        with self._cond:
            self.stats["lost_connections"] += 1
            self.last_problem = f"stream connection lost: {why}"
            self._again.update(self._want)  # duplicates are used once
            self._cond.notify_all()

    # -- set-up --

    def probe(self, sid: str) -> DumpMeta:
        """Ask for one sample and wait for the producer's HELLO: its meta, identity-checked."""
        with self._cond:
            self._want[sid] = time.monotonic()
            self._probed = sid
        self._request([sid])
        end = time.monotonic() + self.opts.producer_wait_s
        said = time.monotonic()
        while not self.listener.hello_seen.wait(0.2):
            self._raise_refused()
            if time.monotonic() - said > 30:
                said = time.monotonic()
                print(
                    f"online: waiting for a producer at {self.http.url} to stream to "
                    f"{self.listener.addr} ({self.last_problem or 'no answer yet'})",
                    file=sys.stderr,
                    flush=True,
                )
            if time.monotonic() > end:
                raise Failed(
                    f"online: no producer connected to {self.listener.addr} within "
                    f"{self.opts.producer_wait_s:g}s of asking {self.http.url} for {sid!r} "
                    f"({self.last_problem or 'no error seen'}); start SGLang with "
                    f"EAGLE3_DUMP_MODE=stream EAGLE3_STREAM_ADDR={self.listener.addr}"
                )
            with self._cond:
                stale = self._again or time.monotonic() - self._want.get(sid, 0) > 30
            if stale and sid in self._want:
                self._request([sid])
        self._raise_refused()
        assert self.listener.meta is not None
        return self.listener.meta

    def start(self, order: Iterator[str]) -> None:
        self._order = order
        self._thread = threading.Thread(target=self._run, name="eagle3-online", daemon=True)
        self._thread.start()

    # -- requester --

    def _request(self, sids: list[str]) -> None:
        body = {
            "input_ids": [self.index.read(s).input_ids for s in sids],
            "rid": [self.rid_prefix + s for s in sids],
            "sampling_params": {"max_new_tokens": 0},
            "stream": False,
        }
        with self._cond:  # the requester and the loader (get) both ask
            self.stats["requested"] += len(sids)

        def send() -> None:
            from remote_agent.eagle3.http_client import HttpError

            try:
                self.http.post("/generate", body)
            except HttpError as exc:
                with self._cond:
                    self.stats["request_errors"] += 1
                    self.last_problem = str(exc)
                    for s in sids:  # ask again on the next round (after a short pause)
                        if s in self._want:  # paced: _next_requests waits 0.5 s
                            self._want[s] = time.monotonic()
                            self._again.add(s)

        self._pool.submit(send)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                batch = self._next_requests()
                if batch:
                    for i in range(0, len(batch), self.opts.request_batch):
                        self._request(batch[i : i + self.opts.request_batch])
                with self._cond:
                    self._cond.wait(0.05 if batch else 0.2)
        except BaseException as exc:  # surfaced by get()
            self.error = exc
            with self._cond:
                self._cond.notify_all()

    def _next_requests(self) -> list[str]:
        now = time.monotonic()
        out: list[str] = []
        with self._cond:
            while self._order is not None and len(self._ahead) < self.opts.window:
                sid = next(self._order, None)
                if sid is None:
                    self._order = None
                    break
                probed = sid == self._probed  # asked for by probe(): its first turn is this one
                if probed:
                    self._probed = None
                if self._early.get(sid):  # this turn was already served (get() came first)
                    self._early[sid] -= 1
                    continue
                self._ahead.append(sid)
                if probed and (sid in self._have or sid in self._want):
                    continue
                if sid in self._have or sid in self._want:
                    self._repeat[sid] = self._repeat.get(sid, 0) + 1  # asked when handed out
                    continue
                if self.cache is not None and sid in self.cache:
                    continue  # read from the cache when its turn comes
                self._want[sid] = now
                out.append(sid)
            retry = [
                s
                for s, t in self._want.items()
                if (s in self._again and now - t > 0.5) or now - t > self.opts.sample_timeout_s
            ]
            for s in retry:
                self._want[s] = now
                self._again.discard(s)
            self.stats["retries"] += len(retry)
            out += retry
        return out

    # -- the loader's side --

    def _raise_refused(self) -> None:
        if self.listener.refused:
            raise BadInput(f"online: refused the producer: {self.listener.refused}")

    def get(self, sid: str) -> dict[str, Any]:
        """The sample (DumpReader.get's dict); waits for it, asking again as needed."""
        with self._cond:
            if self._ahead and self._ahead[0] == sid:
                self._ahead.pop(0)
            elif sid in self._ahead:
                self._ahead.remove(sid)
            else:  # the requester has not reached this turn yet: it skips it when it does
                self._early[sid] = self._early.get(sid, 0) + 1
            self._cond.notify_all()
            if sid not in self._have and sid not in self._want:
                cached = self.cache.get(sid) if self.cache is not None else None
                if cached is not None:
                    self.stats["cache_hits"] += 1
                    return cached
                self._ask_now(sid)  # not a retry: nobody asked for this turn yet
            while sid not in self._have:
                self._raise_refused()
                if self.error is not None:
                    raise Failed(f"online: the requester failed: {self.error}")
                idle = time.monotonic() - self.last_arrival
                if idle > self.opts.producer_wait_s:
                    raise Failed(
                        f"online: no sample from {self.http.url} for {idle:.0f}s while waiting "
                        f"for {sid!r} ({self.last_problem or 'no error seen'}); the run is "
                        "resumable from its last checkpoint"
                    )
                self._cond.wait(0.2)
            sample = self._have.pop(sid)
            if self._repeat.get(sid):  # the same id again later in the window: ask now
                self._repeat[sid] -= 1
                if self.cache is None or sid not in self.cache:
                    # here, not on the requester's next round: the loader may reach that turn
                    # first, and would then wait for a retry (a 0.5 s stall counted as one)
                    self._ask_now(sid)
            return sample

    def _ask_now(self, sid: str) -> None:
        """Request one sample at once (caller holds the condition)."""
        self._want[sid] = time.monotonic()
        self._request([sid])

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.listener.close()


def _order(plan: Plan, rank: int, start_epoch: int, start_step: int, epochs: int):
    """Sample ids in the order data.Loader will ask for them (same loop, same batches)."""
    for epoch in range(start_epoch, epochs):
        batches = plan.epoch_batches(epoch)
        steps = len(batches) // plan.world
        for step in range(start_step if epoch == start_epoch else 0, steps):
            for idx in batches[step * plan.world + rank]:
                yield plan.samples[idx][0]


class OnlinePlan(Plan):
    """data.Plan with the samples from the dataset index (every usable record) and the meta
    from the producer's HELLO; `fetcher` streams the data."""

    def __init__(self, cfg, world: int, rank: int = 0) -> None:
        from remote_agent.eagle3.data.records import DatasetIndex
        from remote_agent.eagle3.extraction.identity import model_identity

        data, on = cfg.data, cfg.online
        if cfg.train.sequence_parallel:
            raise BadInput("online training does not combine with train.sequence_parallel")
        template = on.listen or str(
            f"unix:{Path(cfg.train.out_dir).resolve()}/"
            + ("stream.sock" if world == 1 else "stream-{k}.sock")
        )
        if world > 1 and "{k}" not in template:
            raise BadInput(
                f"online.listen {template!r}: with {world} data-parallel ranks it needs {{k}} "
                "(each rank listens on its own address; start SGLang with the same template "
                "as EAGLE3_STREAM_ADDR)"
            )
        if not data.dataset:
            raise BadInput("data.dataset is required")
        if not cfg.target.path:
            raise BadInput("target.path is required (its lm_head is the teacher)")
        self.dump_dir, self.dataset = Path(data.dump or "."), Path(data.dataset)
        if not self.dataset.exists():
            raise BadInput(f"{self.dataset}: no such dataset")
        index = DatasetIndex.open(self.dataset)
        self.max_tokens = data.max_tokens
        if data.long_samples == "alone":
            self.max_len = data.max_len or (1 << 62)
        else:
            self.max_len = min(data.max_len or data.max_tokens, data.max_tokens)
        self.seed, self.world = cfg.train.seed, world
        self.pack_window = max(1, data.pack_window)
        samples = []
        for sid in sorted(index.ids()):
            n = index.length(sid)
            if not is_holdout(sid, data.holdout_fraction) and n >= 3:
                samples.append((sid, min(n, self.max_len)))
        if not samples:
            raise BadInput(f"{self.dataset}: no usable samples")
        self.samples = samples
        self._batches: dict[int, list[list[int]]] = {}
        self._lock = threading.Lock()
        self.total_tokens = sum(n for _, n in samples)
        self.long_count = sum(n > data.max_tokens for _, n in samples)
        self.not_dumped = 0
        self.out_dir = Path(cfg.train.out_dir)
        target = Path(cfg.target.path)
        self.rank = rank
        self.fetcher = OnlineFetcher(
            on,
            template.replace("{k}", str(rank)),
            expected_meta(target, cfg.drafter.aux_layer_ids),
            model_identity(target),
            index,
            route=f"@{rank}/" if "{k}" in template else "",
        )
        try:
            self.meta = self.fetcher.probe(self.samples[self.epoch_batches(0)[rank][0]][0])
            if on.cache_gb > 0:
                root = Path(on.cache_dir or Path(cfg.train.out_dir) / "stream-cache")
                self.fetcher.cache = RingCache(root, int(on.cache_gb * 1e9), self.meta)
        except BaseException:
            self.fetcher.close()
            raise

    def describe(self) -> str:
        on = self.fetcher.opts
        return (
            f"online from {self.fetcher.http.url} via {self.fetcher.listener.addr}: "
            f"{on.window} samples ahead, shuffle global (seed {self.seed}), "
            + (f"cache ring {on.cache_gb:g} GB" if self.fetcher.cache else "no disk cache")
        )


class OnlineLoader(Loader):
    """data.Loader reading from the stream (plan.fetcher) instead of a dump."""

    def __init__(self, plan: OnlinePlan, rank: int, start_epoch: int, start_step: int, epochs: int,
                 prefetch: int = 4, pin: bool = False, **host: Any) -> None:  # fmt: skip
        """host: data.Loader's embed / embed_pad (train.embed_on_host), as offline."""
        plan.fetcher.start(_order(plan, rank, start_epoch, start_step, epochs))
        print(plan.describe(), flush=True)
        super().__init__(plan, rank, start_epoch, start_step, epochs, prefetch, pin, **host)

    def _open_reader(self):
        return self.plan.fetcher  # type: ignore[attr-defined]

    def close(self) -> None:
        super().close()
        fetcher = self.plan.fetcher  # type: ignore[attr-defined]
        fetcher.close()
        stats = {
            **fetcher.stats,
            "listener": fetcher.listener.stats,
            "reforwards": fetcher.reforwards.to_json() if fetcher.opts.compare_reforwards else None,
        }
        if fetcher.cache is not None:
            stats["cache_bytes_written"] = fetcher.cache.bytes_written
        self.stats = stats
        out = self.plan.out_dir  # type: ignore[attr-defined]
        out.mkdir(parents=True, exist_ok=True)
        (out / "online-stats.json").write_text(json.dumps(stats, indent=1) + "\n")
