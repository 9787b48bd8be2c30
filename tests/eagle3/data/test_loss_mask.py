"""Loss masks from render boundaries, checked token by token against hand-derived expectations.

Expectations are written as the rendered text cut into segments, each marked supervised (1) or
not (0). With the Kimi-style template every cut falls on a special token, which the tokenizer
never merges across, so tokenizing each segment alone and concatenating gives exactly the ids of
the full rendering: the expected mask follows from the segments without trusting the code under
test. The BPE-merge tests use templates without special tokens at the boundary.
"""

from __future__ import annotations

import pytest
from eagle3_data_helpers import ASSISTANT, END, SYSTEM, USER, expected

from remote_agent.eagle3.data.loss_mask import MaskBuilder, TemplateError


def build(tok, messages, **kw):
    samples, stats, errors = MaskBuilder(tok, **kw).build("s", messages)
    if errors:  # one refused turn is enough to fail these hand-checked cases
        raise TemplateError("; ".join(errors))
    return samples, stats


CONV = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "def foo():"},
    {"role": "assistant", "content": "return None", "reasoning_content": "a stub"},
    {"role": "user", "content": "and imports?"},
    {"role": "assistant", "content": "import os"},
]


def test_multi_turn_supervises_content_and_end_token_not_header(tok):
    [s], stats = build(tok, CONV)
    ids, mask = expected(
        tok,
        [
            (SYSTEM, 0), ("You are terse.", 0), (END, 0),
            (USER, 0), ("def foo():", 0), (END, 0),
            (ASSISTANT, 0), ("<think>", 1), ("a stub", 1), ("</think>", 1), ("return None", 1), (END, 1),
            (USER, 0), ("and imports?", 0), (END, 0),
            (ASSISTANT, 0), ("import os", 1), (END, 1),
        ],
    )  # fmt: skip
    assert s.input_ids == ids
    assert s.loss_mask == mask
    # the rendering really is what apply_chat_template tokenizes to
    assert s.input_ids == list(tok.apply_chat_template(CONV, tokenize=True)["input_ids"])
    assert (stats.turns, stats.reasoning_turns, stats.boundary_merges) == (2, 1, 0)


def test_reasoning_masked_stays_in_input_but_is_not_supervised(tok):
    [s], _ = build(tok, CONV, reasoning="mask")
    ids, mask = expected(
        tok,
        [
            (SYSTEM, 0), ("You are terse.", 0), (END, 0),
            (USER, 0), ("def foo():", 0), (END, 0),
            # the model emits </think> after its (unsupervised) reasoning: that is trained
            (ASSISTANT, 0), ("<think>", 0), ("a stub", 0), ("</think>", 1), ("return None", 1), (END, 1),
            (USER, 0), ("and imports?", 0), (END, 0),
            (ASSISTANT, 0), ("import os", 1), (END, 1),
        ],
    )  # fmt: skip
    assert (s.input_ids, s.loss_mask) == (ids, mask)


def test_reasoning_dropped_is_gone_from_the_input(tok):
    [s], stats = build(tok, CONV, reasoning="drop")
    ids, mask = expected(
        tok,
        [
            (SYSTEM, 0), ("You are terse.", 0), (END, 0),
            (USER, 0), ("def foo():", 0), (END, 0),
            (ASSISTANT, 0), ("return None", 1), (END, 1),
            (USER, 0), ("and imports?", 0), (END, 0),
            (ASSISTANT, 0), ("import os", 1), (END, 1),
        ],
    )  # fmt: skip
    assert (s.input_ids, s.loss_mask) == (ids, mask)
    assert stats.reasoning_turns == 0


def test_last_turn_only(tok):
    [s], _ = build(tok, CONV, turns="last", reasoning="drop")
    _, mask = expected(
        tok,
        [
            (SYSTEM, 0), ("You are terse.", 0), (END, 0),
            (USER, 0), ("def foo():", 0), (END, 0),
            (ASSISTANT, 0), ("return None", 0), (END, 0),
            (USER, 0), ("and imports?", 0), (END, 0),
            (ASSISTANT, 0), ("import os", 1), (END, 1),
        ],
    )  # fmt: skip
    assert s.loss_mask == mask


def test_split_makes_one_sample_per_assistant_turn(tok):
    samples, stats = build(tok, CONV, turns="split", reasoning="drop")
    assert [s.id for s in samples] == ["s#0", "s#1"]
    ids0, mask0 = expected(
        tok,
        [
            (SYSTEM, 0), ("You are terse.", 0), (END, 0),
            (USER, 0), ("def foo():", 0), (END, 0),
            (ASSISTANT, 0), ("return None", 1), (END, 1),
        ],
    )  # fmt: skip
    assert (samples[0].input_ids, samples[0].loss_mask) == (ids0, mask0)
    assert (
        sum(samples[1].loss_mask)
        == len(tok("import os", add_special_tokens=False)["input_ids"]) + 1
    )
    assert stats.turns == 2


