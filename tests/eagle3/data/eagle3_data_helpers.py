"""Shared by the data-command tests (imported by name: pytest puts this directory on sys.path)."""

from __future__ import annotations

import contextlib
import io
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote_agent.eagle3.cli import main
from remote_agent.eagle3.progress import parse

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


@dataclass
class CliRun:
    rc: int
    stderr: str
    result: dict[str, Any] | None
    progress: list[dict[str, Any]]

    @property
    def error(self) -> str:
        """The `eagle3 <cmd>: error: ...` line, without its prefix."""
        for line in self.stderr.splitlines():
            if ": error: " in line:
                return line.split(": error: ", 1)[1]
        return ""


def run_cli(*argv: object) -> CliRun:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    records = [r for r in map(parse, err.getvalue().splitlines()) if r]
    results = [r for r in records if r["kind"] == "result"]
    return CliRun(
        rc,
        err.getvalue(),
        results[-1] if results else None,
        [r for r in records if r["kind"] == "progress"],
    )


def record_line(rid: str, source: str, ids: list[int], mask: list[int]) -> str:
    return json.dumps(
        {"id": rid, "source": source, "input_ids": ids, "loss_mask": mask}, separators=(",", ":")
    )


def write_records(
    path: Path, records: list[tuple[str, list[int], list[int]]], source: str = "x"
) -> Path:
    path.write_text("".join(record_line(r, source, i, m) + "\n" for r, i, m in records))
    return path


def random_records(
    n: int, seed: int, prefix: str, vocab: int = 2048, max_len: int = 300
) -> list[tuple[str, list[int], list[int]]]:
    rng = random.Random(seed)
    out = []
    for k in range(n):
        length = rng.randint(3, max_len)
        ids = [rng.randrange(vocab) for _ in range(length)]
        mask = [int(rng.random() < 0.6) for _ in range(length)]
        mask[0] = 1  # something trainable before the last position
        out.append((f"{prefix}-{k}", ids, mask))
    return out
