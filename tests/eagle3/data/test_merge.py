"""`eagle3 merge`: determinism, truncation, dedup, caps, drops, bounded memory, manifest, index."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from eagle3_data_helpers import random_records, write_records

from remote_agent.eagle3.data.manifest import self_sha256, shuffle_key
from remote_agent.eagle3.data.records import DatasetIndex, iter_records
from remote_agent.eagle3.data.shuffle import BucketReader, BucketWriter


def sources(tmp_path: Path, n: int = 3, per: int = 120) -> list[Path]:
    return [
        write_records(
            tmp_path / f"src{k}.jsonl", random_records(per, seed=k, prefix=f"s{k}"), f"orig{k}"
        )
        for k in range(n)
    ]


def merged(path: Path) -> list:
    return [r for _, _, r in iter_records(path)]


def test_same_seed_same_bytes_whatever_memory_or_workers(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_CHUNK_BYTES", "40000")  # many chunks: worker processes really run
    inputs = sources(tmp_path)
    outs = []
    for k, extra in enumerate(
        [
            ["--workers", "1"],
            ["--workers", "1", "--memory-mb", "0.05"],  # many buckets on disk
            ["--workers", "2", "--memory-mb", "0.05"],
            ["--workers", "2"],
        ]
    ):
        out = tmp_path / f"m{k}.jsonl"
        run = cli("merge", *inputs, "--out", out, "--seed", "7", "--max-len", "200", *extra)
        assert run.rc == 0, run.stderr
        outs.append(out)
    data = {o.read_bytes() for o in outs}
    assert len(data) == 1
    # the index is deterministic too (it names no file, only ids and offsets)
    assert len({o.with_name(o.stem + ".index.json").read_bytes() for o in outs}) == 1
    other = tmp_path / "other.jsonl"
    assert cli("merge", *inputs, "--out", other, "--seed", "8", "--max-len", "200").rc == 0
    assert other.read_bytes() != outs[0].read_bytes()
    assert sorted(r.id for r in merged(other)) == sorted(r.id for r in merged(outs[0]))


def test_order_is_the_seeded_key_order_and_sources_are_renamed(cli, tmp_path):
    inputs = sources(tmp_path, n=2, per=50)
    out = tmp_path / "m.jsonl"
    assert (
        cli(
            "merge", inputs[0], f"named={inputs[1]}", "--out", out, "--seed", "3", "--workers", "1"
        ).rc
        == 0
    )
    recs = merged(out)
    assert {r.source for r in recs} == {"src0", "named"}  # stem, or NAME=PATH
    keys = [shuffle_key(3, r.source, r.id) for r in recs]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    # not simply the input order
    assert [r.id for r in recs] != sorted(r.id for r in recs)


def test_external_shuffle_with_a_memory_cap_smaller_than_the_input(cli, tmp_path):
    inputs = sources(tmp_path, n=3, per=200)
    size = sum(p.stat().st_size for p in inputs)
    budget_mb = 0.1
    small, big = tmp_path / "small.jsonl", tmp_path / "big.jsonl"
    run = cli("merge", *inputs, "--out", small, "--memory-mb", budget_mb, "--workers", "1")
    assert run.rc == 0, run.stderr
    shuffle = run.result["shuffle"]
    assert size > 4 * budget_mb * 2**20  # the input really is larger than the budget
    assert shuffle["buckets"] > 1
    assert 0 < shuffle["largest_load_bytes"] <= shuffle["budget_bytes"] // 2 < size
    run_big = cli("merge", *inputs, "--out", big, "--memory-mb", "512", "--workers", "1")
    assert run_big.result["shuffle"]["buckets"] == 1
    assert small.read_bytes() == big.read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no spill left behind


def test_bucket_reader_splits_an_oversized_bucket_recursively(tmp_path):
    rng = random.Random(0)
    writer = BucketWriter(tmp_path, "w1", n_buckets=1, buffer_bytes=4096)
    items = [(rng.getrandbits(64), rng.randbytes(rng.randint(10, 400))) for _ in range(3000)]
    items.append((items[5][0], b"tie"))  # an equal key: ordered by payload
    for key, payload in items:
        writer.add(key, payload)
    writer.close()
    reader = BucketReader(tmp_path, 1, budget_bytes=1 << 16)
    got = list(reader)
    assert got == sorted(items)
    assert reader.splits >= 1 and reader.largest_load <= (1 << 16) // 2
    assert list(tmp_path.iterdir()) == []


def test_truncation_cuts_and_the_final_end_of_turn_token_still_trains(cli, tmp_path):
    # the trainer predicts token t from position t-2: a record's last token is a real target
    src = write_records(
        tmp_path / "a.jsonl",
        [
            ("long", [10, 11, 12, 13, 14, 15], [0, 0, 1, 1, 1, 1]),  # cut to 4: [0,0,1,1]
            ("short", [20, 21, 22], [0, 1, 1]),  # not cut: every bit kept
            ("last-only", [30, 31, 32, 33, 34], [0, 0, 0, 1, 1]),  # cut: [0,0,0,1]
            ("untrainable", [40, 41], [0, 0]),
        ],
    )
    out = tmp_path / "m.jsonl"
    run = cli("merge", src, "--out", out, "--max-len", "4", "--workers", "1")
    assert run.rc == 0, run.stderr
    got = {r.id: (r.input_ids, r.loss_mask) for r in merged(out)}
    assert got == {
        "long": ([10, 11, 12, 13], [0, 0, 1, 1]),
        "short": ([20, 21, 22], [0, 1, 1]),
        "last-only": ([30, 31, 32, 33], [0, 0, 0, 1]),
    }
    manifest = json.loads((tmp_path / "m.manifest.json").read_text())
    st = manifest["sources"]["a"]
    assert (st["records"], st["tokens"], st["trainable_tokens"]) == (3, 11, 5)
    assert (st["truncated"], st["dropped_untrainable"], st["dropped_duplicates"]) == (2, 1, 0)
    assert cli("verify", out).rc == 0


def test_a_record_without_source_takes_the_file_stem(cli, tmp_path):
    src = tmp_path / "chats.v2.jsonl"
    src.write_text('{"id":"x","input_ids":[1,2,3],"loss_mask":[0,1,1]}\n')
    out = tmp_path / "m.jsonl"
    run = cli("merge", src, f"named={src}", "--out", out, "--workers", "1", "--prefix-ids")
    assert run.rc == 0, run.stderr
    assert sorted((r.id, r.source) for r in merged(out)) == [("chats.v2/x", "chats.v2")]
    assert run.result["sources"]["named"]["dropped_duplicates"] == 1


def test_duplicates_caps_and_drops(cli, tmp_path):
    a = write_records(
        tmp_path / "a.jsonl", [("a1", [1, 2, 3], [0, 1, 1]), ("a2", [4, 5, 6], [1, 1, 1])]
    )
    # b repeats a1's tokens (another id): the first occurrence (a, listed first) wins
    b = write_records(
        tmp_path / "b.jsonl",
        [("b1", [1, 2, 3], [1, 1, 1])] + [(f"b{k}", [k, 7, 8], [1, 1, 1]) for k in range(2, 42)],
    )
    c = write_records(tmp_path / "c.jsonl", [("c1", [9, 9, 9], [1, 1, 1])])
    out = tmp_path / "m.jsonl"
    run = cli(
        "merge",
        a,
        b,
        c,
        "--out",
        out,
        "--cap",
        "b=10",
        "--drop",
        "c",
        "--seed",
        "5",
        "--workers",
        "1",
    )
    assert run.rc == 0, run.stderr
    recs = merged(out)
    ids = {r.id for r in recs}
    assert {"a1", "a2"} <= ids and "b1" not in ids and "c1" not in ids
    kept_b = sorted(r.id for r in recs if r.source == "b")
    assert len(kept_b) == 10
    # the cap keeps the 10 smallest shuffle keys of b: a seeded sample, not the first 10 lines
    candidates = [f"b{k}" for k in range(2, 42)]
    assert kept_b == sorted(sorted(candidates, key=lambda i: shuffle_key(5, "b", i))[:10])
    m = json.loads((tmp_path / "m.manifest.json").read_text())
    assert m["sources"]["b"]["dropped_duplicates"] == 1 and m["sources"]["b"]["capped"] == 30
    assert m["dropped_sources"] == ["c"] and "c" not in m["sources"]


def test_manifest_and_index_contents(cli, tmp_path):
    inputs = sources(tmp_path, n=2, per=40)
    out = tmp_path / "m.jsonl"
    assert cli("merge", *inputs, "--out", out, "--max-len", "128", "--seed", "11").rc == 0
    m = json.loads((tmp_path / "m.manifest.json").read_text())
    recs = merged(out)
    import hashlib

    assert m["format"] == "eagle3-merged" and m["version"] == 1 and m["file"] == "m.jsonl"
    assert m["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert m["records"] == len(recs) == 80
    assert m["tokens"] == sum(len(r.input_ids) for r in recs)
    assert m["trainable_tokens"] == sum(sum(r.loss_mask) for r in recs)
    assert (m["seed"], m["max_len"], m["dropped_sources"]) == (11, 128, [])
    for k, p in enumerate(inputs):
        s = m["sources"][f"src{k}"]
        assert s["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
        assert s["records"] == sum(1 for r in recs if r.source == f"src{k}")
    hist = dict(map(tuple, m["length_histogram"]))
    assert sum(hist.values()) == 80 and set(hist) <= {16, 32, 64, 128}
    assert hist.get(128) == sum(1 for r in recs if 64 < len(r.input_ids) <= 128)
    assert m["self_sha256"] == self_sha256(m)
    for key in ("created_at", "tool_version"):
        assert isinstance(m[key], str) and m[key]
    # the index gives random access by id
    index = DatasetIndex.open(out, build_if_missing=False)
    assert index.ids() == [r.id for r in recs]
    probe = recs[37]
    assert index.read(probe.id) == probe and index.length(probe.id) == len(probe.input_ids)
    index.close()


def test_id_clash_is_bad_input_and_prefix_ids_fixes_it(cli, tmp_path):
    a = write_records(tmp_path / "a.jsonl", [("0", [1, 2], [1, 0])])
    b = write_records(tmp_path / "b.jsonl", [("0", [3, 4], [1, 0])])
    out = tmp_path / "m.jsonl"
    run = cli("merge", a, b, "--out", out)
    assert run.rc == 2 and run.error.startswith(f"{b}:1: id '0' is already used")
    assert not out.exists()
    assert cli("merge", a, b, "--out", out, "--prefix-ids").rc == 0
    assert sorted(r.id for r in merged(out)) == ["a/0", "b/0"]


def test_bad_input_is_located_and_nothing_is_written(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_CHUNK_BYTES", "4000")
    good = write_records(tmp_path / "good.jsonl", random_records(30, 1, "g"))
    cases = {
        "json": ('{"id":"x","source":"s","input_ids":[1,2],"loss_mask":[1,0]}\n{"id": oops}\n', ":2: not valid JSON"),
        "lengths": ('{"id":"x","source":"s","input_ids":[1,2],"loss_mask":[1]}\n', ":1: record 'x': 2 input_ids but 1 loss_mask"),
        "type": ('{"id":"x","source":"s","input_ids":[1,"2"],"loss_mask":[1,0]}\n', ":1: record 'x': 'input_ids' must be a list of integers"),
        "missing": ('{"id":"x","source":"s","input_ids":[1]}\n', ":1: missing field(s) loss_mask"),
    }  # fmt: skip
    out = tmp_path / "m.jsonl"
    for name, (text, message) in cases.items():
        bad = tmp_path / f"bad_{name}.jsonl"
        bad.write_text(text)
        for workers in ("1", "2"):
            run = cli("merge", good, bad, "--out", out, "--workers", workers)
            assert run.rc == 2, (name, run.stderr)
            assert run.error == f"{bad}{message}" or run.error.startswith(f"{bad}{message}"), (
                run.error
            )
            assert not out.exists() and not (tmp_path / "m.manifest.json").exists()
    vocab = write_records(tmp_path / "v.jsonl", [("x", [1, 4096], [1, 0])])
    run = cli("merge", vocab, "--out", out, "--vocab-size", "2048")
    assert run.rc == 2 and "token id 4096 outside the vocabulary [0, 2048)" in run.error
    for args, message in (
        (["--drop", "nope"], "--drop nope: no source named 'nope'"),
        (["--cap", "good=x"], "--cap good=x: expected SOURCE=N"),
        (["--max-len", "2"], "--max-len: must be at least 3"),
    ):
        run = cli("merge", good, "--out", out, *args)
        assert run.rc == 2 and message in run.error
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_rerun_replaces_old_outputs_atomically(cli, tmp_path):
    inputs = sources(tmp_path, n=1, per=20)
    out = tmp_path / "m.jsonl"
    assert cli("merge", *inputs, "--out", out, "--seed", "1").rc == 0
    first = out.read_bytes()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("nope\n")
    assert cli("merge", *inputs, bad, "--out", out, "--seed", "2").rc == 2
    assert out.read_bytes() == first  # a failed merge leaves the previous result untouched
    assert cli("verify", out).rc == 0


def test_an_untrainable_copy_does_not_shadow_a_trainable_one(cli, tmp_path):
    a = write_records(tmp_path / "a.jsonl", [("x", [5, 6, 7], [0, 0, 0])])  # nothing to train
    b = write_records(tmp_path / "b.jsonl", [("y", [5, 6, 7], [0, 1, 1])])
    out = tmp_path / "m.jsonl"
    run = cli("merge", a, b, "--out", out, "--workers", "1")
    assert run.rc == 0
    assert [(r.id, r.loss_mask) for r in merged(out)] == [("y", [0, 1, 1])]
    s = run.result["sources"]
    assert (s["a"]["dropped_untrainable"], s["b"]["dropped_duplicates"]) == (1, 0)


def test_an_index_of_a_rewritten_file_of_the_same_size_is_not_trusted(cli, tmp_path):
    """The index once trusted any file of its recorded size: the online bench's renamed subset,
    rewritten with a new equal-length id prefix on each attempt, kept the first attempt's ids
    (and the retry asked the server for samples it had already dumped). Ids at their offsets,
    and the merge's line CRCs, decide; a copy of the same bytes keeps its index."""
    from remote_agent.eagle3.errors import BadInput

    rows = [(f"aaa-{i}", [5 + i, 6, 7], [0, 1, 1]) for i in range(20)]
    data = write_records(tmp_path / "d.jsonl", rows)
    assert DatasetIndex.open(data).ids()[:2] == ["aaa-0", "aaa-1"]
    size = data.stat().st_size
    write_records(
        data, [(f"bbb-{i}", t, m) for i, t, m in ((i, *r[1:]) for i, r in enumerate(rows))]
    )
    assert data.stat().st_size == size
    with pytest.raises(BadInput, match=r"stale index \(record 0 at byte 0 is 'bbb-0'"):
        DatasetIndex.open(data, build_if_missing=False)
    assert DatasetIndex.open(data).ids()[:2] == ["bbb-0", "bbb-1"]  # rebuilt
    # a merged file's index has line CRCs: an edited token of the same width is caught
    inputs = sources(tmp_path, n=2, per=10)
    out = tmp_path / "m.jsonl"
    assert cli("merge", *inputs, "--out", out).rc == 0
    copy = tmp_path / "copy" / "m.jsonl"
    copy.parent.mkdir()
    for name in ("m.jsonl", "m.index.json"):
        (copy.parent / name).write_bytes((tmp_path / name).read_bytes())
    assert DatasetIndex.open(copy, build_if_missing=False).ids() == DatasetIndex.open(out).ids()
    raw = out.read_bytes()
    at = raw.index(b'"input_ids":[') + len(b'"input_ids":[')
    while raw[at + 1 : at + 2].isdigit():  # the last digit of the first token id
        at += 1
    digit = b"%d" % ((int(raw[at : at + 1]) + 1) % 10)
    out.write_bytes(raw[:at] + digit + raw[at + 1 :])  # same width, same id, other token
    with pytest.raises(BadInput, match="changed \\(line CRC\\)"):
        DatasetIndex.open(out, build_if_missing=False)


