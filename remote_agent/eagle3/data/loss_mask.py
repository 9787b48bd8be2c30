"""Token ids + assistant loss masks, each turn exactly as the serving engine sees it.

For every supervised assistant turn i of a conversation m[0..n):

    P = render(m[:i], add_generation_prompt=True)     the prompt the engine is sent
    C = the turn's completion as the model generates it, after P

C comes from the template's own rendering of turn i with a probe content (`PROBE`): the text
between the end of the generation prompt G (P minus render(m[:i])) and the probe is what the
model emits before its answer (Kimi: `reasoning</think>`), the text after it is the tool calls
and end-of-turn tail (Kimi: `<|im_end|>`). A template that renders the turn's reasoning gives it
directly. One that drops it at this position (Kimi-K2.5 renders a plain final turn as
`<think></think>content`) is asked how it renders reasoning for the same turn as a tool-call turn
(where Kimi keeps it); when that rendering is `G + reasoning + what follows G without reasoning`,
the reasoning is put right after G, which is exactly what a thinking model generates after an
open `<think>`. Otherwise, under `reasoning="train"` or `"mask"`, the turn is an error
(`reasoning_not_rendered`): nothing is trained on a completion that the model never produces.

Supervised: C (its reasoning only when reasoning="train") through the last special token of the
tail (the end-of-turn token the engine stops on); never the header, never glue after it (ChatML's
newline). Each turn's sequence is P + C. `turns="split"`: one sample per turn. `"last"`: the last
turn. `"all"`: turns share a sample when one turn's P + C is a prefix of a later turn's, so a
template that rewrites history (drops past reasoning) gets several samples (`id#k`, k = the
ordinal of the sample's last turn), never a wrong one. A turn that fails is reported and the other
turns of the conversation are still produced.

Characters become token positions by tokenizing each boundary prefix: when tok(text[:x]) is a
prefix of tok(text), the boundary is exact. When BPE merges across x, the offsets of the full
tokenization decide, and a token that straddles the boundary is never supervised. Such
boundaries are counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

REASONING_MODES = ("train", "mask", "drop")
TURN_MODES = ("all", "last", "split")
# Private-use code points: cannot collide with real text, survive any Jinja filter unchanged.
PROBE = "\ue000eagle3-probe\ue001"


class TemplateError(Exception):
    """The chat template failed or is inconsistent for this sample (reported by index)."""


@dataclass
class Tokenized:
    id: str
    input_ids: list[int]
    loss_mask: list[int]


@dataclass
class MaskStats:
    turns: int = 0  # supervised assistant turns produced
    reasoning_turns: int = 0  # of which carried reasoning
    reasoning_not_rendered: int = 0  # turns refused: reasoning the template cannot render
    failed_turns: int = 0  # turns refused for any reason (reported, never silently dropped)
    boundary_merges: int = 0  # boundaries where BPE merged across (straddling token unsupervised)
    straddling_tokens: int = 0  # tokens left unsupervised because of those merges

    def add(self, other: MaskStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class _Turn:
    """One supervised turn: its sequence text P + C and char offsets of the completion."""

    ordinal: int  # among the conversation's assistant turns
    text: str  # P + C
    start: int  # len(P): the completion starts here
    answer_start: int  # end of the reasoning part (== start when there is none)
    tail_start: int  # after the content: tool calls, end-of-turn token, glue
    has_reasoning: bool = False


PROBE_CALL = {
    "id": "functions.eagle3_probe:0",
    "type": "function",
    "function": {"name": "eagle3_probe", "arguments": "{}"},
}
REASONING_PROBE = "\ue002eagle3-reasoning\ue003"


@dataclass
class MaskBuilder:
    tokenizer: Any  # a transformers tokenizer (fast tokenizers give offsets for merge handling)
    reasoning: str = "train"
    turns: str = "all"
    chat_template: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.reasoning not in REASONING_MODES:
            raise ValueError(f"reasoning must be one of {REASONING_MODES}")
        if self.turns not in TURN_MODES:
            raise ValueError(f"turns must be one of {TURN_MODES}")
        tok = self.tokenizer
        special = set(getattr(tok, "all_special_ids", []) or [])
        for tid, added in (getattr(tok, "added_tokens_decoder", {}) or {}).items():
            if getattr(added, "special", False):
                special.add(int(tid))
        self.special_ids = special
        self._tools: list[Any] | None = None
        self._offsets_supported = True

    # -- rendering -----------------------------------------------------------------------------

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        extra = dict(self.template_kwargs)
        if self._tools is not None:
            extra["tools"] = self._tools
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                chat_template=self.chat_template,
                **extra,
            )
        except Exception as exc:  # jinja raise_exception, TypeError in templates, ...
            raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None
        if not isinstance(text, str):
            raise TemplateError(f"chat template returned {type(text).__name__}, not text")
        return text

    # -- public --------------------------------------------------------------------------------

    def build(
        self, sample_id: str, messages: list[dict[str, Any]], tools: list[Any] | None = None
    ) -> tuple[list[Tokenized], MaskStats, list[str]]:
        """Samples, stats and one message per refused turn (the other turns are kept)."""
        self._tools = tools
        if self.reasoning == "drop":
            messages = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]
        assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        stats, errors = MaskStats(), []
        if self.turns == "last":
            assistant = assistant[-1:]
        turns: list[_Turn] = []
        for k, i in enumerate(assistant):
            ordinal = k if self.turns != "last" else len(assistant) - 1
            try:
                turns.append(self._turn(messages, i, ordinal))
            except TemplateError as exc:
                stats.failed_turns += 1
                if "cannot render" in str(exc):
                    stats.reasoning_not_rendered += 1
                errors.append(f"assistant turn {i}: {exc}")
        if not turns:
            return [], stats, errors
        if self.turns == "split":
            groups = [[t] for t in turns]
        else:  # a turn shares the sample of a later turn whose text it prefixes
            groups = []
            for t in reversed(turns):
                home = next((g for g in groups if g[0].text.startswith(t.text)), None)
                if home is None:
                    groups.append([t])
                else:
                    home.append(t)
            groups.reverse()
        single = len(groups) == 1 and self.turns != "split"
        out = []
        for g in groups:
            rid = sample_id if single else f"{sample_id}#{g[0].ordinal}"
            out.append(self._tokenize(rid, g, stats))
        return out, stats, errors

    # -- internals -----------------------------------------------------------------------------

    def _tokenize(self, sample_id: str, turns: list[_Turn], stats: MaskStats) -> Tokenized:
        full = turns[0].text  # the group's longest text (its last turn)
        ids, offsets = self._encode(full)
        mask = [0] * len(ids)
        points = sorted(
            {p for t in turns for p in (t.start, t.answer_start, t.tail_start, len(t.text))}
        )
        prefix_ids = self.tokenizer([full[:p] for p in points], add_special_tokens=False)[
            "input_ids"
        ]
        exact = {
            p: len(pi)
            for p, pi in zip(points, prefix_ids, strict=True)
            if ids[: len(pi)] == list(pi)
        }

        def index(p: int, after: bool) -> int:
            if p in exact:
                return exact[p]
            return _offset_index(offsets, p, after=after, sample_id=sample_id)

        for t in turns:
            stats.turns += 1
            stats.reasoning_turns += t.has_reasoning
            lo_char = t.answer_start if self.reasoning == "mask" else t.start
            merged = {p for p in (lo_char, t.tail_start, len(t.text)) if p not in exact}
            stats.boundary_merges += len(merged)
            if offsets is not None:
                stats.straddling_tokens += sum(1 for s, e in offsets for p in merged if s < p < e)
            lo = index(lo_char, after=True)
            tail_from = index(t.tail_start, after=True)
            hi = index(len(t.text), after=False)
            # Supervised through the tail's last special token (end of turn); glue after it is
            # never generated. A tail without one (plain-text templates) is supervised whole.
            last = next(
                (k for k in range(hi - 1, tail_from - 1, -1) if ids[k] in self.special_ids), None
            )
            if last is not None:
                hi = last + 1
            for k in range(lo, hi):
                mask[k] = 1
        return Tokenized(sample_id, ids, mask)

    def _encode(self, text: str) -> tuple[list[int], Any]:
        """Ids of the full rendering, with char offsets when the tokenizer can give them (slow
        tokenizers, e.g. Kimi's tiktoken one, cannot: then only exact boundaries work)."""
        if self._offsets_supported:
            try:
                enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
                return list(enc["input_ids"]), enc.get("offset_mapping")
            except (NotImplementedError, TypeError, ValueError):
                self._offsets_supported = False
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]), None

    def _after_prompt(self, text: str, gen: str, bare: str, pos: int, what: str) -> int:
        """Where the generation prompt `gen` ends in `text`, before the probe at `pos` (with no
        generation prompt: where the conversation before the turn ends)."""
        if gen:
            at = text.rfind(gen, 0, pos)
            if at >= 0:
                return at + len(gen)
        elif text.startswith(bare) and len(bare) <= pos:
            return len(bare)
        raise TemplateError(
            f"the generation prompt {gen!r:.60} does not appear before the {what} when the "
            "template renders the turn"
        )

    def _turn(self, messages: list[dict[str, Any]], i: int, ordinal: int) -> _Turn:
        prompt = self.render(messages[:i], add_generation_prompt=True)
        bare = self.render(messages[:i], add_generation_prompt=False) if i else ""
        if not prompt.startswith(bare):
            raise TemplateError("the generation prompt rewrites the conversation before it")
        gen = prompt[len(bare) :]
        msg = messages[i]
        reasoning = msg.get("reasoning_content") or ""
        content = msg.get("content") or ""
        probe = self.render(messages[:i] + [{**msg, "content": PROBE}], False)
        pos = probe.find(PROBE)
        if pos < 0 or probe.find(PROBE, pos + 1) >= 0:
            raise TemplateError("cannot locate the turn's content in its rendering")
        head_end = self._after_prompt(probe, gen, bare, pos, "content")
        before, tail = probe[head_end:pos], probe[pos + len(PROBE) :]
        if not tail:
            raise TemplateError("the template renders nothing after the turn's content")
        if reasoning and reasoning not in before:
            before = reasoning + self._reasoning_follows(messages, i, gen, bare, before)
        if not self.render(messages[: i + 1], False).endswith(content + tail):
            raise TemplateError("the template renders the turn's content differently in place")
        text = prompt + before + content + tail
        answer_start = len(prompt) + (before.rfind(reasoning) + len(reasoning) if reasoning else 0)
        tail_start = len(prompt) + len(before) + len(content)
        return _Turn(ordinal, text, len(prompt), answer_start, tail_start, bool(reasoning))

    def _reasoning_follows(
        self, messages: list[dict[str, Any]], i: int, gen: str, bare: str, before: str
    ) -> str:
        """The template dropped this turn's reasoning: accept putting it right after the
        generation prompt only when the template itself renders reasoning that way for the same
        turn made a tool-call turn. Returns `before` (what follows the reasoning)."""
        msg = messages[i]
        calls = msg.get("tool_calls") or [PROBE_CALL]
        as_call = {
            **msg,
            "content": PROBE,
            "reasoning_content": REASONING_PROBE,
            "tool_calls": calls,
        }
        text = self.render(messages[:i] + [as_call], False)
        r, c = text.find(REASONING_PROBE), text.find(PROBE)
        if r < 0 or c < r:
            raise TemplateError(
                "the chat template cannot render this turn's reasoning (--reasoning "
                f"{self.reasoning}: it would train a completion the model never produces); use a "
                "template that renders it, or --reasoning drop"
            )
        head_end = self._after_prompt(text, gen, bare, r, "reasoning")
        if text[head_end:r] or text[r + len(REASONING_PROBE) : c] != before:
            raise TemplateError(
                "the chat template cannot render this turn's reasoning: it renders reasoning as "
                f"{text[head_end:c]!r:.80}, not right after the generation prompt {gen!r:.40}"
            )
        return before


def _offset_index(offsets: Any, p: int, after: bool, sample_id: str) -> int:
    """Token index at char boundary p from the full tokenization's offsets (merge fallback)."""
    if offsets is None:
        raise TemplateError(
            f"{sample_id}: BPE merges across a turn boundary and the tokenizer gives no offsets "
            "(use a fast tokenizer)"
        )
    if after:
        return next((k for k, (s, _e) in enumerate(offsets) if s >= p), len(offsets))
    k = 0
    while k < len(offsets) and offsets[k][1] <= p:
        k += 1
    return k
