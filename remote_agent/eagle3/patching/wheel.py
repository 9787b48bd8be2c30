"""The pristine `deepseek_v2.py` straight from the released sglang wheel (downloaded once with
`pip download --no-deps`, cached), checked against the wheel's RECORD and the hash table.
Used by the demo runbook (patch a scratch copy) and the CPU tests."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from remote_agent.eagle3.errors import Failed
from remote_agent.eagle3.patching.hashes import (
    TARGET_RELPATH,
    load_table,
    parse_record,
    sha256_bytes,
)
from remote_agent.wire.atomic_write import write_atomic


def cache_dir() -> Path:
    root = os.environ.get("EAGLE3_CACHE", str(Path.home() / ".cache" / "eagle3"))
    return Path(root) / "wheels"


def find_or_download_wheel(version: str, dest: Path | None = None) -> Path:
    dest = dest or cache_dir()
    from remote_agent.eagle3.patching.hashes import repo_root

    for d in (dest, repo_root() / ".cache" / "wheels"):  # the test fixture's cache too
        found = sorted(d.glob(f"sglang-{version}-*.whl"))
        if found:
            return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest)]
    proc = subprocess.run([*cmd, f"sglang=={version}"], capture_output=True, text=True, check=False)
    found = sorted(dest.glob(f"sglang-{version}-*.whl"))
    if proc.returncode != 0 or not found:
        raise Failed(f"pip download sglang=={version} failed: {proc.stderr.strip()[-2000:]}")
    return found[0]


def read_from_wheel(wheel: Path, relpath: str = TARGET_RELPATH) -> tuple[bytes, str | None]:
    """(file bytes, RECORD sha256 hex of that file or None)."""
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read(relpath)
        records = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
        record = parse_record(zf.read(records[0]).decode()) if records else {}
    return data, record.get(relpath)


def fetch_pristine(version: str, out: Path, wheel: Path | None = None) -> dict[str, str]:
    """Write the release's pristine file to `out` after checking RECORD and the table."""
    table = load_table()
    entry = table.entry(version)
    if entry is None:
        raise Failed(f"no hash table entry for sglang {version}")
    wheel = wheel or find_or_download_wheel(version)
    data, record_sha = read_from_wheel(wheel)
    sha = sha256_bytes(data)
    if record_sha is None or record_sha != sha:
        raise Failed(
            f"{wheel}: {TARGET_RELPATH} sha256 {sha} disagrees with its RECORD {record_sha}"
        )
    if sha != entry.pristine_sha256:
        raise Failed(
            f"{wheel}: {TARGET_RELPATH} sha256 {sha}, table expects {entry.pristine_sha256}"
        )
    write_atomic(out, data)
    return {"out": str(out), "sha256": sha, "wheel": str(wheel), "record_sha256": record_sha}