@pytest.mark.parametrize("corrupt", ["shifted offsets", "offset past the end", "swapped ids"])
def test_a_corrupted_index_is_never_trusted(tmp_path, corrupt):
    """An index edited between steps (offsets moved into the middle of a line or past the end,
    two ids swapped) is refused with its reason, and rebuilt from the data where allowed: a
    record is never served under another record's id."""
    import json

    from remote_agent.eagle3.errors import BadInput

    rows = [(f"s-{i:02d}", [5 + i, 6, 7], [0, 1, 1]) for i in range(12)]
    data = write_records(tmp_path / "d.jsonl", rows)
    index = DatasetIndex.open(data)
    ipath = tmp_path / "d.index.json"
    obj = json.loads(ipath.read_text())
    recs = obj["records"]
    if corrupt == "shifted offsets":
        for r in recs:
            r[1] += 3
    elif corrupt == "offset past the end":
        recs[-1][1] = data.stat().st_size + 100
    else:
        recs[0][0], recs[-1][0] = recs[-1][0], recs[0][0]
    ipath.write_text(json.dumps(obj))
    with pytest.raises(BadInput, match=r"stale index \(record \d+ at byte \d+ is "):
        DatasetIndex.open(data, build_if_missing=False)
    rebuilt = DatasetIndex.open(data)
    assert rebuilt.ids() == index.ids() == [r[0] for r in rows]
