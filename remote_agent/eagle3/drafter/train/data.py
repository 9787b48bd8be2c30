"""Training data: dump samples joined with dataset records, packed by token budget, prefetched.

* The plan (which samples exist, their lengths, batch composition) comes from the dump's shard
  headers and the dataset's index alone, so the first step starts within seconds whatever the
  dataset size. Dump ids missing from the dataset, or a length mismatch, are errors up front.
* Every epoch has a deterministic order (seed, epoch) and a deterministic packing (first fit
  within a look-ahead window); global batch i goes to rank i % world. A position is
  (epoch, step_in_epoch): resuming rebuilds the same batches and skips to it.
* A background thread reads samples (mmap'd safetensors slices), checks that the dump's
  input_ids equal the dataset's (an error, not a warning), assembles packed tensors and pins
  them; the training loop measures how long it waits for the next batch.

Alignment inside a packed document (t = position of the draft query, k = TTT step):
    input token   x[t+1+k]        teacher   final[t+1+k] -> distribution of x[t+2+k]
    weight        loss_mask[t+2+k] and t+2+k inside the same document
"""

from __future__ import annotations

import hashlib
import queue
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from remote_agent.eagle3.errors import BadInput, Failed


def conversation_id(sample_id: str) -> str:
    """`conv#k` (one sample per turn, written by `eagle3 tokenize`) -> `conv`."""
    base, sep, k = sample_id.rpartition("#")
    return base if sep and base and k.isdigit() else sample_id


def is_holdout(sample_id: str, fraction: float) -> bool:
    """Stable split by the conversation's id hash (independent of order, seed and world size):
    all samples of one conversation land on the same side."""
    if fraction <= 0:
        return False
    h = int.from_bytes(hashlib.sha256(conversation_id(sample_id).encode()).digest()[:8], "big")
    return (h % 1_000_000) < fraction * 1_000_000


