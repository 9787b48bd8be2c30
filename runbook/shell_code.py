"""A lint: where a command hands text to another parser as code (`sh -c STRING`, `eval`,
`ssh HOST CMD`, `su -c`, `python -c`, an awk program, a sed script, text piped into `bash`, ...).

This is not the defence. What keeps values data is their type (runbook/value_types.py): only a
word-typed value is ever spliced into shell text or argv, and a word cannot carry syntax into
any parser; text goes through the environment. A table of commands cannot be complete (an
unknown wrapper, a program that runs an option's value), so what it finds is reported by
`validate` as a located warning: a word in code still names a command or an expression there.
Arguments after the code (`bash -c '... "$1"' _ ${x}`) are data: that is the form it suggests.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from runbook.shell_lex import Command, Word, argv_command, commands

SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "fish", "busybox"}
# command -> the options that take a value (skipped with it) before the command it runs
WRAPPERS: dict[str, set[str]] = {
    "env": {"-u", "--unset", "-C", "--chdir"},
    "nohup": set(),
    "nice": {"-n", "--adjustment"},
    "ionice": {"-c", "-n", "-p", "--class", "--classdata"},
    "timeout": {"-s", "--signal", "-k", "--kill-after"},
    "stdbuf": {"-i", "-o", "-e"},
    "setsid": set(),
    "exec": {"-a"},
    "command": set(),
    "builtin": set(),
    "time": {"-f", "-o"},
    "xargs": {"-I", "-L", "-n", "-P", "-s", "-d", "-E", "-a", "--max-args", "--max-procs"},
    "flock": {"-w", "--timeout", "-E", "--conflict-exit-code"},
    "taskset": {"-c"},
    "chrt": set(),
    "numactl": {"-C", "-N", "-m", "-i", "-p", "--physcpubind", "--cpunodebind", "--membind"},
    "chroot": set(),
    "sudo": {"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T", "--user", "--group"},
    "doas": {"-u", "-C"},
    "find": set(),  # its `-exec`/`-execdir`/`-ok` start the command
}
# the first positional word of these is theirs, not the command (timeout 5 cmd, flock f cmd)
WRAPPER_POSITIONALS = {"timeout": 1, "flock": 1, "taskset": 1, "chrt": 1, "chroot": 1}
ENV_DROPPING = {"sudo", "doas"}  # the command does not see our environment
# the whole rest of the command is code for another shell
REST_IS_CODE = {
    "eval": "`eval` parses its arguments as shell code",
    "ssh": "`ssh` hands its command (and its destination's options) to the remote shell",
    "su": "`su` runs its command through another user's shell",
    "runuser": "`runuser` runs its command through another user's shell",
    "watch": "`watch` runs its arguments through `sh -c`",
    "tmux": "`tmux` runs its commands through a shell",
    "screen": "`screen` runs its command in a new shell session",
    "parallel": "`parallel` runs its commands through a shell",
    "script": "`script -c` runs its command through a shell",
    "machinectl": "`machinectl shell` runs its command through a shell",
}
# interpreter -> (option letters whose value is a program, options taking a value, long forms)
INTERPRETERS: dict[str, tuple[str, set[str], set[str]]] = {
    "python": ("c", {"-W", "-X"}, set()),
    "perl": ("eE", set(), set()),
    "ruby": ("e", {"-r", "-I"}, set()),
    "node": ("ep", {"-r", "--require"}, {"--eval", "--print"}),
    "php": ("r", {"-c", "-d"}, set()),
    "lua": ("e", {"-l"}, set()),
    "Rscript": ("e", set(), set()),
}
AWKS = {"awk", "gawk", "mawk", "nawk", "busybox-awk"}
SEDS = {"sed", "gsed"}


@dataclass(frozen=True)
class Code:
    """A span (offsets of the shell string, or argv indexes) that another parser runs."""

    start: int
    end: int
    dynamic: bool  # the shell builds it at run time
    why: str  # who parses it
    instead: str  # what to write instead (`{v}` is the placeholder)


def _name(w: Word) -> str | None:
    if w.dynamic:
        return None
    base = os.path.basename(w.text)
    return "python" if re.fullmatch(r"python[0-9.]*", base) else base


def _is_assignment(w: Word) -> bool:
    return re.match(r"[A-Za-z_][A-Za-z0-9_]*\+?=", w.text) is not None


def _span(words: Sequence[Word], dynamic: bool | None = None) -> tuple[int, int, bool]:
    dyn = any(w.dynamic for w in words) if dynamic is None else dynamic
    return words[0].start, words[-1].end, dyn


ARG_INSTEAD = 'pass it as an argument after the code and use "$1" there: {c} -c \'... "$1"\' _ {v}'
STDIN_INSTEAD = (
    "pass it as an argument: {c} -s -- {v} <<'EOF' (a quoted heredoc, the value as \"$1\")"
)


def _shell(cmd: Command, k: int, name: str, how: str) -> list[Code]:
    """`sh [opts] -c CODE [name args...]`: CODE is code, the rest data. Without -c, a script
    file (data) or, with -s or no argument at all, the commands on stdin."""
    words = cmd.words
    flags, i = "", k + 1
    while i < len(words):
        t = words[i].text
        if t in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
            i += 2
        elif t == "--":
            i += 1
            break
        elif t.startswith(("-", "+")) and len(t) > 1 and not words[i].dynamic:
            flags += "" if t.startswith("--") else t[1:]
            i += 1
        else:
            break
    if "c" in flags:
        if i >= len(words):
            return []
        why = f"`{name} -c` parses its command string{how}"
        return [Code(*_span(words[i : i + 1]), why, ARG_INSTEAD.replace("{c}", name))]
    if i < len(words) and "s" not in flags:
        if words[i].procsub:  # bash <(...): the substituted text is the script
            why = f"`{name}` runs this as a script{how}"
            return [Code(*_span(words[i : i + 1]), why, STDIN_INSTEAD.replace("{c}", name))]
        return []  # a script file, and its arguments
    why = f"`{name}` reads its commands from this input{how}"
    return _stdin(cmd, why, STDIN_INSTEAD.replace("{c}", name))


def _stdin(cmd: Command, why: str, instead: str) -> list[Code]:
    out = [Code(a, b, dyn, why, instead) for a, b, dyn in cmd.inputs]
    out += [Code(a, b, True, why + " (piped in)", instead) for a, b in cmd.piped_from]
    return out


def _interpreter(cmd: Command, k: int, name: str, how: str) -> list[Code]:
    """`python -c CODE`, `perl -ne CODE`, `node --eval CODE`: the program is code, the words
    after it data; `-` or no script at all: the program comes on stdin."""
    letters, value_opts, longs = INTERPRETERS[name]
    words = cmd.words
    instead = (
        "pass it as an argument after the program (sys.argv[1], $ARGV[0], process.argv, ...): "
        f"{name} -{letters[0]} '...' {{v}}"
    )
    why = f"`{name}` parses it as a program{how}"
    i = k + 1
    while i < len(words):
        t = words[i].text
        if t in longs:
            return [Code(*_span(words[i + 1 : i + 2]), why, instead)] if i + 1 < len(words) else []
        if t in value_opts:
            i += 2
            continue
        if t == "-m" and name == "python":
            return []  # a module and its arguments
        if t.startswith("-") and not t.startswith("--") and len(t) > 1:
            at = next((n for n, ch in enumerate(t) if n and ch in letters), None)
            if at is not None:  # -c CODE, -ne CODE, or the code attached: -c'print(1)'
                code = words[i : i + 1] if at + 1 < len(t) else words[i + 1 : i + 2]
                return [Code(*_span(code), why, instead)] if code else []
            i += 1
            continue
        if t.startswith("--"):
            i += 1
            continue
        if t != "-":
            return []  # a script file and its arguments
        break
    return _stdin(cmd, f"`{name}` reads its program from this input{how}", instead)


def _awk_sed(cmd: Command, k: int, name: str, how: str) -> list[Code]:
    words = cmd.words
    is_awk = name in AWKS
    program_opts = {"-e", "--source"} if is_awk else {"-e", "--expression"}
    value_opts = {"-F", "-v", "-f", "--file"} if is_awk else {"-f", "--file", "-l"}
    why = (
        f"`{name}` parses its program"
        if is_awk
        else f"`{name}` parses its script (its `e` command and flag run shell commands)"
    ) + how
    instead = (
        "pass it in the environment: X={v} awk '... ENVIRON[\"X\"] ...'"
        if is_awk
        else "build no sed script from a value; pass it as data instead, e.g. "
        "X={v} awk '{ gsub(/old/, ENVIRON[\"X\"]) } 1'"
    )
    out, i, from_file = [], k + 1, False
    while i < len(words):
        t = words[i].text
        if t in program_opts and i + 1 < len(words):
            out.append(Code(*_span(words[i + 1 : i + 2]), why, instead))
            i += 2
            continue
        if t in value_opts:
            from_file = from_file or t in ("-f", "--file")
            i += 2
            continue
        if t.startswith(("-e", "--expression=", "--source=")) and not t.startswith("--e"):
            out.append(Code(*_span(words[i : i + 1]), why, instead))
        elif not t.startswith("-") or t == "-":
            if not out and not from_file:
                out.append(Code(*_span(words[i : i + 1]), why, instead))
            break
        i += 1
    return out


RESERVED = {"if", "then", "else", "elif", "do", "while", "until", "!", "{", "}"}
EXEC_OPTS = {"-exec", "-execdir", "-ok", "-okdir"}  # find's options that start a command


def code_spans(cmd: Command) -> list[Code]:
    """The parts of one command that another parser runs as code: the command itself after
    any wrappers (env, sudo, timeout, xargs, find -exec, ...), classified by `_runs_code`."""
    words = cmd.words
    k = 0
    while k < len(words) and (words[k].text in RESERVED or _is_assignment(words[k])):
        k += 1
    how, xargs = "", False
    while k < len(words):
        name = _name(words[k])
        if name not in WRAPPERS:
            break
        rest = words[k + 1 :]
        if name in ENV_DROPPING:
            how = f" (and `{name}` does not pass the environment on)"
        if name == "env" and any(x.text in ("-i", "-", "--ignore-environment") for x in rest):
            how = " (and `env -i` drops the environment)"
        if name == "env" and any(x.text.startswith(("-S", "--split-string")) for x in rest):
            return [Code(*_span(rest), "`env -S` splits its string", "pass it as an argument")]
        if name == "sudo" and any(x.text in ("-s", "-i", "--shell", "--login") for x in rest):
            why = "`sudo -s/-i` runs its command through a shell"
            return [Code(*_span(rest), why, REST_INSTEAD["su"])] if rest else []
        xargs = xargs or name == "xargs"
        if name == "find":
            ex = next((j for j in range(k + 1, len(words)) if words[j].text in EXEC_OPTS), None)
            if ex is None:
                return []
            k = ex + 1
        else:
            k = _skip_wrapper_args(words, k + 1, name)
    out = _runs_code(cmd, k, how)
    if xargs and _code_runner(words[k] if k < len(words) else None):
        # its input becomes arguments (with -I: text) of that command, its code included
        why = "`xargs` turns this input into arguments of a command that runs code"
        out += _stdin(cmd, why, "pass the value as an argument directly, without xargs")
    return out


def _code_runner(w: Word | None) -> bool:
    name = _name(w) if w is not None else ""
    return (
        name is None
        or name in SHELLS
        or name in REST_IS_CODE
        or name in INTERPRETERS
        or (name in AWKS or name in SEDS)
    )


def _runs_code(cmd: Command, k: int, how: str) -> list[Code]:
    words = cmd.words
    if k >= len(words):
        return []
    name = _name(words[k])
    if name is None:  # a command name the shell computes: `$SHELL -c ...` is code too
        return _shell(cmd, k, "<computed command>", how)
    if name in SHELLS:
        return _shell(cmd, k, name, how)
    if name in REST_IS_CODE:
        return _rest_is_code(cmd, k, name, how)
    if name in INTERPRETERS:
        return _interpreter(cmd, k, name, how)
    if name in AWKS or name in SEDS:
        return _awk_sed(cmd, k, name, how)
    if name in (".", "source") and k + 1 < len(words) and words[k + 1].procsub:
        why = f"`{name}` runs this as a script"
        return [Code(*_span(words[k + 1 : k + 2]), why, "pass it as an argument of a script")]
    # an unknown command may still run a shell on its arguments (mpirun, docker exec ...)
    for j in range(k + 1, len(words) - 1):
        shell = _name(words[j])
        if shell in SHELLS and re.fullmatch(r"-[a-z]*c[a-z]*", words[j + 1].text):
            return _shell(cmd, j, shell, f" (run by `{name}`)")
    return []


SSH_VALUE_OPTS = {f"-{c}" for c in "BbcDEeFIiJLlmOopQRSWw"}
REST_INSTEAD = {
    "eval": "keep the value in a variable that eval expands: v={v}; eval 'cmd \"$v\"'",
    "ssh": "send it on stdin, with the destination written literally: "
    "printf '%s' {v} | ssh HOST 'v=$(cat); cmd \"$v\"'",
    "su": "send it on stdin: printf '%s' {v} | su USER -c 'v=$(cat); cmd \"$v\"'",
}


def _rest_is_code(cmd: Command, k: int, name: str, how: str) -> list[Code]:
    """`eval ARGS`, `ssh [opts] DEST [CMD]`, `su ... -c CMD`, ...: every argument is code (for
    ssh the destination too: a value there can be an option such as -oProxyCommand=...)."""
    rest = cmd.words[k + 1 :]
    why = REST_IS_CODE[name] + how
    instead = REST_INSTEAD.get(
        "su" if name == "runuser" else name,
        "put the command in a script and pass the value as its argument",
    )
    out = [Code(*_span(rest), why, instead)] if rest else []
    if name == "ssh":
        positional, i = 0, 0
        while i < len(rest):
            t = rest[i].text
            i += 2 if t in SSH_VALUE_OPTS else 1
            positional += not t.startswith("-")
        no_command = positional <= 1
    else:
        no_command = name in ("su", "runuser") and not any(
            w.text in ("-c", "--command") for w in rest
        )
    if no_command:  # a login shell there reads its commands from stdin
        out += _stdin(cmd, f"`{name}` without a command runs what it reads here" + how, instead)
    return out


def _skip_wrapper_args(words: Sequence[Word], i: int, name: str) -> int:
    takes_value = WRAPPERS[name]
    positionals = WRAPPER_POSITIONALS.get(name, 0)
    while i < len(words):
        t = words[i].text
        if t == "--":
            return i + 1
        if t in takes_value:
            i += 2
        elif (t.startswith("-") and len(t) > 1) or (name == "env" and "=" in t):
            i += 1
        elif positionals:
            positionals -= 1
            i += 1
        else:
            return i
    return i


def lint(text: str) -> list[str]:
    """Warnings for the shell string `text`: each placeholder inside code that another parser
    runs. Not the defence (a value there is word-typed, so it stays one inert word: see
    runbook/value_types.py), but such a word still names a command or an expression there."""
    from runbook.interpolate import placeholder_spans

    values = placeholder_spans(text)
    codes = [code for cmd in commands(text) for code in code_spans(cmd)] if values else []
    out = []
    for start, end, name in values:
        code = next((c for c in codes if c.start <= start and end <= c.end), None)
        if code is not None:
            out.append(_message(code, name))
    return out


def argv_lint(argv: Sequence[str], values: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
    """The same for a `run:` list (no shell): (element index, warning) per value in code."""
    out = []
    for code in code_spans(argv_command(list(argv))):
        out += [(k, _message(code, name)) for k, name in values if code.start <= k < code.end]
    return out


def _message(code: Code, name: str) -> str:
    return (
        f"${{{name}}} is in code another program runs ({code.why}): its value, one word, "
        "would name a command or an expression there; "
        + code.instead.replace("{v}", f"${{{name}}}")
    )
