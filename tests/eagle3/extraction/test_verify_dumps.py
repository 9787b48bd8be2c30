"""`eagle3 verify-dumps` and the dense format's guarantees, on dumps built with ShardWriter."""

from __future__ import annotations

import errno
import json

import pytest

torch = pytest.importorskip("torch")

from eagle3_standins import write_dataset  # noqa: E402

from remote_agent.eagle3 import dense  # noqa: E402
from remote_agent.eagle3.cli import main  # noqa: E402
from remote_agent.eagle3.dense import DumpMeta, DumpReader, ShardWriter  # noqa: E402

H = 8
META = DumpMeta(model="m", hidden_size=H, num_layers=8, aux_layer_ids=[2, 4, 5])


def records(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def fill(writer, recs, poison: str | None = None, wrong_ids: str | None = None):
    for r in recs:
        ids = torch.tensor(r["input_ids"])
        if r["id"] == wrong_ids:
            ids = ids + 1
        t = len(ids)
        aux = torch.randn(t, 3 * H)
        if r["id"] == poison:
            aux[t // 2, 3] = float("nan")
        writer.add(r["id"], ids, aux, torch.randn(t, H))


def verify(capsys, dump, data) -> tuple[int, dict]:
    code = main(["verify-dumps", str(dump), "--dataset", str(data), "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out[out.index("{") :])


def test_a_good_dump_passes_and_reports_bytes_per_token(tmp_path, capsys):
    data = write_dataset(tmp_path / "d.jsonl", [5, 9, 3, 12])
    with ShardWriter(tmp_path / "dump", META, shard_bytes=600) as w:
        fill(w, records(data))
    code, rep = verify(capsys, tmp_path / "dump", data)
    assert code == 0 and rep["ok"] and rep["samples"] == 4 and rep["tokens"] == 29
    assert rep["shards"] > 1 and rep["meta_bytes_per_token"] == 3 * H * 2 + 2 * H + 4
    assert rep["bytes_per_token"] > rep["meta_bytes_per_token"]  # + headers
    assert rep["per_sample_format_bytes_per_token"] == 4 * H * 2


def test_every_kind_of_problem_is_found(tmp_path, capsys):
    data = write_dataset(tmp_path / "d.jsonl", [5, 9, 3, 12, 7, 4])
    recs = records(data)
    dump = tmp_path / "dump"
    with ShardWriter(dump, META) as w:  # s0000 missing; s0002 has NaN; s0003 wrong ids
        fill(w, recs[1:], poison="s0002", wrong_ids="s0003")
        w.add("stranger", torch.tensor([1, 2]), torch.zeros(2, 3 * H), torch.zeros(2, H))
    with ShardWriter(dump, META, rank=1) as w:  # s0001 twice
        fill(w, recs[1:2])
    dense.write_error_marker(dump, "s0000", "write failed: disk full", kind="io")
    code, rep = verify(capsys, dump, data)
    assert code == 1 and not rep["ok"]
    assert rep["missing_examples"] == ["s0000"] and rep["extra_examples"] == ["stranger"]
    assert rep["duplicates_examples"] == ["s0001"] and rep["mismatched_examples"] == ["s0003"]
    assert rep["nonfinite_examples"] == ["s0002"] and rep["markers"] == 1


def test_bad_input(tmp_path, capsys):
    data = write_dataset(tmp_path / "d.jsonl", [5])
    assert main(["verify-dumps", str(tmp_path / "nodump"), "--dataset", str(data)]) == 2
    with ShardWriter(tmp_path / "dump", META) as w:
        fill(w, records(data))
    assert (
        main(["verify-dumps", str(tmp_path / "dump"), "--dataset", str(tmp_path / "x.jsonl")]) == 2
    )


def test_fp8_aux_round_trip_and_verify(tmp_path, capsys):
    data = write_dataset(tmp_path / "d.jsonl", [6, 11])
    meta = DumpMeta(
        model="m", hidden_size=H, num_layers=8, aux_layer_ids=[2, 4, 5], aux_dtype="fp8_e4m3"
    )
    aux = torch.randn(11, 3 * H) * torch.tensor([1.0, 50.0, 0.01]).repeat_interleave(H)
    with ShardWriter(tmp_path / "dump", meta) as w:
        r = records(data)
        w.add(r[0]["id"], torch.tensor(r[0]["input_ids"]), torch.randn(6, 3 * H), torch.randn(6, H))
        w.add(r[1]["id"], torch.tensor(r[1]["input_ids"]), aux, torch.randn(11, H))
    reader = DumpReader(tmp_path / "dump")
    got = reader.get(r[1]["id"])["aux"].float()
    for k in range(3):  # per-token, per-layer scales: each block keeps its own range
        blk = slice(k * H, (k + 1) * H)
        assert (got[:, blk] - aux[:, blk]).abs().max() <= 0.07 * aux[:, blk].abs().max()
    raw = reader.get(r[1]["id"], dequantize=False)
    assert raw["aux"].dtype == torch.float8_e4m3fn and raw["aux_scale"].shape == (11, 3)
    assert verify(capsys, tmp_path / "dump", data)[0] == 0


def test_writers_sharing_a_rank_tag_never_clobber(tmp_path):
    a, b = ShardWriter(tmp_path, META), ShardWriter(tmp_path, META)  # both think seq 0 is free
    a.add("x", torch.tensor([1]), torch.zeros(1, 3 * H), torch.zeros(1, H))
    b.add("y", torch.tensor([2]), torch.zeros(1, 3 * H), torch.zeros(1, H))
    pa, pb = a.flush(), b.flush()
    assert pa != pb and sorted(DumpReader(tmp_path).ids()) == ["x", "y"]


def test_write_errors_name_the_lost_samples_and_leave_nothing(tmp_path, monkeypatch):
    w = ShardWriter(tmp_path, META, min_free_bytes=10**15)
    w.add("x", torch.tensor([1, 2]), torch.zeros(2, 3 * H), torch.zeros(2, H))
    with pytest.raises(dense.DumpWriteError) as err:
        w.flush()
    assert err.value.errno == errno.ENOSPC and err.value.sample_ids == ["x"]
    w = ShardWriter(tmp_path, META, background=True)

    def broken(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dense, "write_safetensors", broken)
    w.add("y", torch.tensor([1]), torch.zeros(1, 3 * H), torch.zeros(1, H))
    with pytest.raises(dense.DumpWriteError) as err:
        w.close()
    assert err.value.errno == errno.ENOSPC and err.value.sample_ids == ["y"]
    assert list((tmp_path / "shards").iterdir()) == []
