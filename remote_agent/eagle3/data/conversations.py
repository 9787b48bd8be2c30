"""Read chat conversations in the common shapes and normalise them to OpenAI-style messages.

Accepted, one JSON object per line (or a JSON array of such objects in a `.json` file):

- ShareGPT: `{"id"?, "conversations": [{"from": "human"|"gpt"|"system"|..., "value": str}]}`
- SpecForge: `{"id", "conversations": [{"role": ..., "content": str}]}`
- OpenAI: `{"id"?, "messages": [{"role": ..., "content": str | [{"type": "text", "text": str}]}]}`

Every problem is a BadInput located at `file:line`. Assistant turns may carry `reasoning_content`
(or `reasoning`, OpenRouter's name); an assistant content that starts with `<think>...</think>` is
split into reasoning and answer, so every later stage sees reasoning in one place.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput, located

# ShareGPT speaker names seen in the wild -> OpenAI roles.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}
ROLES = ("system", "user", "assistant", "tool")
# Keys other than role/content that templates use and that we pass through untouched.
PASSTHROUGH_KEYS = ("tool_calls", "tool_call_id", "name")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass
class Conversation:
    index: int  # 0-based position in the input file (what errors are reported by)
    lineno: int | None  # 1-based line in a JSONL file; None for a JSON array
    id: str
    messages: list[dict[str, Any]]
    tools: list[Any] | None = None  # OpenAI-style tool definitions, passed to the template

    @property
    def where(self) -> str:
        return f"line {self.lineno}" if self.lineno is not None else f"item {self.index}"


def split_inline_reasoning(content: str) -> tuple[str | None, str]:
    """`<think>r</think>answer` -> ("r", "answer"); anything else -> (None, content)."""
    stripped = content.lstrip()
    if not stripped.startswith(THINK_OPEN):
        return None, content
    end = stripped.find(THINK_CLOSE)
    if end < 0:
        return None, content
    reasoning = stripped[len(THINK_OPEN) : end].strip("\n")
    answer = stripped[end + len(THINK_CLOSE) :].lstrip("\n")
    return reasoning, answer


def _content_text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # OpenAI content parts; only text can be tokenized here
        parts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise BadInput(f"{where}: only text content parts are supported, got {part!r:.60}")
            text = part.get("text")
            if not isinstance(text, str):
                raise BadInput(f"{where}: content part 'text' must be a string")
            parts.append(text)
        return "".join(parts)
    raise BadInput(f"{where}: 'content' must be a string, got {type(value).__name__}")


def normalise_turn(turn: Any, where: str) -> dict[str, Any]:
    if not isinstance(turn, dict):
        raise BadInput(f"{where}: a turn must be an object, got {type(turn).__name__}")
    if "from" in turn:  # ShareGPT
        speaker = turn["from"]
        if not isinstance(speaker, str) or speaker.lower() not in SHAREGPT_ROLES:
            raise BadInput(
                f"{where}: unknown speaker 'from': {speaker!r:.40} "
                f"(expected one of {', '.join(sorted(SHAREGPT_ROLES))})"
            )
        role = SHAREGPT_ROLES[speaker.lower()]
        if "value" not in turn:
            raise BadInput(f"{where}: ShareGPT turn without 'value'")
        content = _content_text(turn["value"], where)
    elif "role" in turn:  # OpenAI / SpecForge
        role = turn["role"]
        if not isinstance(role, str) or role not in ROLES:
            raise BadInput(
                f"{where}: unknown 'role': {role!r:.40} (expected one of {', '.join(ROLES)})"
            )
        if "content" not in turn and not turn.get("tool_calls"):
            raise BadInput(f"{where}: turn without 'content'")
        content = _content_text(turn.get("content"), where)
    else:
        raise BadInput(
            f"{where}: a turn needs 'role'/'content' (OpenAI) or 'from'/'value' (ShareGPT)"
        )
    msg: dict[str, Any] = {"role": role, "content": content}
    for key in PASSTHROUGH_KEYS:
        if key in turn:
            msg[key] = turn[key]
    if role == "assistant":
        reasoning = turn.get("reasoning_content", turn.get("reasoning"))
        if reasoning is not None and not isinstance(reasoning, str):
            raise BadInput(f"{where}: 'reasoning_content' must be a string")
        if reasoning is None:
            reasoning, msg["content"] = split_inline_reasoning(content)
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
    return msg


def parse_conversation(
    obj: Any, path: object, lineno: int | None, index: int, default_id: str
) -> Conversation:
    loc = f"{path}:{lineno}" if lineno is not None else f"{path}: item {index}"
    if not isinstance(obj, dict):
        raise BadInput(f"{loc}: expected a JSON object, got {type(obj).__name__}")
    turns = obj.get("messages", obj.get("conversations"))
    if turns is None:
        raise BadInput(f"{loc}: needs 'conversations' (ShareGPT/SpecForge) or 'messages' (OpenAI)")
    if not isinstance(turns, list):
        raise BadInput(f"{loc}: 'conversations'/'messages' must be a list")
    rid = obj.get("id", default_id)
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
        raise BadInput(f"{loc}: 'id' must be a non-empty string or an integer")
    messages = [normalise_turn(t, f"{loc}: turn {k}") for k, t in enumerate(turns)]
    tools = obj.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadInput(f"{loc}: 'tools' must be a list of tool definitions")
    return Conversation(index, lineno, str(rid), messages, tools)


def iter_conversations(path: Path) -> Iterator[Conversation]:
    """Every conversation of a JSONL (or JSON array) file; ids default to `<stem>-<index>`."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such file")
    stem = path.stem
    if path.suffix == ".json":
        try:
            items = json.loads(path.read_bytes())
        except (ValueError, RecursionError) as exc:
            raise BadInput(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(items, list):
            raise BadInput(f"{path}: a .json input must hold a list of conversations")
        for index, obj in enumerate(items):
            yield parse_conversation(obj, path, None, index, f"{stem}-{index}")
        return
    index = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError as exc:
                raise BadInput(located(path, lineno, f"not valid JSON ({exc})")) from None
            except RecursionError:
                raise BadInput(
                    located(path, lineno, "not valid JSON (nested too deeply)")
                ) from None
            yield parse_conversation(obj, path, lineno, index, f"{stem}-{index}")
            index += 1
