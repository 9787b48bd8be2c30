"""Token ids + assistant loss masks from chat-template render boundaries (no regex over text).

For a conversation m[0..n) the full rendering is tokenized once. For every supervised assistant
turn i the template itself tells where the turn lives:

    H = render(m[:i], add_generation_prompt=True)    -> the turn's text starts at len(H)
    E = render(m[:i+1])                              -> and ends at len(E)
    X = render(m[:i] + [m[i] with content=PROBE])    -> reasoning part and end-of-turn tail

Both H and E must be string prefixes of the full rendering (a template that rewrites earlier turns,
e.g. one that drops past reasoning, fails here: use `turns="split"`). From X we learn the rendered
reasoning R (text between the header and the content) and the tail T after the content (e.g.
`<|im_end|>\\n`); the probe makes this exact even when the content contains template markers.

Supervised characters: the content (plus R when reasoning is trained) plus the tail up to and
including its first special token (the end-of-turn token the model emits); never the header, and
never glue after the end-of-turn token (ChatML's newline).

Characters become token positions by tokenizing each boundary prefix: when tok(full[:x]) is a
prefix of tok(full), the boundary is exact. When BPE merges across x (the prefix alone tokenizes
differently), the offsets of the full tokenization decide, and a token that straddles the boundary
is never supervised: it holds header or template text, and the serving engine never produces it
(it tokenizes the prompt, whose tokens end exactly at the header). Such turns are counted.
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
    turns: int = 0  # supervised assistant turns
    reasoning_turns: int = 0  # of which carried reasoning
    reasoning_not_rendered: int = 0  # reasoning the template dropped (nothing to train or mask)
    boundary_merges: int = 0  # boundaries where BPE merged across (straddling token unsupervised)
    straddling_tokens: int = 0  # tokens left unsupervised because of those merges

    def add(self, other: MaskStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class _Turn:
    header_end: int  # char offsets into the full rendering
    content_start: int
    content_end: int
    turn_end: int
    has_reasoning: bool = False


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
    ) -> tuple[list[Tokenized], MaskStats]:
        """One tokenized sample (or one per assistant turn with turns='split') and its stats."""
        self._tools = tools
        if self.reasoning == "drop":
            messages = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]
        assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        stats = MaskStats()
        if not assistant:  # nothing to supervise: no need to render (templates reject empty chats)
            return [Tokenized(sample_id, [], [])], stats
        if self.turns == "split":
            out = []
            for k, i in enumerate(assistant):
                sample, st = self._build_one(f"{sample_id}#{k}", messages[: i + 1], [i])
                out.append(sample)
                stats.add(st)
            return out, stats
        chosen = assistant[-1:] if self.turns == "last" else assistant
        sample, stats = self._build_one(sample_id, messages, chosen)
        return [sample], stats

    # -- internals -----------------------------------------------------------------------------

    def _build_one(
        self, sample_id: str, messages: list[dict[str, Any]], supervised: list[int]
    ) -> tuple[Tokenized, MaskStats]:
        stats = MaskStats()
        full = self.render(messages, add_generation_prompt=False)
        turns = [self._locate_turn(messages, i, full) for i in supervised]
        ids, offsets = self._encode(full)
        mask = [0] * len(ids)

        # Every char boundary we need, tokenized as a prefix in one batch.
        points = sorted(
            {p for t in turns for p in (t.header_end, t.content_start, t.content_end, t.turn_end)}
        )
        prefix_ids = (
            self.tokenizer([full[:p] for p in points], add_special_tokens=False)["input_ids"]
            if points
            else []
        )
        exact = {
            p: len(pi)
            for p, pi in zip(points, prefix_ids, strict=True)
            if ids[: len(pi)] == list(pi)
        }

        def start_index(p: int) -> int:  # first token lying wholly at or after char p
            if p in exact:
                return exact[p]
            return _offset_index(offsets, p, after=True, sample_id=sample_id)

        def end_index(p: int) -> int:  # one past the last token lying wholly before char p
            if p in exact:
                return exact[p]
            return _offset_index(offsets, p, after=False, sample_id=sample_id)

        for t in turns:
            stats.turns += 1
            stats.reasoning_turns += t.has_reasoning
            if t.has_reasoning and t.content_start == t.header_end:
                stats.reasoning_not_rendered += 1
            lo_char = t.content_start if self.reasoning == "mask" else t.header_end
            merged = {p for p in (lo_char, t.content_end, t.turn_end) if p not in exact}
            stats.boundary_merges += len(merged)
            if offsets is not None:
                stats.straddling_tokens += sum(1 for s, e in offsets for p in merged if s < p < e)
            lo = start_index(lo_char)
            hi = end_index(t.turn_end)
            # The tail is supervised up to and including its first special token (end of turn).
            tail_from = start_index(t.content_end)
            special = next((k for k in range(tail_from, hi) if ids[k] in self.special_ids), None)
            if special is not None:
                hi = special + 1
            for k in range(lo, hi):
                mask[k] = 1
        return Tokenized(sample_id, ids, mask), stats

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

    def _locate_turn(self, messages: list[dict[str, Any]], i: int, full: str) -> _Turn:
        head = self.render(messages[:i], add_generation_prompt=True)
        upto = self.render(messages[: i + 1], add_generation_prompt=False)
        for name, text in (("the prompt before", head), ("the conversation up to", upto)):
            if not full.startswith(text):
                at = _first_difference(full, text)
                raise TemplateError(
                    f"rendering {name} assistant turn {i} is not a prefix of the full rendering "
                    f"(differs at char {at}: {text[at : at + 30]!r} vs {full[at : at + 30]!r}); the "
                    "template rewrites earlier turns (e.g. drops past reasoning): use --turns split"
                )
        a, b = len(head), len(upto)
        if b <= a:
            raise TemplateError(f"assistant turn {i} renders to no text after its header")
        msg = messages[i]
        probe_msg = {**msg, "content": PROBE}
        probe = self.render(messages[:i] + [probe_msg], add_generation_prompt=False)
        pos = probe.find(PROBE, a)
        if not probe.startswith(head) or pos < 0 or probe.find(PROBE, pos + 1) >= 0:
            raise TemplateError(f"cannot locate the content of assistant turn {i} in the rendering")
        reasoning_text = probe[a:pos]
        tail = probe[pos + len(PROBE) :]
        if full[a : a + len(reasoning_text)] != reasoning_text or not upto.endswith(tail):
            raise TemplateError(
                f"assistant turn {i}: the template renders its reasoning or end-of-turn text "
                "differently depending on the content"
            )
        content_start, content_end = a + len(reasoning_text), b - len(tail)
        if content_end < content_start:
            raise TemplateError(f"assistant turn {i}: content end precedes its start")
        return _Turn(a, content_start, content_end, b, bool(msg.get("reasoning_content")))


def _first_difference(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((k for k in range(n) if a[k] != b[k]), n)


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
