"""compat.plain_extend against each release's real ForwardMode (the enum compiled from the wheel's
forward_batch_info.py): exactly EXTEND is the target's own prefill; verify, mixed, idle, split,
dLLM and draft forwards are not dumped."""

from __future__ import annotations

import ast
import enum
import functools
import importlib.util
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

FILE = "sglang/srt/model_executor/forward_batch_info.py"


def real_forward_mode(wheel):
    with zipfile.ZipFile(wheel) as z:
        tree = ast.parse(z.read(FILE).decode())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ForwardMode")
    ns = {"IntEnum": enum.IntEnum, "auto": enum.auto, "functools": functools}
    exec(compile(ast.Module([cls], []), FILE, "exec"), ns)
    return ns["ForwardMode"]


def test_only_extend_is_dumped(sglang_release):
    _, wheel = sglang_release
    spec = importlib.util.spec_from_file_location(
        "compat_under_test", REPO / "patches" / "eagle3_dump" / "compat.py"
    )
    compat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compat)
    mode = real_forward_mode(wheel)
    dumped = {m.name for m in mode if compat.plain_extend(m)}
    assert dumped == {"EXTEND"}
    assert {"TARGET_VERIFY", "MIXED", "DECODE", "IDLE"} <= {m.name for m in mode}
