"""The delete action: measure a target, and delete exactly that target, by one code path.

`measure` is the `delete_target` probe (what the operator confirms: kind, identity, bytes,
counts). `python -m remote_agent delete JOBDIR` is the job the agent launches for a delete
step (remote_agent/agent/jobs.py): it resolves each target again
(remote_agent/wire/targets.py), refuses the whole delete when any target's identity (device,
inode, kind) differs from what was measured, and removes each one itself: no shell, no
globbing. The walk holds directory fds; every directory is opened with O_NOFOLLOW relative to
its parent's fd and must be the inode the listing showed on the target's filesystem, so a
directory swapped for a link (or a mount) while it runs is never followed. A last component that is a link is unlinked, never followed.

A job killed midway leaves a marker (`<spool>/deletes/<dev>-<ino>.json`); the next delete of
the same target (same identity) says that it continues that one.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from remote_agent.wire.progress import format_record
from remote_agent.wire.protocol import AgentError
from remote_agent.wire.targets import Refused, Resolved, check_path, mount_points, resolve

SPEC = "delete.json"
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# What makes "the same object": inode numbers are reused at once (rm -r + mkdir may hand the
# new directory the old number), so the change time and the top level's listing count too.
IDENTITY = ("kind", "dev", "ino", "ctime_ns", "top")


def _kind(st: os.stat_result | None) -> str:
    if st is None:
        return "absent"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    return "file" if stat.S_ISREG(st.st_mode) else "other"


def _identity(parent_fd: int, name: str, st: os.stat_result | None) -> dict[str, Any]:
    """kind, dev, ino, ctime_ns and `top`: a digest of a directory's entries (name, inode), a
    link's text, a file's size and mtime."""
    if st is None:
        return {k: None for k in IDENTITY} | {"kind": "absent"}
    h = hashlib.sha256()
    if stat.S_ISDIR(st.st_mode):
        fd = _open_dir(parent_fd, name, st, name)
        try:
            for e in sorted(os.scandir(fd), key=lambda e: e.name):
                h.update(f"{e.name}\0{e.inode()}\n".encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)
    elif stat.S_ISLNK(st.st_mode):
        h.update(os.fsencode(os.readlink(name, dir_fd=parent_fd)))
    else:
        h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    kind = _kind(st)
    return {
        "kind": kind,
        "dev": st.st_dev,
        "ino": st.st_ino,
        "ctime_ns": st.st_ctime_ns,
        "top": h.hexdigest()[:32],
    }


def _current(res: Resolved, mounts: frozenset[str]) -> tuple[os.stat_result | None, dict]:
    """The target's lstat and identity now (after the path rules of targets.check_path)."""
    st = check_path(res, mounts)
    if st is None:
        return None, _identity(-1, "", None)
    parent = _open_parent(res)
    try:
        st = os.stat(res.parts[-1], dir_fd=parent, follow_symlinks=False)
        return st, _identity(parent, res.parts[-1], st)
    finally:
        os.close(parent)


