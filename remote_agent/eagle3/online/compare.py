"""Online vs offline on the same samples (bench/bench_online.py and tests/eagle3/online):
a dataset, the offline reference dump of it (one sample per forward), the training config for
either mode, and the comparison of two runs' losses and final weights."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_dataset(path: Path, lengths: list[int], vocab: int, seed: int = 0) -> Path:
    """A merged-dataset JSONL + manifest of random token ids (loss on the second half)."""
    rng = random.Random(seed)
    records = []
    for i, n in enumerate(lengths):
        ids = [rng.randrange(11, vocab) for _ in range(n)]
        mask = [0] * (n // 2) + [1] * (n - n // 2)
        records.append({"id": f"s{i:05d}", "source": "bench", "input_ids": ids, "loss_mask": mask})
    return write_records(path, records)


def write_records(path: Path, records: list[dict[str, Any]]) -> Path:
    """Records (id, source, input_ids, loss_mask, ...) as a merged-dataset JSONL + manifest."""
    lines = [json.dumps(rec, separators=(",", ":")) for rec in records]
    data = ("\n".join(lines) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    manifest = {
        "format": "eagle3-merged",
        "version": 1,
        "file": path.name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "records": len(records),
        "tokens": sum(len(r["input_ids"]) for r in records),
    }
    path.with_name(path.name.removesuffix(".jsonl") + ".manifest.json").write_text(
        json.dumps(manifest)
    )
    return path


def offline_dump(model: Path, dataset: Path, out: Path, device: str = "cpu") -> dict[str, Any]:
    """The offline reference dump, one sample per forward (what the reference producer does)."""
    from remote_agent.eagle3.extraction.reference import ReferenceOptions, run_reference

    opts = ReferenceOptions(
        model, dataset, out, max_batch=1, device=device, min_free_gb=0, disk_margin_gb=0,
        progress_interval=1e9,
    )  # fmt: skip
    return run_reference(opts)


def config(
    target: Path, dataset: Path, out_dir: Path, dump: Path | None = None, **sections: dict
) -> dict[str, Any]:
    """A small training config; `online.server` set = online, `dump` = offline."""
    cfg: dict[str, Any] = {
        "target": {"path": str(target)},
        "data": {
            "dump": str(dump or ""),
            "dataset": str(dataset),
            "max_tokens": 256,
            "prefetch": 2,
        },
        "drafter": {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128},
        "train": {
            "out_dir": str(out_dir),
            "epochs": 2,
            "lr": 1e-3,
            "log_every": 1,
            "save_every": 0,
            "ttt_steps": 3,
            "device": "cpu",
            "seed": 3,
        },
    }
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return cfg


def losses(run_dir: Path) -> list[float]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line)["loss"] for line in path.read_text().splitlines() if line.strip()]


def first_difference(a: list[float], b: list[float]) -> dict[str, Any] | None:
    """The first logged step at which two runs' losses differ (1-based line of metrics.jsonl,
    log_every 1: the step), with both values; None when equal. Step 1 apart means the inputs
    or the kernels differ from the start; a later step, a difference that grew."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return {"step": i + 1, "a": x, "b": y, "of": min(len(a), len(b))}
    if len(a) != len(b):
        return {"step": min(len(a), len(b)) + 1, "a": None, "b": None, "of": max(len(a), len(b))}
    return None


def locate(run_dir: Path, step: int) -> dict[str, Any]:
    """Where logged step `step` (1-based, log_every 1) fell: its epoch (0-based) and whether it
    was its epoch's first step. Online, an epoch's first step is the first fed by the
    producer's second forward of a sample (reforward.py)."""
    path = Path(run_dir) / "metrics.jsonl"
    epochs = [json.loads(line)["epoch"] for line in path.read_text().splitlines() if line.strip()]
    if not 1 <= step <= len(epochs):
        return {"epoch": None, "first_step_of_epoch": None}
    return {
        "epoch": epochs[step - 1],
        "first_step_of_epoch": step == 1 or epochs[step - 2] != epochs[step - 1],
    }


# A later epoch's losses may drift from offline by the rounding a re-forward brings (2e-6 of the
# loss on the H100 of 2026-12-07); a wrong sample or order moves a tiny drafter's loss by
# percents. Between the two, with a wide margin both ways:
LATER_EPOCH_REL_TOL = 1e-3


def equal_on_first_forwards(
    online: list[float], offline: list[float], where: dict[str, Any] | None, reforwards: dict
) -> bool:
    """Online equals offline wherever both trained on the same forwards: every loss of the
    first epoch bit-equal, the first difference opening a later epoch, the stream showing that
    samples asked again came back with other rows (reforward.py), and no later loss more than
    LATER_EPOCH_REL_TOL apart. `where`: first_difference + locate of its step (None: equal)."""
    if len(online) != len(offline):
        return False
    if where is None:
        return True
    if not where.get("first_step_of_epoch") or (where.get("epoch") or 0) < 1:
        return False
    if not reforwards.get("rows_differing"):
        return False
    return all(
        abs(a - b) <= LATER_EPOCH_REL_TOL * abs(b) for a, b in zip(online, offline, strict=True)
    )


def final_weights(run_dir: Path) -> dict[str, Any]:
    from remote_agent.eagle3.drafter.train import checkpoint as ckpt

    latest = ckpt.latest(Path(run_dir) / "checkpoints")
    if latest is None:
        raise FileNotFoundError(f"{run_dir}: no checkpoint")
    return ckpt.load(latest)["model"]


