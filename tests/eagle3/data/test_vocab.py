"""`eagle3 vocab`: SGLang-shaped d2t/t2d from supervised-token counts, coverage, cache keys."""

from __future__ import annotations

import json

import numpy as np
from eagle3_data_helpers import write_records

from remote_agent.eagle3.data.vocab_mapping import load


def data(tmp_path):
    # Supervised counts (mask == 1 only): id 7 x5, id 3 x4, id 900 x3, id 42 x2, id 5 x1.
    # id 1000 appears 9 times but never supervised: it must not be chosen by frequency.
    recs = [
        ("r1", [1000, 7, 7, 3, 900, 0], [0, 1, 1, 1, 1, 0]),
        ("r2", [1000, 7, 3, 3, 900, 0], [0, 1, 1, 1, 1, 0]),
        ("r3", [1000, 7, 7, 3, 900, 42, 42, 5, 0], [0, 1, 1, 1, 1, 1, 1, 1, 0]),
        ("r4", [1000] * 6, [0] * 6),
    ]
    return write_records(tmp_path / "d.jsonl", recs)


def test_mapping_round_trip_and_shapes(cli, tiny_target, tmp_path):
    out = tmp_path / "vocab.safetensors"
    run = cli(
        "vocab",
        data(tmp_path),
        "--tokenizer",
        tiny_target,
        "--out",
        out,
        "--draft-vocab",
        "4",
        "--cache-dir",
        tmp_path / "c",
    )
    assert run.rc == 0, run.stderr
    d2t, t2d, meta = load(out)
    assert d2t.dtype == np.int64 and d2t.shape == (4,)
    assert t2d.dtype == np.bool_ and t2d.shape == (2048,)  # config.json's vocab_size
    # the 4 most supervised ids, sorted by target id: 3, 7, 42, 900
    hot = d2t + np.arange(4)  # what SGLang's loader computes (hot_token_id)
    assert hot.tolist() == [3, 7, 42, 900]
    assert np.flatnonzero(t2d).tolist() == [3, 7, 42, 900]
    assert meta["target_vocab"] == "2048" and meta["draft_vocab"] == "4"
    cov = run.result
    assert cov["supervised_tokens"] == 15 and cov["distinct_supervised_ids"] == 5
    assert cov["coverage"] == 14 / 15
    assert (
        cov["size_for_coverage"]["0.9"] == 4 and cov["suggested_draft_vocab"] == 5
    )  # 0.99 needs all
    report = json.loads((tmp_path / "vocab.json").read_text())
    assert (
        report["coverage"]["coverage"] == 14 / 15 and report["metadata"]["coverage"] == "0.933333"
    )


def test_padding_when_data_has_fewer_distinct_ids(cli, tiny_target, tmp_path):
    out = tmp_path / "v.safetensors"
    assert (
        cli(
            "vocab",
            data(tmp_path),
            "--tokenizer",
            tiny_target,
            "--out",
            out,
            "--draft-vocab",
            "8",
            "--no-cache",
        ).rc
        == 0
    )
    d2t, t2d, _ = load(out)
    hot = (d2t + np.arange(8)).tolist()
    assert hot == [0, 1, 2, 3, 5, 7, 42, 900]  # 5 seen ids + lowest unused 0, 1, 2
    assert sorted(hot) == hot and t2d.sum() == 8


def test_cache_is_keyed_by_both_vocab_sizes_and_the_data(cli, tiny_target, tmp_path):
    src, cache = data(tmp_path), tmp_path / "cache"
    a, b, c = tmp_path / "a.safetensors", tmp_path / "b.safetensors", tmp_path / "c.safetensors"
    first = cli(
        "vocab",
        src,
        "--tokenizer",
        tiny_target,
        "--out",
        a,
        "--draft-vocab",
        "4",
        "--cache-dir",
        cache,
    )
    again = cli(
        "vocab",
        src,
        "--tokenizer",
        tiny_target,
        "--out",
        b,
        "--draft-vocab",
        "4",
        "--cache-dir",
        cache,
    )
    assert (first.result["cached"], again.result["cached"]) == (False, True)
    assert a.read_bytes() == b.read_bytes()
    # A different draft size is not served the cached mapping (SpecForge PR #602's bug).
    other = cli(
        "vocab",
        src,
        "--tokenizer",
        tiny_target,
        "--out",
        c,
        "--draft-vocab",
        "3",
        "--cache-dir",
        cache,
    )
    assert (
        other.result["cached"] is False and other.result["cache_key"] != first.result["cache_key"]
    )
    assert load(c)[0].shape == (3,)
    # Nor is a different target vocab size, nor changed data.
    t = cli(
        "vocab",
        src,
        "--tokenizer",
        tiny_target,
        "--out",
        c,
        "--draft-vocab",
        "4",
        "--target-vocab",
        "4096",
        "--cache-dir",
        cache,
    )
    assert t.result["cached"] is False and load(c)[1].shape == (4096,)
    src.write_text(src.read_text().replace("[0,1,1,1,1,0]", "[0,1,1,1,0,0]", 1))
    d = cli(
        "vocab",
        src,
        "--tokenizer",
        tiny_target,
        "--out",
        c,
        "--draft-vocab",
        "4",
        "--cache-dir",
        cache,
    )
    assert d.result["cached"] is False and d.result["supervised_tokens"] == 14


def test_bad_input(cli, tiny_target, tmp_path):
    src = write_records(tmp_path / "d.jsonl", [("r", [1, 5000], [1, 0])])
    run = cli(
        "vocab", src, "--tokenizer", tiny_target, "--out", tmp_path / "v.safetensors", "--no-cache",
        "--draft-vocab", "16",
    )  # fmt: skip
    assert run.rc == 2 and run.error.startswith(
        f"{src}:1: record 'r': token id 5000 outside the vocabulary [0, 2048)"
    )
    assert not (tmp_path / "v.safetensors").exists()
    run = cli(
        "vocab",
        data(tmp_path),
        "--tokenizer",
        tiny_target,
        "--out",
        tmp_path / "v.safetensors",
        "--draft-vocab",
        "9999",
    )
    assert run.rc == 2 and "--draft-vocab 9999: must be in 1..2048" in run.error
