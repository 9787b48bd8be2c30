"""`eagle3 tokenize` end to end: input shapes, drops, template failures, bad input."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3_data_helpers import ASSISTANT, END, USER, expected

from remote_agent.eagle3.data.records import iter_records


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def records(path: Path) -> list:
    return [r for _, _, r in iter_records(path)]


SHAREGPT = {
    "id": "a",
    "conversations": [
        {"from": "human", "value": "def foo():"},
        {"from": "gpt", "value": "<think>stub</think>return None"},
    ],
}
OPENAI = {
    "id": "a",
    "messages": [
        {
            "role": "user",
            "content": [{"type": "text", "text": "def "}, {"type": "text", "text": "foo():"}],
        },
        {"role": "assistant", "content": "return None", "reasoning_content": "stub"},
    ],
}
SPECFORGE = {
    "id": "a",
    "conversations": [
        {"role": "user", "content": "def foo():"},
        {"role": "assistant", "content": "return None", "reasoning": "stub"},
    ],
}


def test_three_input_shapes_give_identical_records(cli, tiny_target, tok, tmp_path):
    outs = []
    for name, row in (("sharegpt", SHAREGPT), ("openai", OPENAI), ("specforge", SPECFORGE)):
        src = write_jsonl(tmp_path / f"{name}.jsonl", [row])
        out = tmp_path / f"{name}.tok.jsonl"
        run = cli("tokenize", src, "--tokenizer", tiny_target, "--out", out, "--source", "s")
        assert run.rc == 0, run.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] == outs[2]
    [rec] = records(tmp_path / "sharegpt.tok.jsonl")
    ids, mask = expected(
        tok,
        [
            (USER, 0), ("def foo():", 0), (END, 0),
            (ASSISTANT, 0), ("<think>", 1), ("stub", 1), ("</think>", 1), ("return None", 1), (END, 1),
        ],
    )  # fmt: skip
    assert (rec.id, rec.source, rec.input_ids, rec.loss_mask) == ("a", "s", ids, mask)


def test_reasoning_flag_and_default_source_name(cli, tiny_target, tok, tmp_path):
    src = write_jsonl(tmp_path / "chats.v2.jsonl", [SHAREGPT])
    out = tmp_path / "o.jsonl"
    run = cli("tokenize", src, "--tokenizer", tiny_target, "--out", out, "--reasoning", "mask")
    assert run.rc == 0, run.stderr
    [rec] = records(out)
    assert rec.source == "chats.v2"  # the file stem (Path.stem, as merge names sources)
    _, mask = expected(
        tok,
        [
            (USER, 0), ("def foo():", 0), (END, 0),
            (ASSISTANT, 0), ("<think>", 0), ("stub", 0), ("</think>", 1), ("return None", 1), (END, 1),
        ],
    )  # fmt: skip
    assert rec.loss_mask == mask
    assert run.result["reasoning_turns"] == 1


def test_untrainable_samples_are_counted_and_dropped(cli, tiny_target, tmp_path):
    rows = [
        SHAREGPT,
        {"id": "u", "conversations": [{"from": "human", "value": "only a question"}]},
        {"id": "e", "messages": []},
    ]
    out = tmp_path / "o.jsonl"
    run = cli(
        "tokenize",
        write_jsonl(tmp_path / "in.jsonl", rows),
        "--tokenizer",
        tiny_target,
        "--out",
        out,
    )
    assert run.rc == 0, run.stderr
    assert [r.id for r in records(out)] == ["a"]
    r = run.result
    assert (r["samples"], r["records"], r["dropped_no_trainable"], r["template_failures"]) == (
        3,
        1,
        2,
        0,
    )
    assert r["tokens"] == len(records(out)[0].input_ids)


FAILING_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' and not loop.first -%}{{ raise_exception('system must come first') }}{%- endif -%}"
    "<|im_{{ m['role'] }}|>{{ m['content'] }}<|im_end|>"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|im_assistant|>{%- endif -%}"
)


def _failing_rows(n_good: int) -> list[dict]:
    bad = {
        "id": "late-system",
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "system", "content": "late"},
            {"role": "assistant", "content": "a"},
        ],
    }
    good = [
        {
            "id": f"g{k}",
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": f"a{k}"},
            ],
        }
        for k in range(n_good)
    ]
    return good[:1] + [bad] + good[1:]


def test_template_failure_is_reported_by_index_not_skipped_silently(cli, tiny_target, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text(FAILING_TEMPLATE)
    src = write_jsonl(tmp_path / "in.jsonl", _failing_rows(3))
    out = tmp_path / "o.jsonl"
    run = cli(
        "tokenize", src, "--tokenizer", tiny_target, "--out", out,
        "--chat-template", template, "--max-failed", "0.5",
    )  # fmt: skip
    assert run.rc == 0, run.stderr
    assert run.result["template_failures"] == 1
    assert run.result["failed_indexes"] == [1]
    assert [r.id for r in records(out)] == ["g0", "g1", "g2"]
    [err] = [json.loads(x) for x in (tmp_path / "o.errors.jsonl").read_text().splitlines()]
    assert (err["index"], err["line"], err["id"]) == (1, 2, "late-system")
    assert "system must come first" in err["error"]


def test_too_many_template_failures_fail_without_output(cli, tiny_target, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text(FAILING_TEMPLATE)
    out = tmp_path / "o.jsonl"
    run = cli(
        "tokenize", write_jsonl(tmp_path / "in.jsonl", _failing_rows(3)), "--tokenizer", tiny_target,
        "--out", out, "--chat-template", template,
    )  # fmt: skip
    assert run.rc == 1
    assert "1 of 4 samples failed" in run.error and "sample 1" in run.error
    assert not out.exists()
    assert (tmp_path / "o.errors.jsonl").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_bad_input_is_located_and_writes_nothing(cli, tiny_target, tmp_path):
    cases = {
        "not json": ('{"id": "a", "conversations": [}\n', ":1: not valid JSON"),
        "no turns": ('{"id": "a"}\n', ":1: needs 'conversations'"),
        "bad role": (
            json.dumps(SHAREGPT)
            + "\n"
            + json.dumps({"messages": [{"role": "robot", "content": "x"}]})
            + "\n",
            ":2: turn 0: unknown 'role': 'robot'",
        ),
        "mistyped": (
            '{"messages": [{"role": "user", "content": 5}]}\n',
            ":1: turn 0: 'content' must be a string",
        ),
        "dup id": (json.dumps(SHAREGPT) + "\n" + json.dumps(SHAREGPT) + "\n", ":2: id 'a' repeats"),
    }
    for name, (text, message) in cases.items():
        src = tmp_path / f"{name.replace(' ', '_')}.jsonl"
        src.write_text(text)
        out = tmp_path / "o.jsonl"
        run = cli("tokenize", src, "--tokenizer", tiny_target, "--out", out)
        assert run.rc == 2, name
        assert run.error.startswith(str(src)) and message in run.error, (name, run.error)
        assert not out.exists(), name


def test_workers_give_the_same_bytes(cli, tiny_target, tmp_path):
    rows = [
        {
            "id": f"s{k}",
            "messages": [
                {"role": "user", "content": f"q{k}"},
                {"role": "assistant", "content": f"answer {k}"},
            ],
        }
        for k in range(150)
    ]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    assert cli("tokenize", src, "--tokenizer", tiny_target, "--out", one).rc == 0
    assert cli("tokenize", src, "--tokenizer", tiny_target, "--out", two, "--workers", "2").rc == 0
    assert one.read_bytes() == two.read_bytes()
    assert len(records(one)) == 150


TOOLS_TEMPLATE = (
    "{%- if tools -%}<|im_system|>tools<|im_middle|>{{ tools | tojson }}<|im_end|>{%- endif -%}"
    "{%- for m in messages -%}<|im_{{ m['role'] }}|>{{ m['role'] }}<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


def test_tool_definitions_reach_the_template_and_are_not_supervised(
    cli, tiny_target, tok, tmp_path
):
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {}}}]
    row = {
        "id": "t",
        "tools": tools,
        "messages": OPENAI["messages"][:1] + [{"role": "assistant", "content": "ok"}],
    }
    template = tmp_path / "t.jinja"
    template.write_text(TOOLS_TEMPLATE)
    out = tmp_path / "o.jsonl"
    run = cli(
        "tokenize",
        write_jsonl(tmp_path / "in.jsonl", [row]),
        "--tokenizer",
        tiny_target,
        "--out",
        out,
        "--chat-template",
        template,
    )
    assert run.rc == 0, run.stderr
    [rec] = records(out)
    ids, mask = expected(
        tok,
        [
            ("<|im_system|>tools<|im_middle|>", 0), (json.dumps(tools), 0), (END, 0),
            (USER, 0), ("def foo():", 0), (END, 0), (ASSISTANT, 0), ("ok", 1), (END, 1),
        ],
    )  # fmt: skip
    assert (rec.input_ids, rec.loss_mask) == (ids, mask)
