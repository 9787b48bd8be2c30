"""A best-effort lexer for the shell strings of runbooks: heredoc bodies, words and commands.

Not bash's parser: enough structure for two questions the interpolation asks, namely in which
quoting context a placeholder sits (heredoc bodies) and which text a command hands to another
parser as code (runbook/shell_code.py). Every simple command at every nesting level (`$(...)`,
backticks, `( )`, `<(...)`) is listed with its words (offsets into the string, the text after
quote removal, whether the shell expands something in it), the text it reads on stdin from a
heredoc or here-string, and the text before it in its pipeline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# the delimiter word: quoted runs or plain characters up to a blank or an operator
_HEREDOC = re.compile(r"""<<(-?)[ \t]*((?:'[^'\n]*'|"[^"\n]*"|\\.|[^\s;&|<>()'"\\])+)""")


@dataclass(frozen=True)
class Body:
    start: int
    end: int
    delimiter: str
    quoted: bool  # a quoted delimiter: the body is literal text
    strip_tabs: bool  # `<<-`
    op: int  # where its `<<` is


def heredoc_bodies(template: str) -> list[Body]:
    """Heredoc bodies of a shell string (best effort: operators inside quotes count too)."""
    bodies: list[Body] = []
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
                Body(start, end, delim, quoted, bool(op.group(1)), offsets[i_op] + op.start())
            )
            i += 1
    return bodies


@dataclass
class Word:
    start: int
    end: int
    text: str  # after quote removal; expansions kept as written
    dynamic: bool  # the shell expands something in it ($x, ${x}, $(...), backticks)
    procsub: bool = False  # it is a process substitution `<(...)`


@dataclass
class Command:
    words: list[Word] = field(default_factory=list)
    inputs: list[tuple[int, int, bool]] = field(default_factory=list)  # stdin text, dynamic?
    # piped into: the text before it in its list and that text's heredoc bodies (conservative)
    piped_from: list[tuple[int, int]] = field(default_factory=list)


_REDIR = re.compile(r"<<<|<<-|<<|<>|<&|>&|>>|>\||<|>")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BREAK = " \t\n;&|<>()"


