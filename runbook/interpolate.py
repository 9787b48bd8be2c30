r"""`${name}` interpolation. In shell strings every value is inserted shell-quoted, so no value can
inject shell syntax; a placeholder inside quotes is refused (it would be quoted twice or not at
all). Inside a heredoc body quotes mean nothing, so there a value is inserted escaped for that
body (`\\`, `\$`, `` \` `` in an unquoted one; as is in a quoted one) and a value holding a
line equal to the terminator is refused. A NUL byte is refused in any shell value.
`$${` writes a literal `${`; a lone `$` (e.g. `$HOME`) is left for the shell.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass

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


# the delimiter word: quoted runs or plain characters up to a blank or an operator
_HEREDOC = re.compile(r"""<<(-?)[ \t]*((?:'[^'\n]*'|"[^"\n]*"|\\.|[^\s;&|<>()'"\\])+)""")


@dataclass(frozen=True)
class _Body:
    start: int
    end: int
    delimiter: str
    quoted: bool  # a quoted delimiter: the body is literal text
    strip_tabs: bool  # `<<-`
    op: int  # where its `<<` is


def _heredoc_bodies(template: str) -> list[_Body]:
    """Heredoc bodies of a shell string (best effort: operators inside quotes count too)."""
    bodies: list[_Body] = []
    lines = [line + "\n" for line in template.split("\n")]
    lines[-1] = lines[-1][:-1]
    offsets, pos = [], 0
    for line in lines:
        offsets.append(pos)
        pos += len(line)
    i = 0
    while i < len(lines):
        ops = list(_HEREDOC.finditer(lines[i]))
        i_op = i
        i += 1
        for op in ops:
            if op.start() and lines[i_op][op.start() - 1] == "<":
                continue  # `<<<` is a here-string, not a heredoc
            word = op.group(2)
            quoted = any(c in word for c in "'\"\\")  # bash: any quoting makes the body literal
            delim = re.sub(r"""\\(.)|['"]""", lambda m: m.group(1) or "", word)
            start = offsets[i] if i < len(lines) else len(template)
            while i < len(lines):
                text = lines[i].rstrip("\n")
                if (text.lstrip("\t") if op.group(1) else text) == delim:
                    break
                i += 1
            end = offsets[i] if i < len(lines) else len(template)
            bodies.append(
                _Body(start, end, delim, quoted, bool(op.group(1)), offsets[i_op] + op.start())
            )
            i += 1
    return bodies


_PLAIN = re.compile(r"[A-Za-z0-9_./:=@%+,\-]*")  # one inert word in any context


def _certain(blanked: str, spans: list[tuple[int, int]], body: _Body) -> bool:
    """The `<<` is a heredoc operator: not quoted, not in a comment, not arithmetic."""
    if any(a < body.op < b for a, b in spans):
        return False
    before = blanked[blanked.rfind("\n", 0, body.op) + 1 : body.op]
    return "#" not in before and "((" not in before


def _in_body(template: str, value: str, body: _Body, name: str, certain: bool) -> str:
    if not certain and not _PLAIN.fullmatch(value):
        raise InterpolationError(
            f"${{{name}}} follows a `<<` that may or may not start a heredoc; its value has "
            "shell characters, so it is refused (move the `<<` or the placeholder)"
        )
    for line in value.split("\n"):
        if (line.lstrip("\t") if body.strip_tabs else line) == body.delimiter:
            raise InterpolationError(
                f"the value of ${{{name}}} holds a line {body.delimiter!r} that would end the heredoc"
            )
    if body.quoted:
        return value
    return value.replace("\\", "\\\\").replace("$", "\\$").replace("`", "\\`")


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
    bodies = _heredoc_bodies(template) if shell else []
    blanked = template
    for b in bodies:  # quotes inside a heredoc body are text, not shell quoting
        blanked = blanked[: b.start] + " " * (b.end - b.start) + blanked[b.end :]
    spans = _quoted_spans(blanked) if shell else []
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
        body = next((b for b in bodies if b.start <= m.start() < b.end), None)
        if body is None and any(a < m.start() < b for a, b in spans):
            raise InterpolationError(
                f"${{{name}}} is inside quotes in a shell command; remove the quotes: values are quoted for you"
            )
        value = lookup(name)
        if shell and "\0" in value:
            raise InterpolationError(f"the value of ${{{name}}} holds a NUL byte")
        if body is not None:
            out.append(_in_body(template, value, body, name, _certain(blanked, spans, body)))
        else:
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