def max_abs_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    if set(a) != set(b):
        raise ValueError(f"different tensors: {sorted(set(a) ^ set(b))}")
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


# ---- the same forwards, dumped and streamed (a server in EAGLE3_DUMP_MODE=both) ----
#
# A real SGLang's rows for a sample can depend on the batch it shared (kernels chosen by batch
# size), so training offline from an earlier extraction is not training on the bytes the stream
# carried. A server in mode `both` writes every streamed sample to its dump as well: the bench
# renames the samples it trains on (a fresh id prefix: the server's dump has the originals
# already, and would skip them as duplicates), streams them to the online trainer, then takes
# the shards the server wrote for them as the offline dump. Same forwards, so online training
# must equal offline training bit for bit.


def renamed_subset(dataset: Path, out: Path, n: int, prefix: str) -> dict[str, str]:
    """The first `n` records of `dataset` under ids `prefix + id`, written to `out` (JSONL +
    manifest); returns {new id: original id}."""
    records: list[dict[str, Any]] = []
    with open(dataset, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                records.append(json.loads(line))
            if len(records) >= n:
                break
    names = {}
    for rec in records:
        names[prefix + str(rec["id"])] = str(rec["id"])
        rec["id"] = prefix + str(rec["id"])
    write_records(out, records)
    return names


def flush_dump(url: str, rid_prefix: str, token: int) -> None:
    """Ask the hook to seal what it buffers now (a control request, as the extract client's)."""
    import uuid

    from remote_agent.eagle3.extraction.client import FLUSH, generate_body
    from remote_agent.eagle3.http_client import HttpClient

    rid = rid_prefix + FLUSH + uuid.uuid4().hex[:12]
    HttpClient(url, 120).post("/generate", generate_body(rid, [token]))


def settle(dump: Path, quiet_s: float = 1.0, timeout_s: float = 30.0) -> None:
    """Wait until the shards of `dump` stop changing for quiet_s (after a flush_dump: the
    server's writer seals its buffer on its own thread, a moment after the request returns)."""
    import time

    def names() -> set[str]:
        return (
            {p.name for p in (dump / "shards").glob("*")} if (dump / "shards").is_dir() else set()
        )

    end = time.monotonic() + timeout_s
    last, since = names(), time.monotonic()
    while time.monotonic() < end:
        time.sleep(0.2)
        now = names()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return


def wait_dumped(dump: Path, ids: set[str], timeout_s: float) -> set[str]:
    """Wait until every id is in a sealed shard of `dump`; returns those still missing."""
    import time

    from remote_agent.eagle3.dense import DumpReader

    reader = DumpReader(dump)
    end = time.monotonic() + timeout_s
    while True:
        missing = ids - set(reader.ids())
        if not missing or time.monotonic() > end:
            return missing
        time.sleep(0.5)
        reader.refresh()


def take_shards(dump: Path, dest: Path, owned: Callable[[str], object]) -> list[str]:
    """Move every shard of `dump` whose samples all satisfy `owned(id)` into `dest` (a dump of
    its own: meta.json copied), leaving `dump` as it was before they were written. A shard that
    mixes owned and other samples is refused (it would take the others along). Returns the ids
    moved."""
    import shutil

    from remote_agent.eagle3.dense import DumpReader

    moved: list[str] = []
    if not (dump / "meta.json").is_file():  # nothing dumped there yet
        return moved
    (dest / "shards").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(dump / "meta.json", dest / "meta.json")
    for shard in sorted((dump / "shards").glob("r*.safetensors")):
        if ".tmp." in shard.name:
            continue
        ids = [str(e[0]) for e in DumpReader.shard_index(shard)]
        mine = [owned(i) for i in ids]
        if not any(mine):
            continue
        if not all(mine):
            raise RuntimeError(f"{shard}: mixes the bench's samples with others; not moved")
        target = dest / "shards" / shard.name
        while target.exists():  # a shard of an earlier attempt with the same name
            target = target.with_name("x" + target.name)
        shutil.move(str(shard), str(target))
        moved += ids
    return moved


def rows_diff(a: Path, b: Path, pairs: dict[str, str]) -> dict[str, Any]:
    """Rows of the same samples in two dumps (`pairs`: id in a -> id in b): how many are bit
    identical, and the largest difference per tensor (what the server's batching changed)."""
    import torch

    from remote_agent.eagle3.dense import DumpReader

    ra, rb = DumpReader(a), DumpReader(b)
    out: dict[str, Any] = {"samples": 0, "bit_exact": 0, "max_abs_diff": {}}
    for ia, ib in pairs.items():
        if ia not in ra or ib not in rb:
            continue
        x, y = ra.get(ia), rb.get(ib)
        same = True
        for key in ("input_ids", "aux", "final"):
            if x[key].shape != y[key].shape:
                raise ValueError(f"{ia} vs {ib}: {key} shapes {x[key].shape} != {y[key].shape}")
            same = same and torch.equal(x[key], y[key])
            if key != "input_ids":
                d = float((x[key].float() - y[key].float()).abs().max())
                out["max_abs_diff"][key] = max(out["max_abs_diff"].get(key, 0.0), d)
        out["samples"] += 1
        out["bit_exact"] += int(same)
    return out