def _open_dir(parent_fd: int, name: str, expect: os.stat_result, path: str) -> int:
    """fd of directory `name` under parent_fd: refused unless it is the inode `expect` saw."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:  # ELOOP/ENOTDIR: swapped for a link or a file since it was listed
        raise Refused(f"{path} changed while it was walked ({exc.strerror})") from None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (expect.st_dev, expect.st_ino):
        os.close(fd)
        raise Refused(f"{path} changed while it was walked (another directory now)")
    return fd


def _walk(
    top_fd: int, top: str, dev: int, mounts: frozenset[str]
) -> Iterator[tuple[int, str, str, os.stat_result]]:
    """Every entry below the directory `top_fd`, a directory after its contents:
    (parent fd, name, path, lstat). Refused at another filesystem or a mount point."""
    stack: list[tuple[int, str, Iterator[os.DirEntry[str]]]] = [
        (top_fd, top, iter(sorted(os.scandir(top_fd), key=lambda e: e.name)))
    ]
    pending_dir: list[tuple[str, os.stat_result] | None] = [None]
    while stack:
        fd, path, entries = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            done = pending_dir.pop()
            if fd != top_fd:
                os.close(fd)
            if done is not None:
                yield stack[-1][0], done[0], path, done[1]
            continue
        child = os.path.join(path, entry.name)
        st = entry.stat(follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            yield fd, entry.name, child, st
            continue
        if st.st_dev != dev or child in mounts:
            raise Refused(f"{child} is a mount point (another filesystem): not deleted across it")
        sub = _open_dir(fd, entry.name, st, child)
        stack.append((sub, child, iter(sorted(os.scandir(sub), key=lambda e: e.name))))
        pending_dir.append((entry.name, st))


def _open_parent(res: Resolved) -> int:
    """fd of the target's parent, each component below the root opened with O_NOFOLLOW."""
    fd = os.open(res.root, DIR_FLAGS & ~os.O_NOFOLLOW)
    path = res.root
    try:
        for name in res.parts[:-1]:
            path = os.path.join(path, name)
            nxt = _open_dir(fd, name, os.stat(name, dir_fd=fd, follow_symlinks=False), path)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def measure(
    raw: str, root: str | None, protected: list[str], check_time: Callable[[dict], None] | None
) -> dict[str, Any]:
    """What deleting `raw` removes: {path, target, kind, dev, ino, bytes, files, dirs}.
    Raises Refused. `check_time(partial)` may raise to stop a long walk."""
    res = resolve(raw, root, protected)
    mounts = mount_points()
    st, ident = _current(res, mounts)
    obs: dict[str, Any] = {"path": raw, "target": res.target, "root": res.root, **ident}
    if st is None:
        return {**obs, "bytes": 0, "files": 0, "dirs": 0}
    if not stat.S_ISDIR(st.st_mode):
        size = st.st_size if stat.S_ISREG(st.st_mode) else 0
        return {**obs, "bytes": size, "files": 1, "dirs": 0}
    total = files = 0
    dirs = 1
    seen: set[tuple[int, int]] = set()
    parent = _open_parent(res)
    try:
        top = _open_dir(parent, res.parts[-1], st, res.target)
        try:
            for n, (_fd, _name, _path, est) in enumerate(_walk(top, res.target, st.st_dev, mounts)):
                if stat.S_ISDIR(est.st_mode):
                    dirs += 1
                    continue
                files += 1
                if stat.S_ISREG(est.st_mode):
                    if est.st_nlink > 1:  # hard links: the inode once
                        if (est.st_dev, est.st_ino) in seen:
                            continue
                        seen.add((est.st_dev, est.st_ino))
                    total += est.st_size
                if check_time is not None and n % 1024 == 0:
                    check_time({"bytes": total, "files": files})
        finally:
            os.close(top)
    finally:
        os.close(parent)
    return {**obs, "bytes": total, "files": files, "dirs": dirs}


class Progress:
    """`@@eagle3` progress lines at most twice a second, the bytes freed so far. The agent's
    EAGLE_TUI_DELETE_PACE_S (seconds per removed file, default 0) paces a delete so that it
    does not starve a shared disk (the fault tests use it to kill a delete midway)."""

    def __init__(self, total: int) -> None:
        self.total, self.freed, self.files, self.last = total, 0, 0, 0.0
        self.pace = float(os.environ.get("EAGLE_TUI_DELETE_PACE_S") or 0)

    def add(self, size: int) -> None:
        self.freed += size
        self.files += 1
        if self.pace > 0:
            time.sleep(self.pace)
        now = time.monotonic()
        if now - self.last >= 0.5:
            self.last = now
            self.emit()

    def emit(self) -> None:
        rec = {"kind": "progress", "stage": "delete", "done": self.freed, "total": self.total}
        _say(format_record({**rec, "unit": "B", "rate": None, "eta_s": None}))


def delete_one(res: Resolved, expect: dict[str, Any], progress: Progress) -> None:
    """Remove the measured target; Refused (nothing more removed) when it is not that object."""
    mounts = mount_points()
    if check_path(res, mounts) is None:
        return
    parent = _open_parent(res)
    try:
        name = res.parts[-1]
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if (_kind(st), st.st_dev, st.st_ino) != tuple(expect.get(k) for k in IDENTITY[:3]):
            raise Refused(f"{res.target} is not the object that was measured")
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent)  # a link: the link itself
            progress.add(st.st_size if stat.S_ISREG(st.st_mode) else 0)
            return
        top = _open_dir(parent, name, st, res.target)
        try:
            for fd, entry, _path, est in _walk(top, res.target, st.st_dev, mounts):
                if stat.S_ISDIR(est.st_mode):
                    os.rmdir(entry, dir_fd=fd)
                else:
                    os.unlink(entry, dir_fd=fd)
                    progress.add(est.st_size if stat.S_ISREG(est.st_mode) else 0)
        finally:
            os.close(top)
        os.rmdir(name, dir_fd=parent)
    finally:
        os.close(parent)


def _marker(spec: dict[str, Any], expect: dict[str, Any]) -> Path | None:
    if not spec.get("marker_dir") or expect.get("ino") is None:
        return None
    return Path(spec["marker_dir"]) / f"{expect['dev']}-{expect['ino']}.json"


