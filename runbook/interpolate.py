"""`${name}` interpolation. In shell strings every value is inserted shell-quoted, so no value can
inject shell syntax; a placeholder inside quotes is refused (it would be quoted twice or not at
all). `$${` writes a literal `${`; a lone `$` (e.g. `$HOME`) is left for the shell.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping

NAME = r"[A-Za-z_][A-Za-z0-9_.]*"
_TOKEN = re.compile(r"\$\$\{|\$\{(" + NAME + r")\}|\$\{")


class InterpolationError(ValueError):
    pass


def placeholders(template: str) -> list[str]:
    """Names referenced by `${...}` in template, in order (escapes skipped)."""
    names = []
    for m in _TOKEN.finditer(template):
        if m.group(0) == "$${":
            continue
        if m.group(1) is None:
            raise InterpolationError(
                "unterminated or invalid `${...}`; write ${name} (or $${ for a literal)"
            )
        names.append(m.group(1))
    return names


def _quoted_spans(template: str) -> list[tuple[int, int]]:
    """Spans of single/double-quoted regions of a POSIX shell string (best effort, no nesting)."""
    spans, i, n = [], 0, len(template)
    while i < n:
        c = template[i]
        if c == "\\":
            i += 2
            continue
        if c in "'\"":
            j = i + 1
            while j < n and template[j] != c:
                j += 2 if (c == '"' and template[j] == "\\") else 1
            spans.append((i, j))
            i = j + 1
            continue
        i += 1
    return spans


def substitute(
    template: str,
    lookup: Callable[[str], str],
    shell: bool = False,
) -> str:
    """Replace placeholders; `lookup` raises InterpolationError for unknown names."""
    spans = _quoted_spans(template) if shell else []
    out, pos = [], 0
    for m in _TOKEN.finditer(template):
        out.append(template[pos : m.start()])
        pos = m.end()
        if m.group(0) == "$${":
            out.append("${")
            continue
        name = m.group(1)
        if name is None:
            raise InterpolationError(
                "unterminated or invalid `${...}`; write ${name} (or $${ for a literal)"
            )
        if any(a < m.start() < b for a, b in spans):
            raise InterpolationError(
                f"${{{name}}} is inside quotes in a shell command; remove the quotes: values are quoted for you"
            )
        value = lookup(name)
        out.append(shlex.quote(value) if shell else value)
    out.append(template[pos:])
    return "".join(out)


def as_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def resolve_vars(raw: Mapping[str, object], builtins: Mapping[str, str]) -> dict[str, str]:
    """Resolve vars that reference other vars (or builtins); cycles and unknown names are errors.

    Raises InterpolationError whose args are (message, var name).
    """
    resolved: dict[str, str] = dict(builtins)
    visiting: list[str] = []

    def get(name: str) -> str:
        if name in resolved:
            return resolved[name]
        if name not in raw:
            raise InterpolationError(
                f"undefined variable {name!r}", visiting[-1] if visiting else name
            )
        if name in visiting:
            cycle = " -> ".join(visiting[visiting.index(name) :] + [name])
            raise InterpolationError(f"variables reference each other in a cycle: {cycle}", name)
        visiting.append(name)
        value = raw[name]
        text = substitute(value, get) if isinstance(value, str) else as_text(value)
        visiting.pop()
        resolved[name] = text
        return text

    for name in raw:
        get(name)
    return resolved
