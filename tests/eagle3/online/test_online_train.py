"""`eagle3 train --online` against the HF reference producer (real sockets, real trainer):
on the same samples in the same order it equals offline training from the dump, bit for bit;
a producer serving another model is refused; the disk cache feeds later epochs."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from remote_agent.eagle3.drafter.train import config as config_mod  # noqa: E402
from remote_agent.eagle3.drafter.train.loop import train  # noqa: E402
from remote_agent.eagle3.errors import BadInput  # noqa: E402
from remote_agent.eagle3.online import compare  # noqa: E402
from remote_agent.eagle3.online.producer import ReferenceProducer  # noqa: E402


def sock_addr() -> str:
    return f"unix:/tmp/e3t-{os.getpid()}-{random.randrange(1 << 30)}.sock"


@pytest.fixture(scope="module")
def offline(inputs, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("offline") / "run"
    cfg = compare.config(inputs["target"], inputs["data"], run, inputs["dump"])
    train(config_mod.from_dict(cfg))
    return run


def online_run(inputs, run: Path, producer: ReferenceProducer, addr: str, **online):
    cfg = compare.config(
        inputs["target"], inputs["data"], run,
        online={"server": producer.url, "listen": addr, **online},
    )  # fmt: skip
    return train(config_mod.from_dict(cfg))


def test_online_equals_offline_bit_for_bit(inputs, offline, tmp_path):
    addr = sock_addr()
    with ReferenceProducer(inputs["target"], addr) as producer:
        result = online_run(inputs, tmp_path / "run", producer, addr, compare_reforwards=True)
        assert producer.sender.stats["overflow"] == 0
    assert result["steps"] > 0
    assert compare.losses(tmp_path / "run") == compare.losses(offline)
    diff = compare.max_abs_diff(
        compare.final_weights(tmp_path / "run"), compare.final_weights(offline)
    )
    assert diff == 0.0
    stats = json.loads((tmp_path / "run" / "online-stats.json").read_text())
    assert stats["retries"] == 0 and stats["duplicates"] == 0
    again = stats["reforwards"]  # epoch 2 asked for every sample again: the same rows came
    assert again["samples_streamed_again"] > 0
    assert again["rows_identical_to_first"] == again["samples_streamed_again"]
    assert again["rows_differing"] == 0


class ReforwardingProducer(ReferenceProducer):
    """A producer whose second forward of a sample is one bf16 step off its first, as a real
    server's is when it batches the sample differently (SGLang 0.5.14 on the H100, 2026-12-07)."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.seen: set[tuple[int, ...]] = set()

    def states(self, input_ids):
        ids, aux, final = super().states(input_ids)
        key = tuple(input_ids)
        if key in self.seen:
            aux = aux.clone()
            aux[0, 0] += aux[0, 0].abs().clamp_min(1e-3) * 2**-7  # at least one bf16 step up
        self.seen.add(key)
        return ids, aux, final


def test_a_producer_that_reforwards_differently_parts_from_offline_at_epoch_2(
    inputs, offline, tmp_path
):
    """Equal through epoch 1 (the same rows), apart from epoch 2's first step on, and the
    stream says why: every sample asked again came back with other rows. With the cache the
    second epoch reads the first forward's rows and equals offline again."""
    addr = sock_addr()
    with ReforwardingProducer(inputs["target"], addr) as producer:
        online_run(inputs, tmp_path / "run", producer, addr, compare_reforwards=True)
    first = compare.first_difference(compare.losses(tmp_path / "run"), compare.losses(offline))
    assert first is not None
    where = compare.locate(offline, first["step"])
    assert where == {"epoch": 1, "first_step_of_epoch": True}, (first, where)
    again = json.loads((tmp_path / "run" / "online-stats.json").read_text())["reforwards"]
    assert again["samples_streamed_again"] > 0
    assert again["rows_differing"] == again["samples_streamed_again"]
    assert again["rows_identical_to_first"] == 0

    addr = sock_addr()
    with ReforwardingProducer(inputs["target"], addr) as producer:
        online_run(inputs, tmp_path / "cached", producer, addr, cache_gb=1.0)
    assert compare.losses(tmp_path / "cached") == compare.losses(offline)


def test_disk_cache_feeds_the_second_epoch(inputs, offline, tmp_path):
    addr = sock_addr()
    with ReferenceProducer(inputs["target"], addr) as producer:
        online_run(inputs, tmp_path / "run", producer, addr, cache_gb=1.0)
        forwards = producer.forwards
    n = len(inputs["data"].read_text().splitlines())
    assert forwards <= n + 1  # epoch 2 came from the cache (+1: the start-up probe)
    assert compare.losses(tmp_path / "run") == compare.losses(offline)
    cache = tmp_path / "run" / "stream-cache"
    assert len(list(cache.glob("*.safetensors"))) == n
    stats = json.loads((tmp_path / "run" / "online-stats.json").read_text())
    assert stats["reforwards"] is None  # not asked for: no row is hashed


def test_cache_ring_stays_within_its_size(inputs, tmp_path):
    from remote_agent.eagle3.dense import DumpMeta
    from remote_agent.eagle3.online.source import RingCache

    ring = RingCache(tmp_path / "ring", 40_000, DumpMeta("m", 16, 8, [2, 4, 5]))
    for i in range(30):
        ring.put(f"s{i}", {"input_ids": torch.arange(50, dtype=torch.int32),
                           "aux": torch.zeros(50, 48, dtype=torch.bfloat16),
                           "final": torch.zeros(50, 16, dtype=torch.bfloat16)})  # fmt: skip
        on_disk = sum(f.stat().st_size for f in (tmp_path / "ring").glob("*.safetensors"))
        assert on_disk <= 40_000 and on_disk == ring.bytes
    assert "s29" in ring and "s0" not in ring and ring.get("s0") is None
    assert ring.get("s29")["aux"].shape == (50, 48)


def test_a_producer_of_another_model_is_refused(inputs, tmp_path, tally):
    """The target's weights differ from the producer's (another seed of the tiny preset): the
    trainer stops at the HELLO with the reason, before any step."""
    from remote_agent.eagle3.tiny.cache import ensure_tiny

    other = ensure_tiny("ci", seed=1)
    addr = sock_addr()
    with (
        ReferenceProducer(other, addr) as producer,
        pytest.raises(BadInput, match="refused the producer.*weights_sha256") as err,
    ):
        online_run(inputs, tmp_path / "run", producer, addr, producer_wait_s=60)
    held = not (tmp_path / "run" / "checkpoints").exists()
    assert tally.trial("online train: producer of another model refused", held), err.value
