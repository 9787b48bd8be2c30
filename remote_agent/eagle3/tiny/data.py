"""Offline chat data with real structure, mined from the Python standard library's sources.

Three sources, in the shapes real datasets come in:

- `implement` (ShareGPT): "Implement `name` from `module`: <docstring summary>" -> the function's source
- `explain` (OpenAI messages): a function's source -> its docstring
- `modules` (SpecForge rows): "Show module X" -> a whole module (very long: the outlier source a
  real pipeline drops with `merge --drop`)

Deterministic for a given Python installation; every sample is unique by construction.
"""

from __future__ import annotations

import ast
import json
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Function:
    module: str
    name: str
    source: str
    doc: str


def stdlib_functions(max_source_chars: int = 1600) -> Iterator[Function]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.glob("*.py")):
        if path.name.startswith(("test", "_")):
            continue
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            source = ast.get_source_segment(text, node)
            if not doc or not source or len(source) > max_source_chars:
                continue
            yield Function(path.stem, node.name, source, doc.strip())


def _summary(doc: str) -> str:
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def prompts(limit: int, seed: int = 0) -> list[dict]:
    """User prompts (OpenAI messages, no assistant turn) for regeneration by a target."""
    funcs = list(stdlib_functions())
    random.Random(seed).shuffle(funcs)
    out = []
    for i, f in enumerate(funcs[:limit]):
        out.append(
            {
                "id": f"regen-{i:05d}",
                "messages": [
                    {
                        "role": "user",
                        "content": f"Implement `{f.name}` from `{f.module}`: {_summary(f.doc)}",
                    }
                ],
            }
        )
    return out


def write_sources(out_dir: Path, per_source: int, seed: int = 0) -> dict[str, Path]:
    """Write the three sources (ground-truth answers) as JSONL; returns name -> path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    funcs = list(stdlib_functions())
    rng = random.Random(seed)
    rng.shuffle(funcs)
    paths = {name: out_dir / f"{name}.jsonl" for name in ("implement", "explain", "modules")}
    with open(paths["implement"], "w") as f:
        for i, fn in enumerate(funcs[:per_source]):
            f.write(
                json.dumps(
                    {
                        "id": f"implement-{i:05d}",
                        "conversations": [
                            {
                                "from": "human",
                                "value": f"Implement `{fn.name}` from `{fn.module}`: {_summary(fn.doc)}",
                            },
                            {"from": "gpt", "value": fn.source},
                        ],
                    }
                )
                + "\n"
            )
    with open(paths["explain"], "w") as f:
        for i, fn in enumerate(funcs[per_source : 2 * per_source]):
            f.write(
                json.dumps(
                    {
                        "id": f"explain-{i:05d}",
                        "messages": [
                            {
                                "role": "system",
                                "content": "You explain Python code in one paragraph.",
                            },
                            {"role": "user", "content": f"What does this do?\n{fn.source}"},
                            {"role": "assistant", "content": fn.doc},
                        ],
                    }
                )
                + "\n"
            )
    root = Path(sysconfig.get_paths()["stdlib"])
    modules = [p for p in sorted(root.glob("*.py")) if not p.name.startswith(("test", "_"))]
    rng.shuffle(modules)
    with open(paths["modules"], "w") as f:
        for i, path in enumerate(modules[: max(2, per_source // 8)]):
            f.write(
                json.dumps(
                    {
                        "id": f"modules-{i:05d}",
                        "conversations": [
                            {
                                "role": "user",
                                "content": f"Show me the source of the `{path.stem}` module.",
                            },
                            {
                                "role": "assistant",
                                "content": path.read_text(encoding="utf-8", errors="replace")[
                                    :60000
                                ],
                            },
                        ],
                    }
                )
                + "\n"
            )
    return paths
