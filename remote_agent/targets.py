"""What a delete will touch, resolved the way the kernel resolves it for the command.

Link policy: every component before the last is followed (as any syscall does); the last one
is followed only when the path ends in `/` (or `/.`), as `rm -rf link/` deletes the link
target's contents while `rm -rf link` removes just the link. Evidence (`dir_size`) and the
`removal_target` refusal both measure this canonical target, so they see what the command does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def canonical_target(raw: str) -> Path:
    """The file or directory `rm -rf RAW` acts on, as an absolute path without links."""
    expanded = os.path.expanduser(raw)
    if expanded.endswith("/") or expanded.endswith("/."):
        return Path(os.path.realpath(expanded))
    parent, name = os.path.split(os.path.abspath(expanded))
    if name in ("", ".", ".."):
        return Path(os.path.realpath(expanded))
    return Path(os.path.realpath(parent)) / name


def _within(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def refusal(raw: str, root: str | None, protected: list[str]) -> tuple[str | None, dict[str, Any]]:
    """(why the target must not be deleted or None, observed)."""
    target = canonical_target(raw)
    link = os.path.islink(os.path.expanduser(raw).rstrip("/") or "/")
    observed: dict[str, Any] = {"path": raw, "target": str(target), "link": link}
    if target == Path("/"):
        return "the target is / itself", observed
    home = Path(os.path.realpath(os.path.expanduser("~")))
    if _within(home, target):
        return f"the target is $HOME ({home}) or one of its ancestors", observed
    if root:
        r = Path(os.path.realpath(os.path.expanduser(root)))
        observed["root"] = str(r)
        if _within(r, target):
            return f"the target is the work root {r} or one of its ancestors", observed
        if not _within(target, r):
            return f"the target resolves to {target}, outside its declared root {r}", observed
    for p in protected:
        keep = Path(os.path.realpath(os.path.expanduser(p)))
        if _within(keep, target):
            return f"the target holds {keep}, an artifact a guard verified in this run", observed
    return None, observed
