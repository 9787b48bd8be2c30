"""Kimi-K2.5: every supervised assistant turn is trained exactly as the serving engine sees it
(prompt with the generation prompt, then the completion the model generates), checked token by
token against the fixture template and hand-written completions (kimi_cases.py), in every
`--turns` x `--reasoning` mode; the counts table is printed (pytest -s) and asserted."""

from __future__ import annotations

import json

import pytest
from eagle3_data_helpers import run_cli, write_records
from kimi_cases import CASES, WEATHER, judge

from remote_agent.eagle3.data.loss_mask import MaskBuilder
from remote_agent.eagle3.drafter.train.data import conversation_id, is_holdout

MODES = [(t, r) for t in ("all", "last", "split") for r in ("train", "mask", "drop")]


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize(("turns", "reasoning"), MODES)
def test_every_turn_is_supervised_exactly_as_served(kimi_tok, name, turns, reasoning):
    verdict, errors = judge(kimi_tok, CASES[name], turns, reasoning)
    assert (verdict, errors) == ("correct", [])


def test_counts_table(kimi_tok, capsys):
    rows = []
    for turns, reasoning in MODES:
        counts = {"correct": 0, "refused": 0, "wrong": 0}
        for messages in CASES.values():
            counts[judge(kimi_tok, messages, turns, reasoning)[0]] += 1
        rows.append((turns, reasoning, counts))
    with capsys.disabled():
        print("\nKimi-K2.5 fixture: conversations correct / refused (with reason) / wrong")
        for turns, reasoning, c in rows:
            print(
                f"  --turns {turns:5} --reasoning {reasoning:5}  {c['correct']} / {c['refused']} / {c['wrong']}"
            )
    assert all(c == {"correct": len(CASES), "refused": 0, "wrong": 0} for *_, c in rows)


def test_reasoning_of_the_final_plain_turn_is_trained_after_the_open_think(kimi_tok):
    [s], stats, _ = MaskBuilder(kimi_tok, turns="last").build("c", CASES["single"])
    text = kimi_tok.decode([t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if m])
    assert text == "Greet back.</think>Hello!<|im_end|>"
    assert kimi_tok.decode(s.input_ids).endswith(
        "<|im_middle|><think>Greet back.</think>Hello!<|im_end|>"
    )
    assert (stats.reasoning_turns, stats.reasoning_not_rendered) == (1, 0)
    assert (
        s.loss_mask[-1] == 1
    )  # the final <|im_end|> is a target (the trainer predicts it from n-3)


def test_a_template_that_cannot_render_reasoning_refuses_only_those_turns(kimi_tok):
    no_reasoning = "{%- for m in messages -%}<|im_{{ m['role'] }}|>{{ m['role'] }}<|im_middle|>{{ m['content'] }}<|im_end|>{%- endfor -%}{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
    msgs = CASES["empty_content"]  # turn 1 has reasoning, turn 3 has none
    samples, stats, errors = MaskBuilder(kimi_tok, turns="split", chat_template=no_reasoning).build(
        "c", msgs
    )
    assert [s.id for s in samples] == ["c#1"]  # turn 3 kept, its id keeps its ordinal
    assert (stats.reasoning_not_rendered, stats.failed_turns, stats.turns) == (1, 1, 1)
    assert len(errors) == 1 and errors[0].startswith(
        "assistant turn 1: the chat template cannot render"
    )


def test_tokenize_command_reports_refused_turns_and_keeps_the_rest(kimi_tok, tmp_path):
    src = tmp_path / "kimi.jsonl"
    src.write_text(
        json.dumps(
            {
                "id": "t",
                "messages": CASES["tools_with_reasoning"],
                "tools": [
                    {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
                ],
            }
        )
        + "\n"
    )
    tokdir = tmp_path / "tok"
    kimi_tok.save_pretrained(str(tokdir))
    out = tmp_path / "o.jsonl"
    run = run_cli("tokenize", src, "--tokenizer", tokdir, "--out", out, "--turns", "split")
    assert run.rc == 0, run.stderr
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert ids == ["t#0", "t#1", "t#2", "t#3"]
    assert run.result["template_failures"] == 0 and run.result["reasoning_not_rendered"] == 0
    assert run.result["reasoning_turns"] == 4


def test_merge_keeps_the_final_end_of_turn_token_supervised(kimi_tok, tmp_path):
    [s], _, _ = MaskBuilder(kimi_tok).build("c", CASES["cjk"])
    src = write_records(tmp_path / "k.jsonl", [("c", s.input_ids, s.loss_mask)])
    out = tmp_path / "m.jsonl"
    assert run_cli("merge", src, "--out", out, "--workers", "1").rc == 0
    rec = json.loads(out.read_text())
    assert rec["loss_mask"] == s.loss_mask and rec["loss_mask"][-1] == 1
    assert kimi_tok.convert_ids_to_tokens(rec["input_ids"][-1]) == "<|im_end|>"


def test_holdout_keeps_the_turns_of_a_conversation_together():
    assert conversation_id("conv-7#3") == "conv-7" and conversation_id("a#b") == "a#b"
    for n in range(200):
        sides = {is_holdout(f"c{n}#{k}", 0.3) for k in range(4)} | {is_holdout(f"c{n}", 0.3)}
        assert len(sides) == 1
    assert 30 < sum(is_holdout(f"c{n}", 0.3) for n in range(200)) < 90


def test_tool_call_ids_render_as_kimi_returns(kimi_tok):
    text = kimi_tok.apply_chat_template(CASES["tools_with_reasoning"][:3], tokenize=False)
    assert f"<|im_system|>tool<|im_middle|>## Return of {WEATHER['id']}\n" in text
