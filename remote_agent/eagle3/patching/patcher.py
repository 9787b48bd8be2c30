"""Apply, revert and report the dump patch, guarded by the hash table (standard library only).

State decision (reference §6.6): current == patched -> already applied, nothing to do;
current == pristine -> apply; anything else -> refuse with both hashes and the reason.
Applying writes a temporary file next to the target, compiles it, renames it over the target
and re-hashes; the pristine bytes are kept as `deepseek_v2.py.eagle3-dump.orig` (never a `.py`
name inside `models/`, which the model registry would import). The helper package is installed
first, because the patched file imports it on its first dump.
"""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote_agent.eagle3.patching.blocks import PatchError, load_spec, strip_blocks
from remote_agent.eagle3.patching.blocks import apply_blocks as _apply_blocks
from remote_agent.eagle3.patching.hashes import (
    TARGET_RELPATH,
    Check,
    Entry,
    Table,
    check_target,
    load_table,
    sha256_bytes,
    sha256_file,
    site_of,
)
from remote_agent.wire.atomic_write import atomic_path, write_atomic

BACKUP_SUFFIX = ".eagle3-dump.orig"
INSTALLED = "INSTALLED.json"


@dataclass
class Outcome:
    action: str  # applied | noop | reverted | refused | status
    ok: bool
    check: Check
    message: str
    helper: dict[str, Any] = field(default_factory=dict)
    backup: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "ok": self.ok,
            "message": self.message,
            "state": self.check.state,
            "check": self.check.to_json(),
            "helper": self.helper,
            "backup": self.backup,
        }


def backup_path(target: Path) -> Path:
    return target.with_name(target.name + BACKUP_SUFFIX)


def default_helper_dir(target: Path, table: Table) -> Path:
    """<site>/sglang/srt/eagle3_dump for an installed sglang; next to a scratch copy otherwise."""
    site = site_of(target, TARGET_RELPATH)
    rel = table.helper.get("install_dir", "sglang/srt/eagle3_dump")
    return site / rel if site is not None else target.parent / Path(rel).name


# ---- helper package ----


def helper_sources(table: Table) -> dict[str, Path]:
    base = table.root.parent
    return {name: base / spec["source"] for name, spec in table.helper.get("files", {}).items()}


def helper_source_problems(table: Table) -> list[str]:
    """Shipped helper files whose hash is not the reviewed one recorded in the table."""
    problems = []
    for spec in table.helper.get("files", {}).values():
        path = table.root.parent / spec["source"]
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif sha256_file(path) != spec["sha256"]:
            problems.append(
                f"{path}: sha256 {sha256_file(path)} is not the reviewed {spec['sha256']} "
                "(after review: python -m remote_agent.eagle3.patching.rehash)"
            )
    return problems


def helper_status(dest: Path, table: Table) -> dict[str, Any]:
    files = table.helper.get("files", {})
    found = {n: (sha256_file(dest / n) if (dest / n).is_file() else None) for n in files}
    if all(v is None for v in found.values()):
        state = "missing"
    elif all(found[n] == spec["sha256"] for n, spec in files.items()):
        state = "installed"
    else:
        state = "differs"
    return {"dir": str(dest), "state": state, "files": found}


def install_helper(dest: Path, table: Table, entry: Entry | None) -> dict[str, Any]:
    problems = helper_source_problems(table)
    if problems:
        raise PatchError("helper sources are not the reviewed ones: " + "; ".join(problems))
    dest.mkdir(parents=True, exist_ok=True)
    for name, src in helper_sources(table).items():
        write_atomic(dest / name, src.read_bytes(), mode=0o644)
    record = {
        "patch_version": entry.patch_version if entry else None,
        "sglang": entry.sglang if entry else None,
        "pristine_sha256": entry.pristine_sha256 if entry else None,
        "patched_sha256": entry.patched_sha256 if entry else None,
        "files": {n: spec["sha256"] for n, spec in table.helper.get("files", {}).items()},
    }
    write_atomic(dest / INSTALLED, json.dumps(record, indent=1) + "\n", mode=0o644)
    shutil.rmtree(dest / "__pycache__", ignore_errors=True)
    return helper_status(dest, table)


def remove_helper(dest: Path, table: Table) -> dict[str, Any]:
    for name in [*table.helper.get("files", {}), INSTALLED]:
        (dest / name).unlink(missing_ok=True)
    shutil.rmtree(dest / "__pycache__", ignore_errors=True)
    try:
        dest.rmdir()
    except OSError:
        pass  # absent, or holds files that are not ours: leave them
    return helper_status(dest, table)


# ---- the target file ----


def _clear_pycache(target: Path) -> None:
    stem = target.name.removesuffix(".py")
    for pyc in (target.parent / "__pycache__").glob(f"{stem}.*.pyc"):
        pyc.unlink(missing_ok=True)


