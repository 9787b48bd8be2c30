"""`eagle3 verify` catches every kind of tampering and names the first discrepancy precisely."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from eagle3_data_helpers import random_records, write_records

from remote_agent.eagle3.data.chunks import ChunkScanner
from remote_agent.eagle3.data.manifest import self_sha256

MODES = {
    "one-chunk": ({}, "1"),
    "chunks": ({"EAGLE3_CHUNK_BYTES": "3000"}, "1"),  # many chunks, in-process
    "processes": ({"EAGLE3_CHUNK_BYTES": "3000"}, "2"),  # many chunks, 2 worker processes
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("merged")
    a = write_records(d / "src0.jsonl", random_records(30, 10, "a", max_len=150))
    b = write_records(d / "src1.jsonl", random_records(30, 11, "b", max_len=150))
    from eagle3_data_helpers import run_cli

    run = run_cli(
        "merge", a, b, "--out", d / "m.jsonl", "--seed", "4", "--max-len", "120", "--workers", "1"
    )
    assert run.rc == 0, run.stderr
    return d


@pytest.fixture
def merged(pristine, tmp_path) -> Path:
    for name in ("m.jsonl", "m.manifest.json", "m.index.json"):
        shutil.copy(pristine / name, tmp_path / name)
    return tmp_path / "m.jsonl"


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def set_lines(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


def rid(line: bytes) -> str:
    return json.loads(line)["id"]


def edit_manifest(path: Path, fn: Callable[[dict], None], reseal: bool = False) -> None:
    mpath = path.with_name("m.manifest.json")
    m = json.loads(mpath.read_text())
    fn(m)
    if reseal:  # a careful forger recomputes the checksum: the data-derived checks still catch it
        m["self_sha256"] = self_sha256(m)
    mpath.write_text(json.dumps(m))


def verify(cli, path: Path, *extra: object, mode: str = "one-chunk", monkeypatch=None):
    env, workers = MODES[mode]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    run = cli("verify", path, "--workers", workers, *extra)
    for k in env:
        monkeypatch.delenv(k)
    return run


@pytest.mark.parametrize("mode", list(MODES))
def test_pristine_file_verifies(cli, merged, tiny_target, mode, monkeypatch):
    run = verify(cli, merged, "--tokenizer", tiny_target, mode=mode, monkeypatch=monkeypatch)
    assert run.rc == 0, run.stderr
    assert (
        run.result["ok"] is True
        and run.result["records"] == 60
        and run.result["vocab_size"] == 2048
    )


# Each case: how to tamper, the expected message (regex) with the index, and without it.
def _edit_id(p):
    ls = lines_of(p)
    old = rid(ls[4])
    ls[4] = ls[4].replace(f'"id":"{old}"'.encode(), f'"id":"{old}x"'.encode())
    set_lines(p, ls)
    return old


def _flip_mask(p):
    ls = lines_of(p)
    start = ls[6].index(b'"loss_mask":[')
    at = ls[6].index(b",0", start) + 1  # the first unsupervised position after the first
    ls[6] = ls[6][:at] + b"1" + ls[6][at + 1 :]
    set_lines(p, ls)


def _edit_token(p):
    ls = lines_of(p)
    m = re.search(rb'"input_ids":\[(\d)', ls[8])
    d = m.group(1)
    ls[8] = ls[8][: m.start(1)] + (b"1" if d != b"1" else b"2") + ls[8][m.end(1) :]
    set_lines(p, ls)


def _drop_line(p):
    ls = lines_of(p)
    del ls[9]
    set_lines(p, ls)


def _duplicate_line(p):
    ls = lines_of(p)
    ls.insert(10, ls[9])
    set_lines(p, ls)


def _swap_lines(p):
    ls = lines_of(p)
    ls[2], ls[3] = ls[3], ls[2]
    set_lines(p, ls)


def _cut_mid_line(p):
    data = p.read_bytes()
    p.write_bytes(data[: len(data) - 40])


def _cut_lines(p):
    set_lines(p, lines_of(p)[:-2])


def _cut_newline(p):
    p.write_bytes(p.read_bytes()[:-1])


def _blank_line(p):
    ls = lines_of(p)
    ls.insert(5, b"\n")
    set_lines(p, ls)


CASES = {
    "edited id": (_edit_id, r"m\.jsonl:5: id '.+x' but m\.index\.json has '.+' here", r"m\.jsonl:6: record '.+' is out of the shuffle order of seed 4"),
    "flipped mask bit": (_flip_mask, r"m\.jsonl:7: record '.+' has (\d+) trainable tokens, m\.index\.json says \d+ \(loss_mask edited\)", r"m\.manifest\.json: trainable_tokens is \d+, the file has \d+"),
    "edited token id": (_edit_token, r"m\.jsonl:9: record '.+' differs from its digest in m\.index\.json", r"m\.manifest\.json: sha256 is .+ \(content changed\)"),
    "dropped line": (_drop_line, r"m\.jsonl:10: id '.+' but m\.index\.json has '.+' here", r"m\.manifest\.json: records is 60, the file has 59"),
    "duplicated line": (_duplicate_line, r"m\.jsonl:11: id '.+' but m\.index\.json has '.+' here", r"m\.jsonl:11: record '.+' is a duplicate of the previous record"),
    "reordered lines": (_swap_lines, r"m\.jsonl:3: id '.+' but m\.index\.json has '.+' here", r"m\.jsonl:4: record '.+' is out of the shuffle order of seed 4"),
    "truncated mid-line": (_cut_mid_line, r"m\.jsonl:60: not valid JSON", r"m\.jsonl:60: not valid JSON"),
    "truncated at a line end": (_cut_lines, r"m\.jsonl: ends after 58 records, m\.index\.json lists 60 \(file truncated; next expected id '.+'\)", r"m\.manifest\.json: records is 60, the file has 58"),
    "final newline cut": (_cut_newline, r"m\.jsonl:60: record '.+' has no final newline \(file truncated\?\)", r"m\.jsonl:60: record '.+' has no final newline"),
    "blank line": (_blank_line, r"m\.jsonl:6: blank line", r"m\.jsonl:6: blank line"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("with_index", [True, False], ids=["index", "no-index"])
def test_data_tampering(cli, merged, case, with_index, monkeypatch):
    tamper, with_idx, without_idx = CASES[case]
    tamper(merged)
    if not with_index:
        merged.with_name("m.index.json").unlink()
    for mode in (
        MODES if case in ("reordered lines", "duplicated line", "edited id") else ["one-chunk"]
    ):
        run = verify(cli, merged, mode=mode, monkeypatch=monkeypatch)
        assert run.rc == 1, (mode, run.stderr)
        assert re.match(
            with_idx if with_index else without_idx, run.error.replace(str(merged.parent) + "/", "")
        ), (mode, run.error)
        assert run.result == {
            "kind": "result",
            "command": "verify",
            "ok": False,
            "file": str(merged),
            "discrepancy": run.error,
        }


def test_reorder_across_a_chunk_boundary(cli, merged, monkeypatch):
    merged.with_name("m.index.json").unlink()
    chunks = list(ChunkScanner(merged, 3000))
    last = chunks[0].first_line + chunks[0].lines - 1  # last line of the first chunk
    ls = lines_of(merged)
    ls[last - 1], ls[last] = ls[last], ls[last - 1]  # swap it with the next chunk's first line
    set_lines(merged, ls)
    for mode in MODES:
        run = verify(cli, merged, mode=mode, monkeypatch=monkeypatch)
        assert run.rc == 1
        assert (
            f"m.jsonl:{last + 1}: record '{rid(ls[last])}' is out of the shuffle order of seed 4"
            in run.error
        ), (mode, run.error)


MANIFEST_CASES = {
    "records": (lambda m: m.update(records=m["records"] + 1), r"m\.manifest\.json: records is 61, the file has 60"),
    "tokens": (lambda m: m.update(tokens=m["tokens"] - 1), r"m\.manifest\.json: tokens is \d+, the file has \d+"),
    "source count": (lambda m: m["sources"]["src0"].update(records=29), r"m\.manifest\.json: sources\.src0\.records is 29, the file has 30"),
    "seed": (lambda m: m.update(seed=5), r"m\.jsonl:\d+: record '.+' is out of the shuffle order of seed 5 .*"),
    "max_len": (lambda m: m.update(max_len=50), r"m\.jsonl:\d+: record '.+' has \d+ tokens, above max_len 50"),
    "file": (lambda m: m.update(file="other.jsonl"), r"m\.manifest\.json: manifest describes 'other\.jsonl', not 'm\.jsonl'"),
    "sha256": (lambda m: m.update(sha256="0" * 64), r"m\.manifest\.json: sha256 is 0{16}\.\.\., the file's is [0-9a-f]{16}\.\.\. \(content changed\)"),
    "dropped source": (lambda m: m.update(dropped_sources=["src1"]), r"m\.jsonl:\d+: record '.+' is from source 'src1', which the manifest dropped"),
    "histogram": (lambda m: m["length_histogram"][0].__setitem__(1, 99), r"m\.manifest\.json: length_histogram does not match the file's lengths"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(MANIFEST_CASES))
def test_manifest_tampering_even_when_resealed(cli, merged, case, monkeypatch):
    fn, message = MANIFEST_CASES[case]
    edit_manifest(merged, fn, reseal=True)
    run = verify(cli, merged, monkeypatch=monkeypatch)
    assert run.rc == 1
    assert re.match(message, run.error.replace(str(merged.parent) + "/", "")), run.error


@pytest.mark.parametrize(
    "field", ["created_at", "tool_version", "dropped_duplicates", "sha256 of an input"]
)
def test_manifest_fields_not_derivable_from_the_data_are_sealed(cli, merged, field, monkeypatch):
    def change(m):
        if field == "dropped_duplicates":
            m["sources"]["src0"]["dropped_duplicates"] = 3
        elif field == "sha256 of an input":
            m["sources"]["src1"]["sha256"] = "f" * 64
        else:
            m[field] = "edited"

    edit_manifest(merged, change)
    run = verify(cli, merged, monkeypatch=monkeypatch)
    assert (
        run.rc == 1
        and "fields were edited after the merge (self_sha256 does not match)" in run.error
    )


def test_ids_outside_the_vocabulary(cli, merged, tiny_target, monkeypatch):
    ls = lines_of(merged)
    m = re.search(rb'"input_ids":\[(\d+)', ls[11])
    ls[11] = ls[11][: m.start(1)] + b"4095" + ls[11][m.end(1) :]
    set_lines(merged, ls)
    run = verify(cli, merged, "--tokenizer", tiny_target, monkeypatch=monkeypatch)
    assert run.rc == 1
    assert re.fullmatch(
        r"m\.jsonl:12: record '.+': token id 4095 outside the vocabulary \[0, 2048\)",
        run.error.replace(str(merged.parent) + "/", ""),
    )
    run = verify(cli, merged, "--vocab-size", "8192", monkeypatch=monkeypatch)
    assert run.rc == 1 and "m.jsonl:12:" in run.error and "differs from its digest" in run.error


def test_cannot_check_is_exit_2(cli, merged, tmp_path):
    manifest = merged.with_name("m.manifest.json")
    text = manifest.read_text()
    manifest.unlink()
    run = cli("verify", merged)
    assert run.rc == 2 and "no manifest" in run.error
    manifest.write_text("{not json")
    run = cli("verify", merged)
    assert run.rc == 2 and run.error.startswith(f"{manifest}: not valid JSON")
    m = json.loads(text)
    del m["records"]
    manifest.write_text(json.dumps(m))
    run = cli("verify", merged)
    assert run.rc == 2 and run.error == f"{manifest}: missing field 'records'"
    manifest.write_text(text)
    run = cli("verify", tmp_path / "absent.jsonl", "--manifest", manifest)
    assert run.rc == 2 and "no such file" in run.error
    run = cli("verify", merged, "--tokenizer", tmp_path / "no-tokenizer")
    assert run.rc == 2


def test_a_malformed_index_is_a_discrepancy(cli, merged):
    ipath = merged.with_name("m.index.json")
    obj = json.loads(ipath.read_text())
    obj["records"][3] = ["id", "0", 1, 1]
    ipath.write_text(json.dumps(obj))
    run = cli("verify", merged)
    assert (
        run.rc == 1 and run.error == f"{ipath}: index is not valid (rebuild it with eagle3 merge)"
    )