class _Lexer:
    def __init__(self, s: str) -> None:
        self.s, self.n = s, len(s)
        self.bodies = {b.op: b for b in heredoc_bodies(s)}
        # the lexer jumps over a body and its terminator line
        self.skip = {}
        for b in self.bodies.values():
            nl = s.find("\n", b.end)
            self.skip[b.start] = self.n if nl < 0 else nl
        self.commands: list[Command] = []

    def seq(self, i: int, close: str | None) -> int:
        """Commands from i up to `close` (`)` or a backtick) or the end; the index after it."""
        s, n = self.s, self.n
        start = i
        cmd = Command()
        piped_from: list[tuple[int, int]] = []
        while i < n:
            if i in self.skip:
                i = self.skip[i]
                continue
            c = s[i]
            if c in " \t":
                i += 1
            elif s.startswith("\\\n", i):
                i += 2
            elif close is not None and c == close:
                self._finish(cmd, piped_from)
                return i + 1
            elif c == "#":
                nl = s.find("\n", i)
                i = n if nl < 0 else nl
            elif c in "\n;" or s.startswith("&&", i) or s.startswith("||", i):
                self._finish(cmd, piped_from)
                cmd, piped_from = Command(), []
                i += 2 if s.startswith(("&&", "||", ";;"), i) else 1
            elif c == "&" and not s.startswith("&>", i):
                self._finish(cmd, piped_from)
                cmd, piped_from = Command(), []
                i += 1
            elif c == "|":
                self._finish(cmd, piped_from)
                # conservative: everything before the pipe in this list may feed the reader
                piped_from = [(start, i)] + [
                    (b.start, b.end) for b in self.bodies.values() if start <= b.op < i
                ]
                cmd = Command()
                i += 2 if s.startswith("|&", i) else 1
            elif s.startswith("((", i):
                i = self._balanced(i, "((", "))")
            elif c == "(":
                i = self.seq(i + 1, ")")
            elif c == ")":
                i += 1  # a `case` pattern or a stray parenthesis
            elif c in "<>" and not s.startswith(("<(", ">("), i) or s.startswith("&>", i):
                i = self._redirect(i, cmd)
            else:
                w, i = self.word(i)
                if w.text.isdigit() and not w.dynamic and s[i : i + 1] in ("<", ">"):
                    continue  # a file descriptor number (2>&1)
                cmd.words.append(w)
        self._finish(cmd, piped_from)
        return n

    def _finish(self, cmd: Command, piped_from: list[tuple[int, int]]) -> None:
        if cmd.words or cmd.inputs:
            cmd.piped_from = piped_from
            self.commands.append(cmd)

    def _redirect(self, i: int, cmd: Command) -> int:
        s = self.s
        if s.startswith("&>", i):
            i += 3 if s.startswith("&>>", i) else 2
            op = ">"
        else:
            m = _REDIR.match(s, i)
            assert m is not None
            op = m.group(0)
            i = m.end()
        if op in ("<<", "<<-"):
            body = self.bodies.get(i - len(op))
            if body is not None:
                text = s[body.start : body.end]
                dynamic = not body.quoted and ("$" in text or "`" in text)
                cmd.inputs.append((body.start, body.end, dynamic))
        while i < self.n and s[i] in " \t":
            i += 1
        if i >= self.n or s[i] in "\n;&|":
            return i
        w, i = self.word(i)
        if op == "<<<":
            cmd.inputs.append((w.start, w.end, w.dynamic))
        return i

    def word(self, i: int) -> tuple[Word, int]:
        s, n = self.s, self.n
        start, parts, dynamic, procsub = i, [], False, False
        while i < n:
            c = s[i]
            if c in "<>" and s.startswith(("<(", ">("), i):
                procsub = procsub or (i == start and c == "<")
                j = self.seq(i + 2, ")")
                parts.append(s[i:j])
                dynamic, i = True, j
                continue
            if c in _BREAK:
                break
            if c == "\\":
                parts.append(s[i + 1 : i + 2])
                i += 2
            elif s.startswith("$'", i):
                j = i + 2
                while j < n and s[j] != "'":
                    j += 2 if s[j] == "\\" else 1
                parts.append(s[i + 2 : j])
                i = j + 1
            elif c == "'":
                j = s.find("'", i + 1)
                j = n if j < 0 else j
                parts.append(s[i + 1 : j])
                i = j + 1
            elif c == '"':
                i, text, dyn = self._dquote(i + 1)
                parts.append(text)
                dynamic = dynamic or dyn
            elif c in "$`":
                j = self._expansion(i)
                if j > i:
                    parts.append(s[i:j])
                    dynamic, i = True, j
                else:
                    parts.append(c)
                    i += 1
            else:
                parts.append(c)
                i += 1
        return Word(start, i, "".join(parts), dynamic, procsub), i

    def _dquote(self, i: int) -> tuple[int, str, bool]:
        s, n = self.s, self.n
        parts, dynamic = [], False
        while i < n and s[i] != '"':
            if s[i] == "\\" and s[i + 1 : i + 2] in ('"', "\\", "$", "`", "\n"):
                parts.append(s[i + 1])
                i += 2
                continue
            if s[i] in "$`":
                j = self._expansion(i)
                if j > i:
                    parts.append(s[i:j])
                    dynamic, i = True, j
                    continue
            parts.append(s[i])
            i += 1
        return i + 1, "".join(parts), dynamic

    def _expansion(self, i: int) -> int:
        """The end of the expansion at i, or i when the `$` there is literal."""
        s = self.s
        if s[i] == "`":
            return self.seq(i + 1, "`")
        if s.startswith("$((", i):
            return self._balanced(i + 1, "((", "))")
        if s.startswith("$(", i):
            return self.seq(i + 2, ")")
        if s.startswith("${", i):
            return self._balanced(i + 1, "{", "}")
        m = _NAME.match(s, i + 1)
        if m:
            return m.end()
        if s[i + 1 : i + 2] and s[i + 1] in "0123456789@*#?$!-":
            return i + 2
        return i

    def _balanced(self, i: int, opening: str, closing: str) -> int:
        """Past the `closing` that matches the `opening` at i (quotes not tracked)."""
        depth, j = 0, i
        while j < self.n:
            if self.s.startswith(opening, j):
                depth += 1
                j += len(opening)
            elif self.s.startswith(closing, j):
                depth -= 1
                j += len(closing)
                if depth == 0:
                    return j
            else:
                j += 1
        return self.n


def commands(text: str) -> list[Command]:
    """Every simple command of a shell string, nested ones included (see the module doc)."""
    lx = _Lexer(text)
    lx.seq(0, None)
    return lx.commands


def argv_command(argv: list[str]) -> Command:
    """An argv list (no shell in between) as one command: offsets are element indexes."""
    return Command([Word(k, k + 1, a, False) for k, a in enumerate(argv)])