def load_vocab(path: Path | None, target_vocab: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(d2t int64 [Vd], t2d bool [V], metadata) checked against the CONTRACTS.md mapping."""
    if path is None:
        return (
            torch.zeros(target_vocab, dtype=torch.long),
            torch.ones(target_vocab, dtype=torch.bool),
            {"draft_vocab": str(target_vocab), "target_vocab": str(target_vocab)},
        )
    from safetensors import safe_open

    path = Path(path)
    if not path.exists():
        raise BadInput(
            f"{path}: no such vocab mapping (run `eagle3 vocab` or set data.vocab: null)"
        )
    with safe_open(str(path), framework="pt") as h:
        keys = set(h.keys())
        if not {"d2t", "t2d"} <= keys:
            raise BadInput(f"{path}: needs tensors d2t and t2d, has {sorted(keys)}")
        d2t, t2d, meta = h.get_tensor("d2t").long(), h.get_tensor("t2d").bool(), h.metadata() or {}
    if t2d.numel() != target_vocab:
        raise BadInput(
            f"{path}: t2d has {t2d.numel()} entries, the target vocabulary {target_vocab}"
        )
    target_ids = torch.arange(d2t.numel()) + d2t
    if d2t.numel() and (
        target_ids.min() < 0 or target_ids.max() >= target_vocab or (target_ids.diff() <= 0).any()
    ):
        raise BadInput(f"{path}: d2t does not map draft ids to ascending target ids in range")
    if int(t2d.sum()) != d2t.numel() or not bool(t2d[target_ids].all()):
        raise BadInput(f"{path}: t2d and d2t disagree (t2d marks {int(t2d.sum())} ids)")
    return d2t, t2d, meta


@dataclass
class Batch:
    input_ids: torch.Tensor  # [1, L] long
    aux: torch.Tensor  # [1, L, K*H] bf16
    final: torch.Tensor  # [1, L, H] bf16
    loss_mask: torch.Tensor  # [1, L] bool
    doc: torch.Tensor  # [1, L] int32, document id per position (padding = its own doc)
    positions: torch.Tensor  # [1, L] long, position within the document
    tokens: int  # real (non-padding) tokens
    sample_ids: list[str]
    sources: list[str] | None = None  # each document's record source (per-source metrics)
    # [1, L + pad, H]: the frozen embedding's rows of step_tokens(input_ids, pad), gathered by
    # the loader on the host (model.StepInputs); None = looked up on the device
    embeds: torch.Tensor | None = None

    def to(self, device, non_blocking: bool = True) -> Batch:
        move = {
            k: getattr(self, k).to(device, non_blocking=non_blocking)
            for k in ("input_ids", "aux", "final", "loss_mask", "doc", "positions")
        }
        embeds = None if self.embeds is None else self.embeds.to(device, non_blocking=non_blocking)
        return Batch(
            **move, tokens=self.tokens, sample_ids=self.sample_ids, sources=self.sources,
            embeds=embeds,
        )  # fmt: skip


def step_tokens(input_ids: torch.Tensor, pad: int) -> torch.Tensor:
    """[B, L + pad]: the ids, then token 0 `pad` times. TTT step k at position t reads token
    t+1+k of this (step_targets pads the ids past the end with 0 the same way), so one
    embedding lookup of it serves every step (model.StepInputs)."""
    return torch.nn.functional.pad(input_ids, (0, pad))


def embed_rows(table: torch.Tensor, input_ids: torch.Tensor, pad: int, pin: bool = False):
    """The rows of a (host) embedding table for step_tokens(input_ids, pad): [1, L + pad, H]."""
    rows = table.index_select(0, step_tokens(input_ids, pad).flatten()).unsqueeze(0)
    return rows.pin_memory() if pin else rows


def first_fit(lengths: list[int], max_tokens: int, window: int) -> list[list[int]]:
    """Indices into `lengths`, packed first fit in the given order; at most `window` bins stay
    open (the oldest is closed first), so packing streams over a large dataset."""
    batches: list[list[int]] = []
    open_bins: list[tuple[int, list[int]]] = []  # (free tokens, members)
    for idx, n in enumerate(lengths):
        for j, (free, members) in enumerate(open_bins):
            if n <= free:
                members.append(idx)
                open_bins[j] = (free - n, members)
                break
        else:
            open_bins.append((max_tokens - n, [idx]))
        if len(open_bins) > window:
            batches.append(open_bins.pop(0)[1])
    batches.extend(members for _, members in open_bins)
    return batches


def packed_batch(parts, length: int, sample_ids: list[str], pin: bool = False) -> Batch:
    """Documents (ids, aux, final, loss_mask) laid out one after another in `length` positions;
    the padding after them is one more document."""
    kh, h = parts[0][1].shape[1], parts[0][2].shape[1]
    ids = torch.zeros(length, dtype=torch.long)
    aux = torch.zeros(length, kh, dtype=torch.bfloat16)
    final = torch.zeros(length, h, dtype=torch.bfloat16)
    mask = torch.zeros(length, dtype=torch.bool)
    doc = torch.full((length,), len(parts), dtype=torch.int32)
    pos = torch.zeros(length, dtype=torch.long)
    at = 0
    for d, (p_ids, p_aux, p_final, p_mask) in enumerate(parts):
        n = p_ids.numel()
        ids[at : at + n] = p_ids
        aux[at : at + n] = p_aux.to(torch.bfloat16)
        final[at : at + n] = p_final.to(torch.bfloat16)
        mask[at : at + n] = p_mask
        doc[at : at + n] = d
        pos[at : at + n] = torch.arange(n)
        at += n
    pos[at:] = torch.arange(length - at)
    tensors = [ids, aux, final, mask, doc, pos]
    if pin:
        tensors = [t.pin_memory() for t in tensors]
    ids, aux, final, mask, doc, pos = (t.unsqueeze(0) for t in tensors)
    return Batch(ids, aux, final, mask, doc, pos, at, sample_ids)


class Plan:
    """Samples usable for training and the deterministic batches of every epoch."""

    def __init__(
        self,
        dump_dir: Path,
        dataset: Path,
        max_tokens: int,
        max_len: int | None = None,
        seed: int = 0,
        world: int = 1,
        pack_window: int = 64,
        holdout_fraction: float = 0.0,
        long_samples: str = "truncate",
    ) -> None:
        from remote_agent.eagle3.data.records import DatasetIndex
        from remote_agent.eagle3.dense import DumpReader

        self.dump_dir, self.dataset = Path(dump_dir), Path(dataset)
        if not self.dataset.exists():
            raise BadInput(f"{self.dataset}: no such dataset")
        reader = DumpReader(self.dump_dir)
        self.meta = reader.meta
        index = DatasetIndex.open(self.dataset)
        self.max_tokens = max_tokens
        # long_samples "alone": a sample longer than the budget is a batch of its own (first fit
        # opens it a bin with no room left), so short ones still pack to max_tokens
        if long_samples == "alone":
            self.max_len = max_len or (1 << 62)
        else:
            self.max_len = min(max_len or max_tokens, max_tokens)
        self.seed, self.world, self.pack_window = seed, world, max(1, pack_window)
        missing = [i for i in reader.ids() if i not in index.by_id]
        if missing:
            raise Failed(
                f"{self.dump_dir}: {len(missing)} dumped sample(s) are not in {self.dataset} "
                f"(first: {missing[0]!r}); was the dump made from another dataset?"
            )
        samples = []
        for sid in sorted(reader.ids()):
            n_dump, n_data = reader.index[sid].length, index.length(sid)
            if n_dump != n_data:
                raise Failed(
                    f"sample {sid!r}: {n_dump} tokens in the dump, {n_data} in {self.dataset}"
                )
            if is_holdout(sid, holdout_fraction):
                continue
            if n_dump >= 3:  # at least one (input, teacher, target) triple
                samples.append((sid, min(n_dump, self.max_len)))
        if not samples:
            raise BadInput(f"{self.dump_dir}: no usable samples (dumped and not held out)")
        self.samples = samples
        self._batches: dict[int, list[list[int]]] = {}
        self._lock = threading.Lock()
        self.total_tokens = sum(n for _, n in samples)
        self.long_count = sum(n > max_tokens for _, n in samples)
        self.not_dumped = len(index) - len(reader)

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """Packed batches (lists of sample indices) of one epoch, same on every rank."""
        with self._lock:  # the loader thread may already be packing the next epoch
            if epoch not in self._batches:
                if len(self._batches) >= 2:
                    self._batches.pop(min(self._batches))
                self._batches[epoch] = self._pack(epoch)
            return self._batches[epoch]

    def _pack(self, epoch: int) -> list[list[int]]:
        order = list(range(len(self.samples)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        lengths = [self.samples[i][1] for i in order]
        return [
            [order[j] for j in b] for b in first_fit(lengths, self.max_tokens, self.pack_window)
        ]

    def steps_per_epoch(self, epoch: int = 0) -> int:
        return len(self.epoch_batches(epoch)) // self.world


LONG_PAD = 2048  # a long sample's step is padded to a multiple of this (few distinct shapes)


def batch_length(max_tokens: int, parts) -> int:
    """Positions of a batch: the budget, or a long sample alone padded up to a multiple of
    min(LONG_PAD, budget), so compiled kernels (flex attention) meet a handful of shapes, not
    one per sample."""
    n = sum(p[0].numel() for p in parts)
    if n <= max_tokens:
        return max_tokens
    pad = min(LONG_PAD, max_tokens)
    return -(-n // pad) * pad


class Loader:
    """Iterates this rank's batches from `(epoch, step)` on, prepared by one background thread."""

    def __init__(
        self,
        plan: Plan,
        rank: int,
        start_epoch: int,
        start_step: int,
        epochs: int,
        prefetch: int = 4,
        pin: bool = False,
        embed: torch.Tensor | None = None,
        embed_pad: int = 0,
    ) -> None:
        self.plan, self.rank = plan, rank
        self.pin = pin
        # the frozen embedding kept on the host: each batch carries its rows (Batch.embeds)
        self.embed, self.embed_pad = embed, embed_pad
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._produce,
            args=(start_epoch, start_step, epochs),
            daemon=True,
            name="eagle3-loader",
        )
        self._thread.start()
        self.wait_s = 0.0

    def _produce(self, start_epoch: int, start_step: int, epochs: int) -> None:
        from remote_agent.eagle3.data.records import DatasetIndex

        try:
            reader = self._open_reader()
            index = DatasetIndex.open(self.plan.dataset)
            for epoch in range(start_epoch, epochs):
                batches = self.plan.epoch_batches(epoch)
                steps = len(batches) // self.plan.world
                for step in range(start_step if epoch == start_epoch else 0, steps):
                    members = batches[step * self.plan.world + self.rank]
                    batch = self._assemble(reader, index, members)
                    while not self._stop.is_set():
                        try:
                            self._queue.put((epoch, step, batch), timeout=0.2)
                            break
                        except queue.Full:
                            continue
                    if self._stop.is_set():
                        return
            self._queue.put(None)
        except BaseException as exc:  # surfaced in the training loop
            self._queue.put(exc)

    def _open_reader(self):
        """Where samples come from: the dump (online/source.py: the stream)."""
        from remote_agent.eagle3.dense import DumpReader

        return DumpReader(self.plan.dump_dir)

    def _assemble(self, reader, index, members: list[int]) -> Batch:
        plan = self.plan
        parts, sample_ids, sources = [], [], []
        for idx in members:
            sid, n = plan.samples[idx]
            rec = index.read(sid)
            got = reader.get(sid)
            dump_ids = got["input_ids"].long()
            want = torch.tensor(rec.input_ids, dtype=torch.long)
            if dump_ids.shape != want.shape or not torch.equal(dump_ids, want):
                diff = (
                    int((dump_ids != want).nonzero()[0])
                    if dump_ids.shape == want.shape
                    else min(len(dump_ids), len(want))
                )
                raise Failed(
                    f"sample {sid!r}: the dump's input_ids differ from {plan.dataset} at token {diff}"
                )
            mask = torch.tensor(rec.loss_mask[:n], dtype=torch.bool)
            parts.append((dump_ids[:n], got["aux"][:n], got["final"][:n], mask))
            sample_ids.append(sid)
            sources.append(rec.source)
        batch = packed_batch(parts, batch_length(plan.max_tokens, parts), sample_ids, self.pin)
        batch.sources = sources
        if self.embed is not None:
            batch.embeds = embed_rows(self.embed, batch.input_ids, self.embed_pad, self.pin)
        return batch

    def __iter__(self):
        return self

    def __next__(self) -> tuple[int, int, Batch]:
        t0 = time.perf_counter()
        item = self._queue.get()
        self.wait_s += time.perf_counter() - t0
        if item is None:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=5)


