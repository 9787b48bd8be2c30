"""The hash table of the dump patch and the guard the runbook uses before patching.

`patches/sglang-hashes.json` is keyed by (sglang version, package-relative path) and holds the
pristine and patched sha256 of each file we patch, the hashes of files the design relies on but
does not patch (drift), and the hashes of the helper files installed next to sglang.
Standard library only: the runbook engine and the box's bare python both use it.

    python -m remote_agent.eagle3.patching.hashes check [PATH] [--version V] [--json]

prints the file's state (pristine | patched | modified | missing) and exits 0 for pristine or
patched, 1 otherwise.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TARGET_RELPATH = "sglang/srt/models/deepseek_v2.py"
TABLE_NAME = "sglang-hashes.json"


def patches_dir() -> Path:
    """`$EAGLE3_PATCHES_DIR`, else `patches/` at the root of this source tree."""
    env = os.environ.get("EAGLE3_PATCHES_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "patches"


def repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_digest_to_hex(record_hash: str) -> str:
    """A wheel RECORD hash (`sha256=<urlsafe b64, no padding>`) as hex."""
    algo, _, b64 = record_hash.partition("=")
    if algo != "sha256":
        raise ValueError(f"unsupported RECORD hash {algo!r}")
    return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()


def parse_record(text: str) -> dict[str, str]:
    """RECORD lines -> {relpath: sha256 hex} (entries without a hash are skipped)."""
    import csv
    import io

    out: dict[str, str] = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[1]:
            out[row[0]] = record_digest_to_hex(row[1])
    return out


@dataclass(frozen=True)
class Entry:
    sglang: str
    path: str
    pristine_sha256: str
    patched_sha256: str
    patch: str
    patch_version: int
    pristine_size: int | None = None
    wheel: str | None = None


@dataclass
class Table:
    entries: list[Entry]
    drift: dict[str, dict[str, str]]
    helper: dict[str, Any]
    root: Path

    def entry(self, version: str, relpath: str = TARGET_RELPATH) -> Entry | None:
        return next((e for e in self.entries if e.sglang == version and e.path == relpath), None)

    def versions(self, relpath: str = TARGET_RELPATH) -> list[str]:
        return [e.sglang for e in self.entries if e.path == relpath]

    def match(self, sha: str, relpath: str = TARGET_RELPATH) -> tuple[Entry, str] | None:
        """(entry, 'pristine'|'patched') whose hash equals sha, for any version."""
        for e in self.entries:
            if e.path != relpath:
                continue
            if sha == e.pristine_sha256:
                return e, "pristine"
            if sha == e.patched_sha256:
                return e, "patched"
        return None


def load_table(root: Path | None = None) -> Table:
    root = Path(root) if root is not None else patches_dir()
    path = root / TABLE_NAME
    data = json.loads(path.read_text())
    if data.get("format") != "eagle3-patch-hashes":
        raise ValueError(f"{path}: not an eagle3 patch hash table")
    entries = [Entry(**e) for e in data["entries"]]
    return Table(entries, data.get("drift", {}), data.get("helper", {}), root)


def installed_sglang() -> tuple[str, Path] | None:
    """(version, site dir) of the installed sglang, found without importing it."""
    from importlib import metadata

    try:
        dist = metadata.distribution("sglang")
    except metadata.PackageNotFoundError:
        return None
    return dist.version, Path(str(dist.locate_file("")))


def dist_info_for(target: Path, relpath: str = TARGET_RELPATH) -> tuple[str, Path] | None:
    """(version, dist-info dir) when target sits at <site>/<relpath> next to a dist-info."""
    parts = Path(relpath).parts
    if tuple(target.parts[-len(parts) :]) != parts:
        return None
    site = target.parents[len(parts) - 1]
    for info in sorted(site.glob("sglang-*.dist-info")):
        meta = info / "METADATA"
        if meta.exists():
            for line in meta.read_text(errors="replace").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip(), info
    return None


def site_of(target: Path, relpath: str = TARGET_RELPATH) -> Path | None:
    parts = Path(relpath).parts
    if tuple(target.parts[-len(parts) :]) != parts:
        return None
    return target.parents[len(parts) - 1]


@dataclass
class Check:
    """What we know about one target file."""

    target: str
    state: str  # pristine | patched | modified | missing
    version: str | None
    version_source: str  # argument | dist-info | hash | none
    sha256: str | None
    pristine_sha256: str | None = None
    patched_sha256: str | None = None
    patch_version: int | None = None
    reason: str = ""
    record_sha256: str | None = None  # the wheel RECORD's hash of the pristine file, if found
    drift: list[dict[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.state in ("pristine", "patched")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def check_target(
    target: Path, version: str | None = None, table: Table | None = None
) -> tuple[Check, Entry | None]:
    """Classify a deepseek_v2.py against the table: pristine, patched or modified (refuse)."""
    table = table or load_table()
    target = Path(target)
    source = "argument" if version else "none"
    info = dist_info_for(target)
    if version is None and info is not None:
        version, source = info[0], "dist-info"
    if not target.is_file():
        return Check(str(target), "missing", version, source, None, reason="no such file"), None
    sha = sha256_file(target)
    if version is None:
        hit = table.match(sha)
        if hit is not None:
            version, source = hit[0].sglang, "hash"
    entry = table.entry(version) if version else None
    check = Check(str(target), "modified", version, source, sha)
    if entry is None or version is None:  # (an entry is found by a version)
        known = ", ".join(table.versions()) or "none"
        check.reason = (
            f"unknown sglang version {version!r}: the hash table has entries for {known} only; "
            "a new version needs a reviewed table entry"
            if version
            else f"cannot tell the sglang version (no dist-info; hash matches no entry for {known})"
        )
        return check, None
    check.pristine_sha256 = entry.pristine_sha256
    check.patched_sha256 = entry.patched_sha256
    check.patch_version = entry.patch_version
    if info is not None:
        record_path = info[1] / "RECORD"
        if record_path.exists():
            check.record_sha256 = parse_record(record_path.read_text()).get(TARGET_RELPATH)
        check.drift = drift_report(site_of(target) or target.parent, version, table)
    if sha == entry.patched_sha256:
        check.state, check.reason = "patched", "matches the reviewed patched file"
    elif sha == entry.pristine_sha256:
        check.state, check.reason = "pristine", "matches the pristine file of the release"
        if check.record_sha256 and check.record_sha256 != sha:
            check.state = "modified"
            check.reason = "the wheel RECORD disagrees with the table's pristine hash"
    else:
        text = target.read_bytes()
        if b"# >>> eagle3-dump" in text:
            check.reason = (
                "contains eagle3-dump markers but is not the reviewed patched file "
                "(edited after patching, or another patch version)"
            )
        else:
            check.reason = (
                "neither pristine nor patched: a local edit, another build or another patch"
            )
    return check, entry


def drift_report(site: Path, version: str, table: Table) -> list[dict[str, str]]:
    """Files the design relies on but does not patch whose hash changed (warnings)."""
    out = []
    for rel, expected in sorted(table.drift.get(version, {}).items()):
        path = site / rel
        actual = sha256_file(path) if path.is_file() else "missing"
        if actual != expected:
            out.append({"path": rel, "expected": expected, "actual": actual})
    return out


def default_target() -> Path | None:
    """deepseek_v2.py of the sglang the import system finds (editable/source installs too:
    find_spec does not execute the package), else the installed distribution's."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        pkg = Path(list(spec.submodule_search_locations)[0])
        return pkg.parent / TARGET_RELPATH
    found = installed_sglang()
    return None if found is None else found[1] / TARGET_RELPATH


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m remote_agent.eagle3.patching.hashes",
        description="check deepseek_v2.py against the eagle3 patch hash table",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("check", help="classify a deepseek_v2.py (exit 0 pristine/patched, 1 else)")
    p.add_argument("target", nargs="?", help="default: the installed sglang's file")
    p.add_argument("--version", help="sglang version (default: from dist-info or the hash)")
    p.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    target = Path(args.target) if args.target else default_target()
    if target is None:
        print("sglang is not installed and no PATH was given", file=sys.stderr)
        return 2
    check, _ = check_target(target, args.version)
    if args.json:
        print(json.dumps(check.to_json(), indent=1))
    else:
        print(f"{check.state}: {check.target} (sglang {check.version}): {check.reason}")
        print(f"  sha256   {check.sha256}")
        print(f"  pristine {check.pristine_sha256}")
        print(f"  patched  {check.patched_sha256}")
    return 0 if check.ok else 1


if __name__ == "__main__":
    sys.exit(main())
