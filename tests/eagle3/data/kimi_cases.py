"""Kimi-K2.5 conversations with their completions written out by hand: what the model generates
after the serving prompt (which ends `<|im_assistant|>assistant<|im_middle|><think>`), and the
oracle that checks tokenize's samples against `apply_chat_template(m[:i], gen=True)` + that text.

`judge` classifies one conversation for one (turns, reasoning) mode: "correct" (every turn
supervised exactly, nothing else supervised), "refused" (some turns refused with a reason, the
rest exact) or "wrong"."""

from __future__ import annotations

from typing import Any

from remote_agent.eagle3.data.loss_mask import MaskBuilder


def call(name: str, k: int, args: str) -> dict[str, Any]:
    return {
        "id": f"functions.{name}:{k}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


def calls_text(calls: list[dict[str, Any]]) -> str:
    body = "".join(
        f"<|tool_call_begin|>{c['id']}<|tool_call_argument_begin|>{c['function']['arguments']}<|tool_call_end|>"
        for c in calls
    )
    return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"


WEATHER = call("get_weather", 0, '{"city": "Paris"}')
TIME = call("get_time", 1, '{"tz": "CET"}')
CASES: dict[str, list[dict[str, Any]]] = {
    "single": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
    ],
    "multi_reasoning": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "6", "reasoning_content": "Add again."},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "You are welcome.", "reasoning_content": "Be polite."},
    ],
    "tools_with_reasoning": [
        {"role": "user", "content": "Weather and time in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Check the weather first.",
            "tool_calls": [WEATHER],
        },
        {"role": "tool", "tool_call_id": WEATHER["id"], "content": '{"condition": "sunny"}'},
        {
            "role": "assistant",
            "content": "Now the time.",
            "reasoning_content": "Then the time.",
            "tool_calls": [TIME],
        },
        {"role": "tool", "tool_call_id": TIME["id"], "content": "21:00"},
        {"role": "assistant", "content": "Sunny, 21:00.", "reasoning_content": "Both known."},
        {"role": "user", "content": "And tomorrow?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Ask the tool.",
            "tool_calls": [WEATHER],
        },
    ],
    "no_reasoning": [
        {"role": "system", "content": "You are Kimi."},
        {"role": "user", "content": "Say ok."},
        {"role": "assistant", "content": "ok"},
    ],
    "empty_content": [
        {"role": "user", "content": "Say nothing."},
        {"role": "assistant", "content": "", "reasoning_content": "Stay silent."},
        {"role": "user", "content": "Really nothing?"},
        {"role": "assistant", "content": ""},
    ],
    "cjk": [
        {"role": "user", "content": "今天天气怎么样？"},
        {
            "role": "assistant",
            "content": "今天天气很好。",
            "reasoning_content": "思考一下这个问题。",
        },
    ],
    "ends_on_user": [
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "First answer", "reasoning_content": "think first"},
        {"role": "user", "content": "A question nobody answered"},
    ],
}


def completion(msg: dict[str, Any], reasoning: str) -> tuple[str, str]:
    """(unsupervised part, supervised part) of what the model generates after `<think>`."""
    rc = "" if reasoning == "drop" else msg.get("reasoning_content", "")
    rest = (
        "</think>"
        + msg["content"]
        + (calls_text(msg["tool_calls"]) if msg.get("tool_calls") else "")
        + "<|im_end|>"
    )
    return (rc, rest) if reasoning == "mask" else ("", rc + rest)


def judge(tok, messages: list[dict[str, Any]], turns: str, reasoning: str) -> tuple[str, list[str]]:
    samples, _stats, errors = MaskBuilder(tok, reasoning=reasoning, turns=turns).build(
        "c", messages
    )
    msgs = (
        messages
        if reasoning != "drop"
        else [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]
    )
    want = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    if turns == "last":
        want = want[-1:]
    refused = {int(e.split(":")[0].removeprefix("assistant turn ")) for e in errors}
    covered: list[set[int]] = [set() for _ in samples]
    found = set()
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    for i in want:
        prompt = enc(tok.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True))
        quiet, loud = (enc(x) if x else [] for x in completion(msgs[i], reasoning))
        seq = prompt + quiet + loud
        for s, cov in zip(samples, covered, strict=True):
            if s.input_ids[: len(seq)] == seq and s.loss_mask[len(prompt) - 1 : len(seq)] == [0] * (
                len(quiet) + 1
            ) + [1] * len(loud):
                cov.update(range(len(prompt) + len(quiet), len(seq)))
                found.add(i)
    stray = any(
        {k for k, m in enumerate(s.loss_mask) if m} != cov
        for s, cov in zip(samples, covered, strict=True)
    )
    if stray or (set(want) - refused) != found or (refused - set(want)):
        return "wrong", errors
    return ("refused" if refused else "correct"), errors
