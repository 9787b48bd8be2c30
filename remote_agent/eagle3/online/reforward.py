"""Does the producer give a sample the same rows each time it is asked for it?

Online, every epoch asks the server for every sample again, and a second forward of the same
tokens is not bound to repeat the first bit for bit: the server batches it with other requests,
and its kernels' reductions depend on the batch (SGLang 0.5.14 on the H100 of 2026-12-07: online
and offline losses equal for all 33 steps of epoch 1, apart from the first step of epoch 2 on).
Offline training reads one forward's rows every epoch. This tracker keeps a digest of the rows
each sample first arrived with and counts, among samples that arrived again, those whose rows
were identical: the figure that says whether a difference to offline training is the stream's
(never, within an epoch) or the producer's re-forward. It hashes every row the trainer receives
(blake2b, ~0.6 GB/s on one core), so it runs only when asked (online.compare_reforwards, as
bench_online.py does). The online cache (online.cache_gb) makes later epochs read the first
forward's rows."""

from __future__ import annotations

import hashlib
from typing import Any

import torch

EXAMPLES = 3


def rows_digest(sample: dict[str, Any]) -> bytes:
    """blake2b of every tensor's bytes, in key order (dtype and shape included)."""
    h = hashlib.blake2b(digest_size=16)
    for key in sorted(sample):
        t = sample[key]
        if not hasattr(t, "detach"):  # a plain value beside the tensors: its repr
            h.update(f"{key}={t!r};".encode())
            continue
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.digest()


class Reforwards:
    def __init__(self) -> None:
        self._first: dict[str, bytes] = {}
        self.again = 0
        self.identical = 0
        self.differing: list[str] = []

    def see(self, sid: str, digest: bytes) -> None:
        """`digest`: rows_digest of the rows `sid` arrived with this time."""
        first = self._first.get(sid)
        if first is None:  # its first arrival
            self._first[sid] = digest
            return
        self.again += 1
        if first == digest:
            self.identical += 1
        else:
            self.differing.append(sid)

    def to_json(self) -> dict[str, Any]:
        return {
            "samples_streamed_again": self.again,
            "rows_identical_to_first": self.identical,
            "rows_differing": len(self.differing),
            "differing_examples": self.differing[:EXAMPLES],
        }