def test_content_that_looks_like_template_markup_is_still_content(tok):
    # The probe locates content exactly even when it contains the template's own markers.
    msgs = [
        {"role": "user", "content": "show me"},
        {"role": "assistant", "content": "assistant<|im_middle|>x"},
    ]
    [s], _ = build(tok, msgs)
    _, mask = expected(
        tok,
        [(USER, 0), ("show me", 0), (END, 0), (ASSISTANT, 0), ("assistant", 1), ("<|im_middle|>", 1), ("x", 1), (END, 1)],
    )  # fmt: skip
    assert s.loss_mask == mask


def test_no_assistant_turn_means_nothing_trainable(tok):
    samples, stats = build(tok, [{"role": "user", "content": "hello"}])
    assert samples == [] and stats.turns == 0


# -- BPE merges across a boundary --------------------------------------------------------------

# Assistant header ">>" with no separator: content starting with ">" merges into ">>>".
MERGE_START = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' -%}>>{{ m['content'] }}<|im_end|>"
    "{%- else -%}{{ m['role'] }}: {{ m['content'] }}{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}>>{%- endif -%}"
)


def test_merge_across_the_header_boundary_leaves_the_straddling_token_unsupervised(tok):
    gt3 = tok(">>>", add_special_tokens=False)["input_ids"]
    assert len(gt3) == 1, "precondition: '>>>' is one token of the tiny vocabulary"
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "> print(1)"}]
    [s], stats = build(tok, msgs, chat_template=MERGE_START)
    ids = s.input_ids
    k = ids.index(gt3[0])  # ">>" (header) + ">" (content) became one token
    rest, _ = expected(tok, [(" print(1)", 1), (END, 1)])
    head, _ = expected(tok, [("user: x", 0)])
    assert ids == head + gt3 + rest
    assert s.loss_mask == [0] * (k + 1) + [1] * len(rest)
    assert stats.boundary_merges == 1 and stats.straddling_tokens == 1


# Doctest-like plain-text turns: the assistant's tail is a newline and the next turn starts with
# indentation, so BPE merges "\n   " across the end of the turn.
MERGE_END = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' -%}{{ m['content'] }}{{ '\\n' }}"
    "{%- else -%}{{ '    >>> ' }}{{ m['content'] }}{{ '\\n' }}{%- endif -%}"
    "{%- endfor -%}"
)


def test_merge_across_the_end_boundary(tok):
    nl_indent = tok("\n   ", add_special_tokens=False)["input_ids"]
    assert len(nl_indent) == 1, "precondition: '\\n   ' is one token of the tiny vocabulary"
    msgs = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "y"},
        {"role": "assistant", "content": "fine"},
    ]
    [s], stats = build(tok, msgs, chat_template=MERGE_END)
    ok, _ = expected(tok, [("ok", 1)])
    fine_nl, _ = expected(tok, [("fine", 1), ("\n", 1)])
    ids, mask = s.input_ids, s.loss_mask
    # turn 1: "ok" supervised; its "\n" merged with the next turn's indentation -> unsupervised
    i = ids.index(nl_indent[0])
    assert ids[i - len(ok) : i] == ok and mask[i - len(ok) : i] == [1] * len(ok)
    assert mask[i] == 0
    # last turn: content and its newline tail (no special token to stop at) are supervised
    assert ids[-len(fine_nl) :] == fine_nl and mask[-len(fine_nl) :] == [1] * len(fine_nl)
    assert sum(mask) == len(ok) + len(fine_nl)
    assert stats.boundary_merges == 1 and stats.straddling_tokens == 1


# ChatML-style glue: "<|im_end|>\n" after each turn; the newline is template glue, not output.
GLUE = (
    "{%- for m in messages -%}<|im_{{ m['role'] }}|>{{ m['content'] }}<|im_end|>{{ '\\n' }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|im_assistant|>{%- endif -%}"
)


def test_glue_after_the_end_of_turn_token_is_not_supervised(tok):
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a b"}]
    [s], _ = build(tok, msgs, chat_template=GLUE)
    ids, mask = expected(
        tok,
        [("<|im_user|>", 0), ("q", 0), (END, 0), ("\n", 0), ("<|im_assistant|>", 0), ("a b", 1), (END, 1), ("\n", 0)],
    )  # fmt: skip
    assert (s.input_ids, s.loss_mask) == (ids, mask)


