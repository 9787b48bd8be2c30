"""Checks evaluated on the box right before a step: `probe {check: {...}}` -> {ok, observed, message}.

A probe never modifies anything (files are opened read-only, no atime games aside) and is
bounded in time: file walks and hashes check a deadline (`timeout_s` in the check overrides
the default), subprocesses and HTTP calls have timeouts. Every failure, including a bad check
dict, is an `ok: false` answer with a message, never an exception.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from remote_agent.agent import gpu
from remote_agent.agent.deletion import measure
from remote_agent.agent.jobenv import job_base_env
from remote_agent.wire.targets import Refused, canonical_target
from remote_agent.wire.units import format_size

Result = tuple[bool, Any, str]

TAIL = 2048  # bytes of stdout/stderr reported by `command`
KEEP = 1 << 20  # bytes of stdout kept for the regex (the tail of a long output)


class CheckError(Exception):
    def __init__(self, message: str, observed: Any = None) -> None:
        super().__init__(message)
        self.observed = observed


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def check(self, observed: Any = None) -> None:
        if time.monotonic() > self.at:
            raise CheckError(f"timed out after {self.seconds:g}s", observed)


class Fields:
    """Typed access to a check dict; a wrong field is a CheckError naming it."""

    def __init__(self, d: dict[str, Any]) -> None:
        self.d = d

    def _get(self, key: str, default: Any, types: tuple[type, ...], what: str) -> Any:
        v = self.d.get(key, default)
        if v is None and default is None:
            return None
        if v is ...:
            raise CheckError(f"check field {key!r} is required")
        if isinstance(v, bool) and bool not in types or not isinstance(v, types):
            raise CheckError(f"check field {key!r} must be {what}")
        return v

    def str(self, key: str, default: Any = ...) -> Any:
        return self._get(key, default, (str,), "a string")

    def num(self, key: str, default: Any = ...) -> Any:
        return self._get(key, default, (int, float), "a number")

    def path(self, key: str = "path") -> Path:
        v = self.str(key)
        if not v or "\x00" in v:
            raise CheckError(f"check field {key!r} must be a non-empty path")
        return Path(v).expanduser()

    def strs(self, key: str, default: Any = ...) -> Any:
        v = self._get(key, default, (list,), "a list of strings")
        if v is not None and not all(isinstance(x, str) and "\x00" not in x for x in v):
            raise CheckError(f"check field {key!r} must be a list of strings")
        return v

    def env(self, key: str) -> dict[str, str]:
        v = self._get(key, None, (dict,), "an object of strings")
        if v is None:
            return {}
        if not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
            raise CheckError(f"check field {key!r} must map strings to strings")
        return v

    def deadline(self, default_s: float) -> Deadline:
        t = self.num("timeout_s", default_s)
        return Deadline(float(t) if t and t > 0 else default_s)


# --- filesystem --------------------------------------------------------------------------------


def _path_info(p: Path) -> dict[str, Any]:
    try:
        st = p.stat()
    except (FileNotFoundError, NotADirectoryError):
        return {"exists": False, "type": None, "size": None}
    except OSError as e:
        raise CheckError(f"cannot stat {p}: {e.strerror}") from None
    kind = "file" if stat.S_ISREG(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "other"
    return {"exists": True, "type": kind, "size": st.st_size}


def _exists_text(p: Path, obs: dict[str, Any]) -> str:
    """A file's size; a directory entry's size says nothing of its contents, so none is given."""
    if obs["type"] == "file":
        return f"{p} exists (file, {format_size(obs['size'])})"
    return f"{p} exists ({'a directory' if obs['type'] == 'dir' else obs['type']})"


def check_path_exists(f: Fields) -> Result:
    p = f.path()
    obs = _path_info(p)
    if obs["exists"]:
        return True, obs, _exists_text(p, obs)
    return False, obs, f"{p} does not exist"


def check_path_absent(f: Fields) -> Result:
    p = f.path()
    obs = _path_info(p)
    if obs["exists"]:
        return False, obs, _exists_text(p, obs)
    return True, obs, f"{p} is absent"


def sha256_file(p: Path, deadline: Deadline) -> tuple[str, int]:
    import hashlib

    h = hashlib.sha256()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    size = 0
    with open(p, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            h.update(view[:n])  # releases the GIL: other requests keep being served
            size += n
            deadline.check({"sha256": None, "size": size})
    return h.hexdigest(), size


def check_sha256(f: Fields) -> Result:
    p = f.path()
    any_of = [x.lower() for x in f.strs("any_of")]
    try:
        digest, size = sha256_file(p, f.deadline(3600))
    except (FileNotFoundError, NotADirectoryError):
        return False, {"sha256": None, "size": None}, f"{p}: no such file"
    except IsADirectoryError:
        return False, {"sha256": None, "size": None}, f"{p} is a directory"
    except PermissionError as e:
        return False, {"sha256": None, "size": None}, f"{p}: {e.strerror}"
    obs = {"sha256": digest, "size": size}
    if digest in any_of:
        return True, obs, f"{p} sha256 {digest[:12]}… matches"
    return False, obs, f"{p} sha256 {digest} matches none of {len(any_of)} expected value(s)"


def _nearest_existing(p: Path) -> Path:
    p = Path(os.path.abspath(p))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def disk_usage(p: Path) -> dict[str, Any]:
    q = _nearest_existing(p)
    st = os.statvfs(q)
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize  # what an unprivileged user can still write
    return {"path": str(q), "total": total, "free": free, "used": total - st.f_bfree * st.f_frsize}


def _bound(n: float) -> str:
    """A size the runbook wrote, in the units it was written in: `100TB` arrives as 10**14
    bytes, which `_gib` would echo as `90.9 TiB`. A count `_gib` cannot show exactly that is a
    round decimal figure reads back in decimal units (`100 TB`, `1.5 MB`)."""
    n = int(n)
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    k = min(len(units) - 1, max(0, (n.bit_length() - 1) // 10))  # the unit _gib picks
    if n % (1 << (10 * k)) == 0:
        return format_size(n)  # 500GiB, 1048576, 812 B: exact in binary units
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale and (n * 10) % scale == 0:
            return f"{n / scale:g} {unit}"
    return format_size(n)


def _files(n: int) -> str:
    return f"{n:,} file" + ("" if n == 1 else "s")


def check_disk_free(f: Fields) -> Result:
    p = f.path()
    need = f.num("min_bytes")
    try:
        du = disk_usage(p)
    except OSError as e:
        raise CheckError(f"cannot statvfs {p}: {e.strerror}") from None
    obs = {"free_bytes": du["free"], "total_bytes": du["total"], "path": du["path"]}
    ok = du["free"] >= need
    rel = ">=" if ok else "<"
    return ok, obs, f"{du['path']}: {format_size(du['free'])} free {rel} {_bound(need)} required"


def dir_size(root: Path, deadline: Deadline) -> dict[str, Any]:
    """Apparent size of the regular files under root: no symlink followed, each inode once."""
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode):
        size = st.st_size if stat.S_ISREG(st.st_mode) else 0
        return {
            "bytes": size,
            "files": int(stat.S_ISREG(st.st_mode)),
            "dirs": 0,
            "errors": 0,
            "disk_bytes": st.st_blocks * 512,
        }
    seen: set[tuple[int, int]] = set()
    total = disk = files = dirs = errors = 0
    stack = [os.fspath(root)]
    while stack:
        d = stack.pop()
        dirs += 1
        try:
            it = os.scandir(d)
        except OSError:
            errors += 1
            continue
        with it:
            for e in it:
                try:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                        continue
                    if not e.is_file(follow_symlinks=False):
                        continue  # symlinks, sockets, devices: not data
                    est = e.stat(follow_symlinks=False)
                except OSError:
                    errors += 1
                    continue
                if est.st_nlink > 1:  # hard links: count the inode once
                    key = (est.st_dev, est.st_ino)
                    if key in seen:
                        continue
                    seen.add(key)
                total += est.st_size
                disk += est.st_blocks * 512
                files += 1
        deadline.check({"bytes": total, "files": files})
    return {"bytes": total, "files": files, "dirs": dirs, "errors": errors, "disk_bytes": disk}


def check_dir_size(f: Fields) -> Result:
    f.path()  # validates the field
    p = canonical_target(f.str("path"))  # what a delete of this path removes (targets.py)
    lo = f.num("min_bytes", None)
    hi = f.num("max_bytes", None)
    try:
        obs = dir_size(p, f.deadline(600))
    except (FileNotFoundError, NotADirectoryError):
        return False, {"bytes": None, "files": None}, f"{p}: no such file or directory"
    ok = (lo is None or obs["bytes"] >= lo) and (hi is None or obs["bytes"] <= hi)
    bounds = " and ".join(
        x
        for x in (
            f">= {_bound(lo)}" if lo else "",  # ">= 0 B" bounds nothing: not worth a word
            f"<= {_bound(hi)}" if hi is not None else "",
        )
        if x
    )
    msg = f"{p}: {format_size(obs['bytes'])} in {_files(obs['files'])}"
    if bounds:
        msg += f", {'within' if ok else 'not within'} {bounds}"
    return ok, obs, msg


def get_dotted(obj: Any, key: str) -> Any:
    """`a.b.0.c` into nested objects/lists; a literal key containing dots wins. KeyError if absent."""
    if isinstance(obj, dict) and key in obj:
        return obj[key]
    cur = obj
    for part in key.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise KeyError(key)
    return cur


def check_jsonl_records(f: Fields) -> Result:
    p = f.path()
    count = f.num("count", None)
    lo = f.num("min", None)
    hi = f.num("max", None)
    field = f.str("field", None)
    want_sum = f.num("field_len_sum", None)
    deadline = f.deadline(3600)
    records = 0
    lens = 0
    obs: dict[str, Any] = {"records": 0}
    try:
        fh = open(p, "rb")
    except (FileNotFoundError, NotADirectoryError):
        return False, {"records": None}, f"{p}: no such file"
    except OSError as e:
        return False, {"records": None}, f"{p}: {e.strerror}"
    with fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except ValueError as e:
                obs = {"records": records, **({"field_len_sum": lens} if field else {})}
                return False, obs, f"{p}:{lineno}: malformed JSON line: {str(e)[:120]}"
            records += 1
            if field is not None:
                try:
                    lens += len(get_dotted(rec, field))
                except (KeyError, TypeError):
                    obs = {"records": records, "field_len_sum": lens}
                    return False, obs, f"{p}:{lineno}: record has no list/string field {field!r}"
            if not lineno & 1023:
                deadline.check({"records": records})
    obs = {"records": records}
    problems = []
    if count is not None and records != count:
        problems.append(f"expected exactly {count}")
    if lo is not None and records < lo:
        problems.append(f"expected at least {lo}")
    if hi is not None and records > hi:
        problems.append(f"expected at most {hi}")
    if field is not None:
        obs["field_len_sum"] = lens
        if want_sum is not None and lens != want_sum:
            problems.append(f"sum of len({field}) is {lens}, expected {want_sum}")
    msg = f"{p}: {records} records" + (f" ({'; '.join(problems)})" if problems else "")
    return not problems, obs, msg


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but true != 1 (Python's == says otherwise)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def check_manifest(f: Fields) -> Result:
    p = f.path()
    expect = f._get("expect", {}, (dict,), "an object of dotted keys to values") or {}
    file_key = f.str("file_key", "file") or "file"
    sha_key = f.str("sha_key", "sha256") or "sha256"
    obs: dict[str, Any] = {
        "fields": {},
        "file": None,
        "sha256_expected": None,
        "sha256_actual": None,
    }
    try:
        if p.stat().st_size > 64 << 20:
            return False, obs, f"{p}: manifest larger than 64 MiB"
        manifest = json.loads(p.read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        return False, obs, f"{p}: no such file"
    except ValueError as e:
        return False, obs, f"{p}: not JSON: {str(e)[:120]}"
    except OSError as e:
        return False, obs, f"{p}: {e.strerror}"
    problems = []
    for key, want in expect.items():
        try:
            got = get_dotted(manifest, key)
        except KeyError:
            obs["fields"][key] = None
            problems.append(f"{key} missing (expected {json.dumps(want)})")
            continue
        obs["fields"][key] = got
        if not json_equal(got, want):
            problems.append(f"{key} is {json.dumps(got)[:80]}, expected {json.dumps(want)[:80]}")
    try:
        rel = get_dotted(manifest, file_key)
        sha_expected = get_dotted(manifest, sha_key)
    except KeyError as e:
        problems.append(f"manifest has no {e.args[0]!r}")
        return False, obs, f"{p}: " + "; ".join(problems)
    if not isinstance(rel, str) or not isinstance(sha_expected, str):
        problems.append(f"manifest {file_key!r} and {sha_key!r} must be strings")
        return False, obs, f"{p}: " + "; ".join(problems)
    target = (p.parent / rel) if not os.path.isabs(rel) else Path(rel)
    obs["file"] = str(target)
    obs["sha256_expected"] = sha_expected.lower()
    try:
        obs["sha256_actual"], _ = sha256_file(target, f.deadline(3600))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        problems.append(f"described file {target} not found")
    else:
        if obs["sha256_actual"] != obs["sha256_expected"]:
            problems.append(
                f"sha256 of {target} is {obs['sha256_actual']}, manifest says "
                f"{obs['sha256_expected']}"
            )
    if problems:
        return False, obs, f"{p}: " + "; ".join(problems)
    fields = f"{', '.join(expect)} as expected, " if expect else ""
    return True, obs, f"{p}: {fields}{target.name} sha256 matches"


# --- processes and network ---------------------------------------------------------------------


def _drain(stream: Any, keep: int, out: list[bytes]) -> None:
    buf = bytearray()
    for chunk in iter(lambda: stream.read1(65536), b""):
        buf += chunk
        if len(buf) > 2 * keep:
            del buf[: len(buf) - keep]
    out.append(bytes(buf[-keep:]))


def check_command(f: Fields) -> Result:
    argv = f.strs("argv", None)
    shell = f.str("shell", None)
    if (argv is None) == (shell is None):
        raise CheckError("command needs exactly one of 'argv' and 'shell'")
    if argv is not None and not argv:
        raise CheckError("command 'argv' must not be empty")
    cmd = argv if argv is not None else ["/bin/sh", "-c", shell]
    cwd = f.str("cwd", None)
    env = {**job_base_env(), **f.env("env")}  # the same python and package a job would see
    timeout = float(f.num("timeout_s", 60) or 60)
    pattern = f.str("stdout_regex", None)
    try:
        rx = re.compile(pattern, re.M) if pattern is not None else None
    except re.error as e:
        raise CheckError(f"invalid stdout_regex: {e}") from None
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # timeout kills its whole tree
        )
    except OSError as e:
        obs = {"exit_code": None, "stdout_tail": "", "stderr_tail": ""}
        return False, obs, f"cannot run {cmd[0]!r}: {e.strerror or e}"
    outs: list[bytes] = []
    errs: list[bytes] = []
    readers = [
        threading.Thread(target=_drain, args=(proc.stdout, KEEP, outs), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, TAIL, errs), daemon=True),
    ]
    for t in readers:
        t.start()
    timed_out = False
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    if not timed_out:
        for t in readers:
            t.join(1.0)
    # Leftover background processes would hold the pipes open: the probe ends with its tree.
    if timed_out or any(t.is_alive() for t in readers):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    for t in readers:
        t.join(5.0)
    out = outs[0] if outs else b""
    err = errs[0] if errs else b""
    rc = proc.returncode
    obs = {
        "exit_code": None if timed_out else rc,
        "timed_out": timed_out,
        "stdout_tail": out[-TAIL:].decode(errors="replace"),
        "stderr_tail": err[-TAIL:].decode(errors="replace"),
    }
    name = os.path.basename(cmd[0]) if argv is not None else "sh -c"
    if timed_out:
        return False, obs, f"{name}: timed out after {timeout:g}s"
    if rc != 0:
        return False, obs, f"{name}: exit code {rc}"
    if rx is not None and not rx.search(out.decode(errors="replace")):
        return False, obs, f"{name}: exit 0 but stdout does not match {pattern!r}"
    return True, obs, f"{name}: exit 0" + (f", stdout matches {pattern!r}" if rx else "")


def check_http_ok(f: Fields) -> Result:
    url = f.str("url")
    want = f.num("status", 200)
    timeout = float(f.num("timeout_s", 10) or 10)
    if not url.lower().startswith(("http://", "https://")):
        raise CheckError("http_ok url must start with http:// or https://")
    obs: dict[str, Any] = {"status": None, "error": None}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, method="GET"), timeout=timeout
        ) as r:
            obs["status"] = r.status
    except urllib.error.HTTPError as e:
        obs["status"] = e.code
        e.close()
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        obs["error"] = str(reason)
        return False, obs, f"{url}: {reason}"
    ok = obs["status"] == want
    return ok, obs, f"{url}: HTTP {obs['status']}" + ("" if ok else f", expected {want}")


def check_gpu_idle(f: Fields) -> Result:
    max_mem = f.num("max_memory_mib", 1024)
    max_util = f.num("max_util", 10)
    try:
        gpus = gpu.gpus()
        apps = gpu.compute_apps()
    except gpu.GpuError as e:
        return False, {"error": str(e)}, str(e)
    busy = [
        g["index"]
        for g in gpus
        if (g["mem_used_mib"] or 0) > max_mem or (g["util"] or 0) > max_util
    ]
    obs = {
        "gpus": [
            {k: g[k] for k in ("index", "util", "mem_used_mib", "mem_total_mib")} for g in gpus
        ],
        "compute_apps": apps,
    }
    if not gpus:
        return False, obs, "nvidia-smi lists no GPU"
    if busy or apps:
        pids = ", ".join(str(a["pid"]) for a in apps)
        return (
            False,
            obs,
            (f"GPU(s) {busy} busy" if busy else "")
            + (f"{'; ' if busy else ''}compute processes: {pids}" if apps else ""),
        )
    return True, obs, f"{len(gpus)} GPU(s) idle"


def check_delete_target(f: Fields) -> Result:
    """What a delete step removes, measured by the code that deletes it (deletion.py): the
    resolved target, its identity and size; refused under the rules of targets.py."""
    f.path()
    raw = f.str("path")
    deadline = f.deadline(600)
    try:
        obs = measure(raw, f.str("root", None), f.strs("protected", []), deadline.check)
    except Refused as exc:
        return False, {"path": raw}, f"refused {raw!r}: {exc}"
    if obs["kind"] == "absent":
        return True, obs, f"{raw!r}: {obs['target']} is already absent"
    size = f"{format_size(obs['bytes'])} in {_files(obs['files'])}"
    return True, obs, f"{raw!r} deletes {obs['kind']} {obs['target']}: {size}"


# one function per name of check_vocabulary.BOX_CHECKS (tests/runbook/test_check_vocabulary.py)
CHECKS: dict[str, Callable[[Fields], Result]] = {
    "path_exists": check_path_exists,
    "path_absent": check_path_absent,
    "sha256": check_sha256,
    "disk_free": check_disk_free,
    "dir_size": check_dir_size,
    "jsonl_records": check_jsonl_records,
    "manifest": check_manifest,
    "command": check_command,
    "http_ok": check_http_ok,
    "gpu_idle": check_gpu_idle,
    "delete_target": check_delete_target,
}


def run_probe(check: Any) -> dict[str, Any]:
    if not isinstance(check, dict):
        return {"ok": False, "observed": None, "message": "args.check must be an object"}
    name = check.get("check")
    fn = CHECKS.get(name) if isinstance(name, str) else None
    if fn is None:
        known = ", ".join(sorted(CHECKS))
        return {
            "ok": False,
            "observed": None,
            "message": f"unknown check {name!r} (known: {known})",
        }
    try:
        ok, observed, message = fn(Fields(check))
    except CheckError as e:
        return {"ok": False, "observed": e.observed, "message": f"{name}: {e}"}
    except Exception as e:  # a probe answers, whatever happens
        return {"ok": False, "observed": None, "message": f"{name}: {type(e).__name__}: {e}"}
    return {"ok": bool(ok), "observed": observed, "message": message}
