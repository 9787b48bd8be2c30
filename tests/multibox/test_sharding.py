"""Sharded extraction on the tiny DeepseekV3 (CPU, the real HF reference extractor): shards
partition the dataset by the id hash, their union equals an unsharded dump sample for sample,
verify-dumps checks the union (a missing shard, a lost file, a duplicate are located errors),
and re-running a lost shard dumps exactly its missing samples."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from eagle3_standins import write_dataset  # noqa: E402

from remote_agent.eagle3.cli import main  # noqa: E402
from remote_agent.eagle3.dense import DumpReader  # noqa: E402
from remote_agent.eagle3.errors import BadInput  # noqa: E402
from remote_agent.eagle3.extraction.sharding import Shard, parse_shard, shard_of  # noqa: E402

LENGTHS = [17, 5, 33, 9, 24, 41, 12, 8, 19, 27, 6, 14]


def extract(model, data, out, *extra) -> int:
    return main(
        [
            "extract", "--backend", "hf", "--model", str(model), "--dataset", str(data),
            "--out", str(out), "--disk-margin-gb", "0", "--min-free-gb", "0",
            "--progress-interval", "0", "--shard-mb", "0.01", *map(str, extra),
        ]
    )  # fmt: skip


def verify(root, data, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["verify-dumps", str(root), "--dataset", str(data)])
    return code, capsys.readouterr().out


def test_assignment_is_a_partition_by_id_alone():
    ids = [f"conv-{i}" for i in range(4000)]
    for n in (1, 2, 3, 8):
        owners = [shard_of(s, n) for s in ids]
        assert owners == [shard_of(s, n) for s in ids]  # deterministic (not Python's hash)
        counts = Counter(owners)
        assert set(counts) == set(range(n))
        assert (
            max(counts.values()) - min(counts.values()) < 0.25 * len(ids) / n
        )  # about 4 binomial sigmas
    # several servers under a host shard: their parts partition exactly that shard
    for n, k_count in ((2, 2), (3, 2), (2, 4)):
        for i in range(n):
            host = Shard(i, n)
            parts = [host.split(k, k_count) for k in range(k_count)]
            split = [{s for s in ids if p.owns(s)} for p in parts]
            assert all(split) and sum(map(len, split)) == len(set().union(*split))
            assert set().union(*split) == {s for s in ids if host.owns(s)}
    assert [Shard(1, 2).split(k, 2) for k in range(2)] == [Shard(1, 4), Shard(3, 4)]
    for bad in ("2/2", "x", "1/0", "-1/2"):
        with pytest.raises(BadInput):
            parse_shard(bad)


def test_two_shards_union_equals_one_dump(tiny_target, tmp_path, capsys):
    data = write_dataset(tmp_path / "merged.jsonl", LENGTHS)
    whole, root = tmp_path / "whole", tmp_path / "sharded"
    assert extract(tiny_target, data, whole) == 0
    for i in range(2):
        assert extract(tiny_target, data, root, "--shard", f"{i}/2") == 0
    parts = [DumpReader(root / f"shard-{i:02d}-of-02") for i in range(2)]
    for i, r in enumerate(parts):
        assert r.ids() and all(shard_of(s, 2) == i for s in r.ids())
    union, ref = DumpReader(root), DumpReader(whole)
    assert sorted(union.ids()) == sorted(ref.ids()) and not union.duplicates
    for sid in ref.ids():  # the same states, whichever shard dumped them
        assert torch.equal(union.input_ids(sid), ref.input_ids(sid))
        a, b = union.get(sid), ref.get(sid)
        # a shard batches each sample beside other samples (other padded shapes, so other
        # fp32 GEMM blockings on some CPUs: 1.9e-6 seen on one), so equal to rounding: the
        # fp32 final state to 1e-5, the bf16 aux rows to one bf16 step (another sample's
        # states, or shifted rows, differ by far more)
        torch.testing.assert_close(a["final"], b["final"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a["aux"].float(), b["aux"].float(), rtol=8e-3, atol=8e-3)
    code, out = verify(root, data, capsys)
    assert code == 0 and out.startswith(f"OK: {len(LENGTHS)} samples"), out


def test_lost_shard_is_located_and_resumed_exactly(tiny_target, tmp_path, capsys):
    data = write_dataset(tmp_path / "merged.jsonl", LENGTHS)
    root = tmp_path / "sharded"
    assert extract(tiny_target, data, root, "--shard", "0/2") == 0
    # shard 1 never ran: every one of its samples is missing, and the line says how to fix it
    code, out = verify(root, data, capsys)
    owed = sorted(s for s in DumpReader(data.parent / "sharded").ids())
    n1 = sum(1 for i in range(len(LENGTHS)) if shard_of(f"s{i:04d}", 2) == 1)
    assert code == 1
    assert f"shard-01-of-02 (no dump: that shard never ran): {n1} sample(s) missing" in out
    assert "--shard 1/2" in out
    assert extract(tiny_target, data, root, "--shard", "1/2") == 0
    # the box of shard 1 loses one of its files: exactly those samples are re-dumped
    part = root / "shard-01-of-02"
    files = sorted((part / "shards").glob("r*.safetensors"))
    lost = {e[0] for e in DumpReader.shard_index(files[0])}
    files[0].unlink()
    code, out = verify(root, data, capsys)
    assert code == 1 and f"{part}: {len(lost)} sample(s) missing" in out, out
    before = {p.name: p.stat().st_mtime_ns for p in (root / "shard-00-of-02/shards").iterdir()}
    assert extract(tiny_target, data, root, "--shard", "1/2") == 0
    after = {p.name: p.stat().st_mtime_ns for p in (root / "shard-00-of-02/shards").iterdir()}
    assert before == after  # the other shard untouched
    new = sorted(set((part / "shards").glob("r*.safetensors")) - set(files))
    redumped = {e[0] for f in new for e in DumpReader.shard_index(f)}
    assert redumped == lost  # exactly its missing samples, no more
    code, out = verify(root, data, capsys)
    assert code == 0, out
    assert owed  # shard 0 dumped something


def test_duplicate_across_shards_and_wrong_count_are_refused(tiny_target, tmp_path, capsys):
    data = write_dataset(tmp_path / "merged.jsonl", LENGTHS)
    root = tmp_path / "sharded"
    for i in range(2):
        assert extract(tiny_target, data, root, "--shard", f"{i}/2") == 0
    src = sorted((root / "shard-00-of-02/shards").glob("r*.safetensors"))[0]
    copy = root / "shard-01-of-02/shards" / ("r900-" + src.name.split("-", 1)[1])
    shutil.copy(src, copy)
    sid = DumpReader.shard_index(src)[0][0]
    code, out = verify(root, data, capsys)
    assert code == 1
    assert f"{copy}: sample {sid!r} again (first in {src})" in out, out
    assert "owned by another shard" in out
    copy.unlink()
    assert verify(root, data, capsys)[0] == 0
    # resuming with another count would re-assign samples: refused, naming the count to use
    capsys.readouterr()
    assert extract(tiny_target, data, root, "--shard", "0/3") == 2
    assert "already split into 2 shards" in capsys.readouterr().err
