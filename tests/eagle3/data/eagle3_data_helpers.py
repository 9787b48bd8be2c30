"""Shared by the data-command tests (imported by name: pytest puts this directory on sys.path)."""

from __future__ import annotations

SYSTEM = "<|im_system|>system<|im_middle|>"
USER = "<|im_user|>user<|im_middle|>"
ASSISTANT = "<|im_assistant|>assistant<|im_middle|>"
END = "<|im_end|>"


def expected(tok, segments: list[tuple[str, int]]) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    mask: list[int] = []
    for text, m in segments:
        part = tok(text, add_special_tokens=False)["input_ids"]
        ids += part
        mask += [m] * len(part)
    return ids, mask
