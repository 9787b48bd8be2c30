"""The agent as one reproducible zipapp: what the SSH transport uploads to the box.

Contents: `remote_agent/*.py` (the entry point), `remote_agent/agent/**` (the agent core),
`remote_agent/wire/**` (the wire contracts), `remote_agent/eagle3/**` (the ML payload jobs run with
`python -m remote_agent.eagle3 ...`) and `patches/**` (data the payload reads), laid out as in
the repository, with a zipapp `__main__.py` (`python agent.pyz serve` works). On the box the
transport unpacks it once into `agent-<hash>/` and runs the agent from that tree (the payload
reads files next to its sources), which the agent puts first on its jobs' PYTHONPATH.

Reproducible: entries sorted, fixed timestamps and modes, fixed compression, so equal sources
give equal bytes and the name `agent-<hash>.pyz` identifies the content on the box and in the
local cache.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

from remote_agent.wire.atomic_write import TEMP_MARK, write_atomic

REPO = Path(__file__).resolve().parents[2]
# what `zipapp.create_archive(main="remote_agent.__main__:entry")` writes
MAIN = "# -*- coding: utf-8 -*-\nimport remote_agent.__main__\nremote_agent.__main__.entry()\n"
EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry
# the packages below `remote_agent/`: the agent core, the wire contracts, the eagle3 payload
PACKAGES = ("agent", "wire", "eagle3")
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache"}
SKIP_SUFFIXES = (".pyc", ".pyo", ".tmp")


@dataclass(frozen=True)
class Bundle:
    path: Path  # the cached archive
    digest: str  # 16 hex characters of the archive's sha256
    size: int

    @property
    def name(self) -> str:
        return f"agent-{self.digest}.pyz"


def source_files(root: Path = REPO) -> list[tuple[str, Path]]:
    """(archive name, file) for every file that ships, sorted by archive name."""
    found: list[tuple[str, Path]] = [
        (f"remote_agent/{p.name}", p) for p in (root / "remote_agent").glob("*.py")
    ]
    for top in (*(root / "remote_agent" / d for d in PACKAGES), root / "patches"):
        if not top.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for fn in filenames:
                if fn.endswith(SKIP_SUFFIXES) or TEMP_MARK in fn:  # nor a write in progress
                    continue
                p = Path(dirpath) / fn
                found.append((p.relative_to(root).as_posix(), p))
    return sorted(found)


def build_bytes(root: Path = REPO) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        entries = [("__main__.py", MAIN.encode())] + [
            (name, path.read_bytes()) for name, path in source_files(root)
        ]
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=EPOCH)
            info.external_attr = 0o100644 << 16  # a regular file, rw-r--r--
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix, whatever the building machine is
            zf.writestr(info, data, compresslevel=9)
    return buf.getvalue()


def build(cache_dir: Path, root: Path = REPO) -> Bundle:
    """Build the archive and keep it in `cache_dir` under its content hash (written once)."""
    data = build_bytes(root)
    digest = hashlib.sha256(data).hexdigest()[:16]
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"agent-{digest}.pyz"
    if not path.exists() or path.stat().st_size != len(data):
        write_atomic(path, data)
    return Bundle(path, digest, len(data))
