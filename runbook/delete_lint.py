"""A `run:` (or `command` guard) that deletes a path is refused: deleting is the delete action's.

The product can only promise "deletes exactly what was measured" for what the agent deletes
itself (`delete:`, remote_agent/agent/deletion.py). So the loader looks at the command words of
every simple command (runbook/shell_lex.py, nested ones included, after wrappers such as sudo, env,
timeout, xargs, `find -exec`; a static `sh -c '...'` string is read too) and refuses the
programs whose purpose is to delete or overwrite a path. This is a check on what a runbook
author writes, not a sandbox: a script or program that deletes files itself is not parsed.
"""

from __future__ import annotations

from collections.abc import Sequence

from runbook.shell_code import (
    EXEC_OPTS,
    RESERVED,
    SHELLS,
    WRAPPERS,
    _is_assignment,
    _name,
    _skip_wrapper_args,
)
from runbook.shell_lex import Command, argv_command, commands

ALWAYS = {
    "rm": "removes files",
    "rmdir": "removes directories",
    "unlink": "removes a file",
    "shred": "overwrites and removes files",
    "srm": "removes files",
    "wipefs": "erases filesystem signatures",
    "truncate": "cuts files short",
}
GIT_VALUE_OPTS = {"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--exec-path"}
INSTEAD = (
    "delete paths with a delete step instead (`delete: [paths]`, `delete_within: root`, "
    "no `run:`): the agent deletes exactly what it measured and the operator confirmed"
)


def _deletes(cmd: Command, k: int) -> str | None:
    """What command `cmd.words[k:]` deletes, or None."""
    words = cmd.words
    name = _name(words[k])
    args = [w.text for w in words[k + 1 :]]
    if name is None:
        return None
    if name in ALWAYS:
        return f"`{name}` {ALWAYS[name]}"
    if name == "find" and "-delete" in args:
        return "`find -delete` removes what it matches"
    if name == "rsync" and any(
        a.startswith("--delete") or a in ("--del", "--remove-source-files") for a in args
    ):
        return "`rsync --delete*`/`--remove-source-files` removes files"
    if name == "dd" and any(a.startswith("of=") for a in args):
        return "`dd of=` overwrites its output file"
    if name == "mv" and not any(a in ("-n", "--no-clobber", "--update=none") for a in args):
        return "`mv` replaces an existing destination (use `mv -n` to only rename onto nothing)"
    if name == "git":
        i = 0
        while i < len(args) and args[i].startswith("-"):  # git's own options, some with a value
            i += 2 if args[i] in GIT_VALUE_OPTS else 1
        sub = args[i] if i < len(args) else None
        if sub in ("clean", "rm"):
            return f"`git {sub}` removes files"
    if name == "busybox" and k + 1 < len(words):  # `busybox rm ...`: the applet is the command
        return _deletes(cmd, k + 1)
    if name in SHELLS:
        for j in range(k + 1, len(words) - 1):
            if words[j].text.startswith("-") and "c" in words[j].text and not words[j + 1].dynamic:
                return shell_deletion(words[j + 1].text)
    return None


def _command_deletes(cmd: Command) -> str | None:
    words = cmd.words
    k = 0
    while k < len(words) and (words[k].text in RESERVED or _is_assignment(words[k])):
        k += 1
    while k < len(words):
        found = _deletes(cmd, k)
        if found:
            return found
        name = _name(words[k])
        if name not in WRAPPERS:
            return None
        if name == "find":
            ex = next((j for j in range(k + 1, len(words)) if words[j].text in EXEC_OPTS), None)
            if ex is None:
                return None
            k = ex + 1
        else:
            k = _skip_wrapper_args(words, k + 1, name)
    return None


def shell_deletion(run: str | Sequence[str]) -> str | None:
    """Why this `run:` is refused (it deletes a path), or None."""
    cmds = commands(run) if isinstance(run, str) else [argv_command(list(run))]
    for cmd in cmds:
        if not cmd.words:
            continue
        found = _command_deletes(cmd)
        if found:
            return f"{found}: {INSTEAD}"
    return None
