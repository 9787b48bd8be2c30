"""The readers never crash: any input is a record or a BadInput located at `file:line`.

Also: the fast canonical reader (`parse_raw`) accepts exactly what the exact reader
(`parse_record`, json.loads) accepts and returns the same values.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remote_agent.eagle3.data.conversations import iter_conversations, parse_conversation
from remote_agent.eagle3.data.manifest import load_manifest
from remote_agent.eagle3.data.records import parse_raw, parse_record
from remote_agent.eagle3.data.regenerate_cmd import load_done
from remote_agent.eagle3.errors import BadInput

LOCATED = re.compile(r"^f\.jsonl:7: \S")
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except BadInput as exc:
        return ("bad", str(exc))


def as_tuple(r):
    return (r.id, r.source, r.input_ids, r.loss_mask)


def raw_as_tuple(r):
    ids = json.loads(b"[" + r.ids_text + b"]")
    mask = json.loads(b"[" + r.mask_text + b"]")
    assert (r.n_tokens, r.n_trainable) == (len(ids), sum(mask))
    return (r.id, r.source, ids, mask)


def check_agreement(line: bytes, vocab: int | None = None) -> None:
    slow = outcome(parse_record, line, "f.jsonl", 7, vocab)
    fast = outcome(parse_raw, line, "f.jsonl", 7, vocab)
    assert slow[0] == fast[0], (line, slow, fast)
    if slow[0] == "bad":
        assert slow[1] == fast[1]
        assert LOCATED.match(slow[1]), slow[1]
    else:
        assert as_tuple(slow[1]) == raw_as_tuple(fast[1])
        if line.rstrip(b"\n") == line.rstrip(b"\n").strip():
            # a valid line re-emits in canonical form that parses back to the same record
            assert as_tuple(parse_record(fast[1].line(), "f", 1)) == as_tuple(slow[1])


# Near-valid records: the interesting bugs live next to the canonical layout.
token = st.one_of(
    st.integers(min_value=0, max_value=3000),
    st.integers(min_value=-5, max_value=2**40),
    st.sampled_from([True, False, None, 1.5, "7", [1], 2**31 - 1, 2**31, 0]),
)
record_obj = st.fixed_dictionaries(
    {
        "id": st.one_of(st.text(max_size=8), st.integers(), st.none()),
        "source": st.one_of(st.text(max_size=8), st.none()),
        "input_ids": st.one_of(st.lists(token, max_size=6), st.none(), st.text(max_size=3)),
        "loss_mask": st.one_of(
            st.lists(st.sampled_from([0, 1, 2, True, -1, 0.0]), max_size=6), st.none()
        ),
    }
)


@FUZZ
@given(record_obj, st.booleans(), st.sampled_from([None, 2048]))
def test_near_valid_records_agree_and_are_located(obj, compact, vocab):
    text = json.dumps(obj, separators=(",", ":") if compact else None)
    check_agreement(text.encode() + b"\n", vocab)


@FUZZ
@given(st.binary(max_size=200))
def test_arbitrary_bytes_are_located(data):
    check_agreement(data)


@FUZZ
@given(
    st.lists(st.integers(0, 99999), min_size=1, max_size=8),
    st.integers(0, 60),
    st.binary(max_size=3),
)
def test_mutated_canonical_lines_agree(ids, pos, junk):
    mask = [k % 2 for k in range(len(ids))]
    line = json.dumps(
        {"id": "a", "source": "s", "input_ids": ids, "loss_mask": mask}, separators=(",", ":")
    ).encode()
    pos = min(pos, len(line))
    check_agreement(line[:pos] + junk + line[pos:])  # inserted junk
    check_agreement(line[:pos] + line[pos + 1 :])  # deleted byte


@pytest.mark.parametrize(
    "line, message",
    [
        (
            b'{"id":"a","source":"s","input_ids":[1,2],"loss_mask":[1]}',
            "2 input_ids but 1 loss_mask",
        ),
        (b'{"id":"a","source":"s","input_ids":[1,01],"loss_mask":[1,1]}', "not valid JSON"),
        (b'{"id":"a","source":"s","input_ids":[1,,2],"loss_mask":[1,1,1]}', "not valid JSON"),
        (
            b'{"id":"a","source":"s","input_ids":[5000],"loss_mask":[1]}',
            "token id 5000 outside the vocabulary [0, 2048)",
        ),
        (
            b'{"id":"a","source":"s","input_ids":[2147483648],"loss_mask":[1]}',
            "does not fit in int32",
        ),
        (
            b'{"id":"a","source":"s","input_ids":[1],"loss_mask":[2]}',
            "'loss_mask' must be a list of 0/1",
        ),
        (
            b'{"id":"","source":"s","input_ids":[1],"loss_mask":[1]}',
            "'id' must be a non-empty string",
        ),
        (b'{"source":"s","input_ids":[1],"loss_mask":[1]}', "missing field(s) id"),
        (b"[" * 100000, "not valid JSON"),
    ],
)
def test_specific_bad_records(line, message):
    vocab = 2048 if b"5000" in line else None
    for fn in (parse_record, parse_raw):
        with pytest.raises(BadInput) as err:
            fn(line, "f.jsonl", 7, vocab)
        assert str(err.value).startswith("f.jsonl:7: ") and message in str(err.value)


# -- conversations ---------------------------------------------------------------------------

turn = st.one_of(
    st.fixed_dictionaries({"from": st.sampled_from(["human", "gpt", "system", "alien", 3]), "value": st.one_of(st.text(max_size=5), st.none(), st.integers())}),
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool", "x", None]), "content": st.one_of(st.text(max_size=5), st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image"]), "text": st.text(max_size=3)}), max_size=2), st.integers())}),
    st.integers(),
    st.text(max_size=3),
)  # fmt: skip
conversation = st.one_of(
    st.fixed_dictionaries({"id": st.one_of(st.text(max_size=4), st.integers(), st.booleans()), "conversations": st.lists(turn, max_size=4)}),
    st.fixed_dictionaries({"messages": st.one_of(st.lists(turn, max_size=4), st.text(max_size=3))}),
    st.lists(st.integers(), max_size=2),
)  # fmt: skip


@FUZZ
@given(conversation)
def test_conversation_parser_never_crashes(obj):
    try:
        conv = parse_conversation(obj, "f.jsonl", 7, 0, "f-0")
    except BadInput as exc:
        assert str(exc).startswith("f.jsonl:7: "), str(exc)
        return
    assert all(m["role"] in ("system", "user", "assistant", "tool") for m in conv.messages)
    assert all(isinstance(m["content"], str) for m in conv.messages)


@FUZZ
@given(st.binary(max_size=300))
def test_conversation_files_never_crash(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("conv") / "c.jsonl"
    path.write_bytes(data)
    try:
        list(iter_conversations(path))
    except BadInput as exc:
        assert re.match(rf"^{re.escape(str(path))}:\d+: \S", str(exc)), str(exc)


def test_inline_think_is_split_into_reasoning():
    conv = parse_conversation(
        {
            "conversations": [
                {"from": "human", "value": "q"},
                {"from": "gpt", "value": "<think>\nhm\n</think>\n\nyes"},
            ]
        },
        "f",
        1,
        0,
        "f-0",
    )
    assert conv.messages[1] == {"role": "assistant", "content": "yes", "reasoning_content": "hm"}


# -- manifest and regenerate output ----------------------------------------------------------


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=100),
        st.dictionaries(
            st.sampled_from(["format", "version", "file", "sha256", "records", "sources"]),
            st.one_of(st.integers(), st.text(max_size=3), st.none()),
        ),
    )
)
def test_manifest_reader_never_crashes(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("m") / "x.manifest.json"
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    with pytest.raises(BadInput) as err:
        load_manifest(path)
    assert str(err.value).startswith(str(path) + ": ")


@FUZZ
@given(st.lists(st.binary(max_size=40), max_size=4))
def test_resume_reader_never_crashes(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("r") / "out.jsonl"
    path.write_bytes(b"\n".join(lines))
    try:
        done = load_done(path)
    except BadInput as exc:
        assert re.match(rf"^{re.escape(str(path))}:\d+: not a line written", str(exc))
        return
    # after loading, the file holds only complete lines
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n")
    assert len(done) <= len(lines)


def test_torn_last_line_is_cut_off(tmp_path: Path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"id": "a"}\n{"id": "b"}\n{"id": "c", "conv')
    assert load_done(path) == {"a", "b"}
    assert path.read_bytes() == b'{"id": "a"}\n{"id": "b"}\n'
