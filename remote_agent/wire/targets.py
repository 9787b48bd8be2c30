"""Where a delete path leads: resolved from its declared root, component by component, or refused.

One place decides what a delete step may touch (docs/SAFETY.md "Deletes"); the measurement
(the `delete_target` probe) and the deletion job (remote_agent/agent/deletion.py) both call
`resolve`, so what the operator confirms and what is removed are the same object.

The path must be written under its root; the root is resolved once (links above it are the
operator's choice) and below it no component may be a link, a mount point or another
filesystem. A last component that is a link is the object itself: its deletion unlinks the
link, never what it points to; with a trailing `/` (where `rm` would empty the link's target)
it is refused. Glob, brace and bracket characters are refused, not expanded.

`canonical_target` stays for `dir_size`, which measures what `rm -rf PATH` would take.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

GLOB_CHARS = frozenset("*?[]{}")


class Refused(Exception):
    """Why a path must not be deleted (shown to the operator as is)."""


@dataclass(frozen=True)
class Resolved:
    """A delete target below its root: `parts` are its components under `root` (no links)."""

    raw: str
    root: str  # the root, resolved (realpath)
    parts: tuple[str, ...]
    trailing_slash: bool

    @property
    def target(self) -> str:
        return os.path.join(self.root, *self.parts)


def glob_refusal(raw: str) -> str | None:
    """A message when `raw` holds a glob, brace or bracket character (never expanded)."""
    bad = sorted({c for c in raw if c in GLOB_CHARS})
    if not bad:
        return None
    return (
        f"a delete path is one literal path: {' '.join(bad)} would be a pattern to a shell "
        "and is not expanded here; list each path to delete"
    )


def mount_points() -> frozenset[str]:
    """Every mount point of this mount namespace (bind mounts of the same filesystem too)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return frozenset()
    out = set()
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:  # field 5 is the mount point, octal-escaped (\040 for a space)
            out.add(_unescape(fields[4]))
    return frozenset(out)


def _unescape(s: str) -> str:
    if "\\" not in s:
        return s
    return s.encode("latin-1", "replace").decode("unicode_escape")


def _within(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def resolve(raw: str, root: str | None, protected: list[str] = ()) -> Resolved:  # type: ignore[assignment]
    """The target `raw` names under `root`, or Refused with the reason."""
    if not raw or not raw.strip():
        raise Refused("the delete path is empty (an unset variable?)")
    why = glob_refusal(raw)
    if why:
        raise Refused(why)
    if not root or not root.strip():
        raise Refused("a delete needs its declared root (`delete_within:`)")
    expanded = os.path.expanduser(raw)
    if ".." in expanded.split("/"):
        raise Refused("a delete path may not contain `..`: write the path it means")
    lexical = os.path.abspath(expanded)  # relative paths: the agent's working directory
    root_lex = os.path.abspath(os.path.expanduser(root))
    root_real = os.path.realpath(root_lex)
    if root_real == "/":
        raise Refused("the root / protects nothing: declare the directory the delete stays in")
    try:
        if not stat.S_ISDIR(os.stat(root_real).st_mode):
            raise Refused(f"the declared root {root_real} is not a directory")
    except FileNotFoundError:
        raise Refused(f"the declared root {root_lex} does not exist") from None
    if not _within(lexical, root_lex):
        raise Refused(f"{lexical} is not under its declared root {root_lex}")
    rel = os.path.relpath(lexical, root_lex)
    parts = tuple(p for p in rel.split("/") if p not in ("", "."))
    if not parts:
        raise Refused(f"the target is the declared root {root_real} itself")
    res = Resolved(raw, root_real, parts, expanded.endswith("/") or expanded.endswith("/."))
    home = os.path.realpath(os.path.expanduser("~"))
    if _within(home, res.target):
        raise Refused(f"the target is $HOME ({home}) or one of its ancestors")
    for p in protected:
        keep = os.path.realpath(os.path.expanduser(p))
        if _within(keep, res.target) or _within(os.path.abspath(os.path.expanduser(p)), lexical):
            raise Refused(f"the target holds {keep}, an artifact a guard verified in this run")
    return res


def check_path(res: Resolved, mounts: frozenset[str]) -> os.stat_result | None:
    """lstat of the target after checking every component below the root: no link, no mount
    point, one filesystem. None when it (or a parent) does not exist: nothing to delete."""
    cur = res.root
    root_dev = os.lstat(cur).st_dev
    for i, name in enumerate(res.parts):
        cur = os.path.join(cur, name)
        try:
            st = os.lstat(cur)
        except (FileNotFoundError, NotADirectoryError):
            return None
        last = i == len(res.parts) - 1
        if stat.S_ISLNK(st.st_mode):
            if not last:
                raise Refused(f"{cur} is a symbolic link in the delete path (-> {_link(cur)})")
            if res.trailing_slash:
                raise Refused(
                    f"{cur} is a symbolic link written with a trailing `/`: that would delete "
                    f"what it points to ({_link(cur)}); write it without `/` to delete the link, "
                    "or name the real directory under the root"
                )
            return st
        if st.st_dev != root_dev or cur in mounts:
            raise Refused(f"{cur} is a mount point (another filesystem): not deleted across it")
        if not last and not stat.S_ISDIR(st.st_mode):
            return None
    return st


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def canonical_target(raw: str) -> Path:
    """The file or directory `rm -rf RAW` acts on, as an absolute path without links."""
    expanded = os.path.expanduser(raw)
    if expanded.endswith("/") or expanded.endswith("/."):
        return Path(os.path.realpath(expanded))
    parent, name = os.path.split(os.path.abspath(expanded))
    if name in ("", ".", ".."):
        return Path(os.path.realpath(expanded))
    return Path(os.path.realpath(parent)) / name