def run_job(job_dir: str) -> int:
    """The delete job: 0 all targets gone, 3 refused (nothing deleted), 1 stopped midway."""
    spec = json.loads((Path(job_dir) / SPEC).read_text())
    job_id = os.path.basename(job_dir.rstrip("/"))
    protected = list(spec.get("protected") or [])
    plan: list[tuple[Resolved, dict[str, Any]]] = []
    out: list[dict[str, Any]] = []
    try:  # every target is checked before anything is removed
        for t in spec["targets"]:
            res = resolve(t["path"], t["root"], protected)
            _st, now = _current(res, mount_points())
            want = {k: t["expect"].get(k) for k in IDENTITY}
            if now != want and not (now["kind"] == "absent" and want["kind"] != "absent"):
                raise Refused(
                    f"{res.target} changed since it was measured (measured {want}, now {now}); "
                    "nothing was deleted"
                )
            plan.append((res, t["expect"]))
    except Refused as exc:
        _say(f"delete refused: {exc}")
        _result({"refused": str(exc), "targets": [], "freed_bytes": 0})
        return 3
    status = 0
    for res, expect in plan:
        marker = _marker(spec, expect)
        resumed = _read_marker(marker)
        if resumed:
            _say(f"{res.target}: continues the deletion begun by job {resumed}")
        if marker is not None and not resumed:
            try:  # best effort: a full disk must not stop the delete that frees it
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text(json.dumps({"job_id": job_id, "target": res.target}))
            except OSError as exc:
                _say(f"note: no resume marker ({exc.strerror})")
        progress = Progress(int(expect.get("bytes") or 0))
        _say(f"deleting {res.target} ({expect.get('kind')}, {expect.get('bytes')} bytes)")
        row: dict[str, Any] = {"path": res.raw, "target": res.target, "measured": expect}
        if resumed:
            row["resumed_from"] = resumed
        try:
            delete_one(res, expect, progress)
        except (Refused, OSError) as exc:
            row.update(result="stopped", error=str(exc))
            status = 1
        else:
            row["result"] = "deleted"
            if marker is not None:
                marker.unlink(missing_ok=True)
        progress.emit()
        row.update(freed_bytes=progress.freed, removed_files=progress.files)
        out.append(row)
        _say(f"{res.target}: {row['result']}, {progress.freed} bytes freed")
        if status:
            _say(f"stopped: {row['error']}")
            break
    _result({"targets": out, "freed_bytes": sum(r["freed_bytes"] for r in out)})
    return status


def _read_marker(marker: Path | None) -> str | None:
    if marker is None:
        return None
    try:
        return str(json.loads(marker.read_text())["job_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _result(rec: dict[str, Any]) -> None:
    _say(format_record({"kind": "result", "stage": "delete", **rec}))


def delete_targets(arg: Any) -> dict[str, Any] | None:
    """`job.start`'s args.delete, checked: {targets: [{path, root}], protected: [paths]}."""
    if arg is None:
        return None
    targets = arg.get("targets") if isinstance(arg, dict) else None
    protected = arg.get("protected", []) if isinstance(arg, dict) else None
    if (
        not isinstance(targets, list)
        or not targets
        or not all(
            isinstance(t, dict)
            and isinstance(t.get("path"), str)
            and isinstance(t.get("root"), str)
            for t in targets
        )
        or not isinstance(protected, list)
        or not all(isinstance(p, str) for p in protected)
    ):
        raise AgentError(
            "bad_request", "args.delete is {targets: [{path, root}, ...], protected: [paths]}"
        )
    return {"targets": targets, "protected": protected}


def delete_job_spec(
    delete: dict[str, Any], sent: Any, results: list[dict[str, Any]], spool_root: Path
) -> dict[str, Any]:
    """The job's spec: each target with the identity measured in this request's launch guards
    (the evidence the operator confirmed, re-checked), or measured here when none was sent."""
    fresh: dict[tuple[Any, Any], dict[str, Any]] = {}
    for g, res in zip(sent or [], results, strict=False):
        check = g.get("check") or {}
        if check.get("check") == "delete_target" and res.get("ok"):
            fresh[(check.get("path"), check.get("root"))] = res["observed"]
    out = []
    for t in delete["targets"]:
        expect = fresh.get((t["path"], t["root"]))
        if expect is None:
            try:
                expect = measure(t["path"], t["root"], delete["protected"], None)
            except Refused as exc:
                raise AgentError("guards_changed", json.dumps([_refused(t, exc)])) from None
        out.append({"path": t["path"], "root": t["root"], "expect": expect})
    return {
        "targets": out,
        "protected": delete["protected"],
        "marker_dir": str(spool_root / "deletes"),
    }


def _refused(t: dict[str, Any], exc: Refused) -> dict[str, Any]:
    return {"ok": False, "observed": {"path": t["path"]}, "message": f"refused: {exc}"}


def _say(line: str) -> None:
    """One log line; a full disk under the log must not stop the delete that frees it."""
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except OSError:
        pass


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m remote_agent delete JOBDIR (started by the agent)", file=sys.stderr)
        return 2
    return run_job(argv[0])