# -- template problems are errors, never silent --------------------------------------------------

FAILING = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' and not loop.first -%}{{ raise_exception('system must come first') }}{%- endif -%}"
    "<|im_{{ m['role'] }}|>{{ m['content'] }}<|im_end|>"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|im_assistant|>{%- endif -%}"
)

# Like Kimi/Qwen thinking templates: reasoning is rendered only on the last assistant turn.
DROPS_PAST_REASONING = (
    "{%- for m in messages -%}<|im_{{ m['role'] }}|>"
    "{%- if m.get('reasoning_content') and loop.last -%}<think>{{ m['reasoning_content'] }}</think>{%- endif -%}"
    "{{ m['content'] }}<|im_end|>"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|im_assistant|>{%- endif -%}"
)

IGNORES_REASONING = (
    "{%- for m in messages -%}<|im_{{ m['role'] }}|>{{ m['content'] }}<|im_end|>"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|im_assistant|>{%- endif -%}"
)


def test_template_exception_becomes_template_error(tok):
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "system", "content": "late"},
        {"role": "assistant", "content": "a"},
    ]
    with pytest.raises(TemplateError, match="system must come first"):
        build(tok, msgs, chat_template=FAILING)


def test_template_that_rewrites_earlier_turns_gets_one_sample_per_history(tok):
    msgs = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2", "reasoning_content": "r2"},
    ]
    # --turns all: the rewritten history cannot hold both turns, so each gets its own sample
    together, _ = build(tok, msgs, chat_template=DROPS_PAST_REASONING)
    samples, _ = build(tok, msgs, chat_template=DROPS_PAST_REASONING, turns="split")
    assert [s.id for s in together] == [s.id for s in samples] == ["s#0", "s#1"]
    assert [(s.input_ids, s.loss_mask) for s in together] == [
        (s.input_ids, s.loss_mask) for s in samples
    ]
    ids, mask = expected(
        tok,
        [
            ("<|im_user|>", 0), ("q1", 0), (END, 0),
            ("<|im_assistant|>", 0), ("<think>", 1), ("r1", 1), ("</think>", 1), ("a1", 1), (END, 1),
        ],
    )  # fmt: skip
    assert (samples[0].input_ids, samples[0].loss_mask) == (ids, mask)
    # second sample: the first answer's reasoning is gone from the history, as at serving time
    ids1, mask1 = expected(
        tok,
        [
            ("<|im_user|>", 0), ("q1", 0), (END, 0), ("<|im_assistant|>", 0), ("a1", 0), (END, 0),
            ("<|im_user|>", 0), ("q2", 0), (END, 0),
            ("<|im_assistant|>", 0), ("<think>", 1), ("r2", 1), ("</think>", 1), ("a2", 1), (END, 1),
        ],
    )  # fmt: skip
    assert (samples[1].input_ids, samples[1].loss_mask) == (ids1, mask1)


def test_reasoning_the_template_cannot_render_is_a_counted_error(tok):
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "r"},
    ]
    samples, stats, errors = MaskBuilder(tok, chat_template=IGNORES_REASONING).build("s", msgs)
    assert samples == [] and stats.reasoning_not_rendered == stats.failed_turns == 1
    assert "cannot render this turn's reasoning" in errors[0]
    [s], stats = build(tok, msgs, chat_template=IGNORES_REASONING, reasoning="drop")
    _, mask = expected(
        tok, [("<|im_user|>", 0), ("q", 0), (END, 0), ("<|im_assistant|>", 0), ("a", 1), (END, 1)]
    )
    assert s.loss_mask == mask


class NoOffsets:
    """A tokenizer that, like slow (Python) tokenizers such as Kimi's, cannot return offsets."""

    def __init__(self, tok):
        self._tok = tok

    def __call__(self, *args, **kwargs):
        if kwargs.get("return_offsets_mapping"):
            raise NotImplementedError("return_offset_mapping is not available for slow tokenizers")
        return self._tok(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_tokenizer_without_offsets(tok):
    [s], _ = build(NoOffsets(tok), CONV)
    [ref], _ = build(tok, CONV)
    assert (s.input_ids, s.loss_mask) == (ref.input_ids, ref.loss_mask)  # exact boundaries suffice
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "> print(1)"}]
    with pytest.raises(TemplateError, match="BPE merges across a turn boundary.*no offsets"):
        build(NoOffsets(tok), msgs, chat_template=MERGE_START)
