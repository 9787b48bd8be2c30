"""The types of runbook values and the characters each may hold (docs/SAFETY.md, Values).

Every variable has a type: declared (`vars: {root: {type: path, value: /srv/x}}`) or inferred
from its default (`root: /srv/x`). A value is checked against its type where it enters: the
runbook's default, `--set`, a host's `vars:`, the fan-out variables. The types split in two:

- *word* types (path, name, integer, number, size, duration, bool, enum, url): their characters
  are `WORD_CHARS` at most, none of which any shell parser (sh, dash, bash, zsh, ksh) reads as
  syntax in any quoting context, and their first character cannot start an option, a tilde or
  `=` expansion, and a value is never `NAME=...` (an assignment). Such a value may be spliced
  into shell text and argv: wherever it lands it stays one inert word.
- `text`: anything but NUL. It reaches a command only through the environment (`env:`), never
  spliced into shell text or argv, where a program may read it as code (runbook/loader.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from runbook.units import parse_duration, parse_size

# No quotes, `$`, backquote, `\`, parentheses, `;&|<>`, blanks or newlines, `*?[]`, `{}`, `~`,
# `#`, `!`, `^` (a pipe in old shells, a glob in zsh): only these, whatever the quoting.
WORD_CHARS = "A-Za-z0-9_./:@%+,=-"
_WORD = re.compile(f"[{WORD_CHARS}]*")
# where an option, `+o`, `=cmd` (zsh), `%job`, `@`, `:` or `,` could be read: letters, digits,
# `_`, `.` and `/` only
_FIRST = re.compile(r"[A-Za-z0-9_./]")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")  # `NAME=...` assigns at a command's start
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_INTEGER = re.compile(r"[0-9]+")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_SIZE = re.compile(r"[0-9]+(?:\.[0-9]+)?[A-Za-z]*")
_URL = re.compile(r"[a-z][a-z0-9+.-]*://[" + WORD_CHARS + r"]+")
MAX_WORD = 4096


@dataclass(frozen=True)
class ValueType:
    name: str
    chars: str  # the characters it may hold, as the docs and messages state them
    example: str

    @property
    def splice_safe(self) -> bool:
        return self.name != "text"


TYPES: dict[str, ValueType] = {
    t.name: t
    for t in (
        ValueType(
            "path",
            "letters, digits and _ . / : @ % + , = - (starting with a letter, digit, _ . or /)",
            "/srv/data/run-1",
        ),
        ValueType(
            "name", "letters, digits and _ . - (starting with a letter, digit or _)", "gpu-a"
        ),
        ValueType("integer", "digits only", "8"),
        ValueType("number", "digits, one '.', an exponent (1e-4)", "0.25"),
        ValueType("size", "digits and a unit (500GiB, 2TB, 1048576)", "500GiB"),
        ValueType("duration", "digits and units (90s, 10m, 1h30m, 2d)", "1h30m"),
        ValueType("bool", "true or false", "true"),
        ValueType("enum", "one of the declared choices", "fast"),
        ValueType(
            "url",
            "scheme:// then letters, digits and _ . / : @ % + , = - (no ? & # ~)",
            "https://example.org/x",
        ),
        ValueType("text", "anything but a NUL byte", "any text"),
    )
}
TYPE_NAMES = tuple(TYPES)


def refusal(type_name: str, value: str, choices: Sequence[str] | None = None) -> str | None:
    """Why `value` is not a `type_name`, naming the refused characters; None when it is."""
    t = TYPES[type_name]
    if "\0" in value:
        return "a NUL byte cannot be passed to a command"
    if type_name == "text":
        return None
    if type_name == "enum":
        if value in (choices or ()):
            return None
        return f"{value!r} is not one of the choices: {', '.join(choices or ())}"
    bad = sorted(set(_WORD.sub("", value)))
    if bad:
        shown = " ".join(_show(c) for c in bad)
        return f"it holds {shown}, which a {t.name} may not hold ({t.name}: {t.chars})"
    if not value:  # inert in every context; an optional path (`drop: ""`) is empty
        return None if type_name == "path" else f"it is empty ({t.name}: {t.chars})"
    if len(value) > MAX_WORD:
        return f"it is longer than {MAX_WORD} characters"
    if not _FIRST.match(value) and type_name != "url":
        return (
            f"it starts with {value[0]!r}, where a program may read an option or the shell an "
            f"expansion ({t.name}: {t.chars}); write ./{value} for a relative path"
        )
    if _ASSIGNMENT.match(value) and type_name != "url":
        return "it starts with NAME=, which a shell reads as an assignment at a command's start"
    return _shape(type_name, value)


def _shape(type_name: str, value: str) -> str | None:
    if type_name == "path":
        return None
    if type_name == "name":
        return None if _NAME.fullmatch(value) else f"a name is {TYPES['name'].chars}"
    if type_name == "integer":
        return None if _INTEGER.fullmatch(value) else "an integer is digits only (e.g. 8)"
    if type_name == "number":
        return None if _NUMBER.fullmatch(value) else "a number is written like 0.25, 8 or 1e-4"
    if type_name == "bool":
        return None if value in ("true", "false") else "a bool is true or false"
    if type_name == "url":
        return None if _URL.fullmatch(value) else f"a url is {TYPES['url'].chars}"
    try:
        if type_name == "size":
            if not _SIZE.fullmatch(value):
                raise ValueError
            parse_size(value)
        else:
            parse_duration(value)
    except ValueError:
        return f"a {type_name} is written like {TYPES[type_name].example}"
    return None


def _show(c: str) -> str:
    if c == " ":
        return "a space"
    if c == "\n":
        return "a newline"
    if c == "\t":
        return "a tab"
    return repr(c) if c.isprintable() else f"{ord(c):#04x}"


def infer(default: object) -> str:
    """The type of a variable written without one, from its default as YAML gave it."""
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "integer" if default >= 0 else "text"
    if isinstance(default, float):
        return "number" if default >= 0 and default == default else "text"
    text = str(default)
    if re.match(r"[a-z][a-z0-9+.-]*://", text) and refusal("url", text) is None:
        return "url"
    return "path" if refusal("path", text) is None else "text"


REMEDY = (
    "declare it `{name}: {{type: text, value: ...}}` and pass it through the step's env "
    '(env: {{X: ${{{name}}}}}, read as "$X")'
)
