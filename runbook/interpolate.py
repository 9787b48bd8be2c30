r"""`${name}` interpolation.

Shell strings (`substitute_shell`) come out twice. What runs passes every value to the shell as
an environment variable (`EAGLE_V_<name>`) referenced by a quoted expansion, so no value is
ever text the shell parses: outside quotes `"${EAGLE_V_x}"`, inside double quotes and in an
unquoted heredoc body `${EAGLE_V_x}` (an expansion's result is never re-parsed, so a value
holding `$(...)` or the heredoc's terminator line is just text). What is shown (confirmation,
dry run, audit) has the values inline, quoted for their context. Where an expansion cannot
work it is refused with the reason: inside single quotes, in arithmetic or `[[ ]]` (bash
evaluates a variable's value as an expression there), in double quotes after a `$(` or
backtick the lexer cannot follow. A quoted heredoc body is literal: the value is inserted as
text, and a value holding the terminator line is refused. A NUL byte is refused in any shell
value (no environment can carry it). Passing by reference keeps the job's own shell from
parsing a value; what keeps a *nested* parser (`sh -c STRING`, `eval`, `ssh HOST CMD`) from
reading one as code is its type: the loader splices only word-typed values, whose characters no
parser reads as syntax (runbook/value_types.py). `$${` writes a literal `${`; a lone `$` (e.g.
`$HOME`) is left for the shell.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from runbook.shell_lex import Body, heredoc_bodies

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


_PLAIN = re.compile(r"[A-Za-z0-9_./:=@%+,\-]*")  # one inert word in any context


def _certain(blanked: str, spans: list[tuple[int, int]], body: Body) -> bool:
    """The `<<` is a heredoc operator: not quoted, not in a comment, not arithmetic."""
    if any(a < body.op < b for a, b in spans):
        return False
    before = blanked[blanked.rfind("\n", 0, body.op) + 1 : body.op]
    return "#" not in before and "((" not in before


def _in_body(
    template: str, value: str, body: Body, name: str, certain: bool, by_ref: bool = False
) -> str:
    """The value as text in a heredoc body; by_ref: the body expands a reference to it instead
    (unquoted body), so a terminator line in the value is harmless."""
    if not certain and not _PLAIN.fullmatch(value):
        raise InterpolationError(
            f"${{{name}}} follows a `<<` that may or may not start a heredoc; its value has "
            "shell characters, so it is refused (move the `<<` or the placeholder)"
        )
    for line in value.split("\n") if not (by_ref and not body.quoted) else ():
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


VALUE_ENV_PREFIX = "EAGLE_V_"


@dataclass
class ShellText:
    """A shell string with its values: `run` executes them from `env`; `shown` has them inline."""

    shown: str
    run: str
    env: dict[str, str] = field(default_factory=dict)


def _env_name(name: str, env: dict[str, str], names: dict[str, str]) -> str:
    if name in names:
        return names[name]
    base = VALUE_ENV_PREFIX + name.replace(".", "_")
    var, n = base, 1
    while var in env:  # `a.b` and `a_b` are two values
        n += 1
        var = f"{base}_{n}"
    names[name] = var
    return var


def _open_in_line(blanked: str, pos: int, spans: list[tuple[int, int]]) -> str | None:
    """An arithmetic `((`/`$((` or a `[[` still open before pos on its line (outside quotes)."""
    start = blanked.rfind("\n", 0, pos) + 1
    text = "".join(
        " " if any(a <= i <= b for a, b in spans) else c
        for i, c in enumerate(blanked[start:pos], start)
    )
    if text.count("((") > text.count("))"):
        return "an arithmetic expression"
    if text.count("[[") > text.count("]]"):
        return "a [[ ]] test"
    return None


def _double_quoted(value: str) -> str:
    return "".join("\\" + c if c in '\\$`"' else c for c in value)


def placeholder_spans(template: str) -> list[tuple[int, int, str]]:
    """(start, end, name) of each well-formed `${name}` in template."""
    return [(m.start(), m.end(), m.group(1)) for m in _TOKEN.finditer(template) if m.group(1)]


def substitute_shell(template: str, lookup: Callable[[str], str]) -> ShellText:
    """Replace placeholders in a shell string; see the module docstring for each context."""
    bodies = heredoc_bodies(template)
    blanked = template
    for b in bodies:  # quotes inside a heredoc body are text, not shell quoting
        blanked = blanked[: b.start] + " " * (b.end - b.start) + blanked[b.end :]
    spans = _quoted_spans(blanked)
    shown: list[str] = []
    run: list[str] = []
    env: dict[str, str] = {}
    names: dict[str, str] = {}
    pos = 0
    for m in _TOKEN.finditer(template):
        shown.append(template[pos : m.start()])
        run.append(template[pos : m.start()])
        pos = m.end()
        if m.group(0) == "$${":
            shown.append("${")
            run.append("${")
            continue
        name = m.group(1)
        if name is None:
            raise InterpolationError(
                "unterminated or invalid `${...}`; write ${name} (or $${ for a literal)"
            )
        value = lookup(name)
        if "\0" in value:
            raise InterpolationError(f"the value of ${{{name}}} holds a NUL byte")
        body = next((b for b in bodies if b.start <= m.start() < b.end), None)
        span = next(((a, b) for a, b in spans if a < m.start() < b), None)
        if body is not None:
            certain = _certain(blanked, spans, body)
            text = _in_body(template, value, body, name, certain, by_ref=certain)
            shown.append(text)
            if body.quoted or not certain:
                run.append(text)  # a literal body (or an inert word): the text is the value
            else:
                run.append("${" + _env_name(name, env, names) + "}")
                env[names[name]] = value
            continue
        if span is not None:
            inner = blanked[span[0] + 1 : m.start()]
            if template[span[0]] == "'":
                raise InterpolationError(
                    f"${{{name}}} is inside quotes '...', where nothing expands; close the "
                    "quotes around it (its value is passed safely either way)"
                )
            if "$(" in inner or "`" in inner:
                raise InterpolationError(
                    f"${{{name}}} is inside double quotes after a `$(` or backtick; move it out "
                    "of the quotes (values are quoted for you)"
                )
            shown.append(_double_quoted(value))
            run.append("${" + _env_name(name, env, names) + "}")
        else:
            where = _open_in_line(blanked, m.start(), spans)
            if where is not None:
                raise InterpolationError(
                    f"${{{name}}} is inside {where}, where bash evaluates a value as code; "
                    'compute it outside (e.g. n=${x}; then use "$n")'
                )
            shown.append(shlex.quote(value))
            run.append('"${' + _env_name(name, env, names) + '}"')
        env[names[name]] = value
    shown.append(template[pos:])
    run.append(template[pos:])
    return ShellText("".join(shown), "".join(run), env)


def substitute(template: str, lookup: Callable[[str], str], shell: bool = False) -> str:
    """Replace placeholders; `lookup` raises InterpolationError for unknown names. With shell,
    the string shown to the operator (values inline, quoted); see substitute_shell."""
    if shell:
        return substitute_shell(template, lookup).shown
    out, pos = [], 0
    for m in _TOKEN.finditer(template):
        out.append(template[pos : m.start()])
        pos = m.end()
        if m.group(0) == "$${":
            out.append("${")
            continue
        if m.group(1) is None:
            raise InterpolationError(
                "unterminated or invalid `${...}`; write ${name} (or $${ for a literal)"
            )
        out.append(lookup(m.group(1)))
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