def _replace_checked(target: Path, data: bytes) -> None:
    """tmp in the same directory (no `.py` name), py_compile, fsync, rename over the target."""
    st = target.stat()
    with atomic_path(target) as tmp:
        pyc = tmp.with_name(tmp.name + ".pyc")
        try:
            tmp.write_bytes(data)
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
            if (os.stat(tmp).st_uid, os.stat(tmp).st_gid) != (st.st_uid, st.st_gid):
                os.chown(tmp, st.st_uid, st.st_gid)  # keep the owner too (root-owned installs)
            py_compile.compile(str(tmp), cfile=str(pyc), dfile=str(target), doraise=True)
        finally:
            pyc.unlink(missing_ok=True)
    _clear_pycache(target)


def status(target: Path, version: str | None = None, helper_dir: Path | None = None) -> Outcome:
    table = load_table()
    check, _ = check_target(target, version, table)
    helper = helper_status(helper_dir or default_helper_dir(target, table), table)
    backup = backup_path(target)
    return Outcome(
        "status",
        check.ok,
        check,
        f"{check.state}: {check.reason}",
        helper,
        str(backup) if backup.exists() else None,
    )


def apply(
    target: Path,
    version: str | None = None,
    helper_dir: Path | None = None,
    with_helper: bool = True,
) -> Outcome:
    table = load_table()
    check, entry = check_target(target, version, table)
    dest = helper_dir or default_helper_dir(target, table)
    backup = backup_path(target)
    if check.state == "patched" and entry is not None:
        helper = helper_status(dest, table)
        if with_helper and helper["state"] != "installed":
            helper = install_helper(dest, table, entry)
        return Outcome(
            "noop",
            True,
            check,
            "already patched; nothing to do",
            helper,
            str(backup) if backup.exists() else None,
        )
    if check.state != "pristine" or entry is None:
        return Outcome("refused", False, check, _refusal(check), helper_status(dest, table))
    original = target.read_bytes()
    try:
        spec = load_spec(table.root / entry.patch)
        patched = _apply_blocks(original.decode("utf-8"), spec).encode("utf-8")
    except (PatchError, UnicodeDecodeError) as exc:
        check.reason = f"cannot apply: {exc}"
        return Outcome("refused", False, check, _refusal(check), helper_status(dest, table))
    if sha256_bytes(patched) != entry.patched_sha256:
        check.reason = (
            f"the patch produces sha256 {sha256_bytes(patched)}, the table expects "
            f"{entry.patched_sha256}: the patch spec changed without a reviewed table update"
        )
        return Outcome("refused", False, check, _refusal(check), helper_status(dest, table))
    helper: dict[str, Any] = helper_status(dest, table)
    if with_helper:
        try:
            helper = install_helper(dest, table, entry)
        except PatchError as exc:
            check.reason = str(exc)
            return Outcome("refused", False, check, _refusal(check), helper)
    if not backup.exists() or sha256_file(backup) != entry.pristine_sha256:
        write_atomic(backup, original, mode=stat.S_IMODE(target.stat().st_mode))
    _replace_checked(target, patched)
    after, _ = check_target(target, version, table)
    if after.state != "patched":  # cannot happen unless something raced us: put it back
        _replace_checked(target, original)
        return Outcome(
            "refused", False, after, f"re-hash after apply gave {after.sha256}; restored"
        )
    return Outcome(
        "applied", True, after, "patched; pristine copy kept as backup", helper, str(backup)
    )


def revert(
    target: Path,
    version: str | None = None,
    helper_dir: Path | None = None,
) -> Outcome:
    table = load_table()
    check, entry = check_target(target, version, table)
    dest = helper_dir or default_helper_dir(target, table)
    backup = backup_path(target)
    if check.state == "pristine" and entry is not None:
        helper = remove_helper(dest, table)
        if backup.exists() and sha256_file(backup) == entry.pristine_sha256:
            backup.unlink()
        return Outcome("noop", True, check, "already pristine; nothing to do", helper)
    if check.state != "patched" or entry is None:
        return Outcome("refused", False, check, _refusal(check), helper_status(dest, table))
    if backup.exists() and sha256_file(backup) == entry.pristine_sha256:
        original = backup.read_bytes()
    else:  # no usable backup: strip the marked blocks and require the pristine hash
        spec = load_spec(table.root / entry.patch)
        original = strip_blocks(target.read_text(encoding="utf-8"), spec).encode("utf-8")
        if sha256_bytes(original) != entry.pristine_sha256:
            check.reason = "stripping the marked blocks does not give the pristine file"
            return Outcome("refused", False, check, _refusal(check), helper_status(dest, table))
    _replace_checked(target, original)
    after, _ = check_target(target, version, table)
    if after.state != "pristine":
        return Outcome("refused", False, after, f"re-hash after revert gave {after.sha256}")
    backup.unlink(missing_ok=True)
    helper = remove_helper(dest, table)
    return Outcome("reverted", True, after, "restored the pristine file; helper removed", helper)


def _refusal(check: Check) -> str:
    return (
        f"refusing to touch {check.target}: {check.reason}\n"
        f"  current  sha256 {check.sha256}\n"
        f"  pristine sha256 {check.pristine_sha256} (sglang {check.version})\n"
        f"  patched  sha256 {check.patched_sha256}\n"
        "  fix: restore the release file (pip install --force-reinstall --no-deps "
        f"sglang=={check.version or '<version>'}) or add a reviewed table entry"
    )