@dataclass
class StepTargets:
    """Per-TTT-step views over a packed batch (all [1, L])."""

    ids: list[torch.Tensor]  # input token of step k at each position
    weight: list[torch.Tensor]  # loss weight (bool -> float) of step k, before the t2d drop
    valid: list[torch.Tensor]  # t+2+k inside the same document


def step_targets(batch: Batch, steps: int) -> StepTargets:
    """Shift ids, loss masks and validity for every TTT step (see the module docstring)."""
    ids, doc, mask = batch.input_ids, batch.doc, batch.loss_mask
    n = ids.shape[1]
    real = torch.arange(n, device=ids.device).unsqueeze(0) < batch.tokens
    out = StepTargets([], [], [])
    for k in range(steps):
        x = torch.zeros_like(ids)
        x[:, : max(n - 1 - k, 0)] = ids[:, 1 + k :]
        valid = torch.zeros_like(mask)
        shift = 2 + k
        if shift < n:
            valid[:, : n - shift] = (doc[:, shift:] == doc[:, : n - shift]) & real[:, : n - shift]
        weight = torch.zeros_like(mask)
        if shift < n:
            weight[:, : n - shift] = mask[:, shift:]
        out.ids.append(x)
        out.valid.append(valid)
        out.weight.append(weight & valid)
    return out
