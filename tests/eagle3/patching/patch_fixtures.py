"""Shared helpers for the patch tests: the real file out of the real sglang wheels."""

from __future__ import annotations

import zipfile
from pathlib import Path

PRISTINE_SHA256 = "f61f93019bf1e7680f45a1fe227244433e1b22021cb955e53d25b9cf900473f9"
PATCHED_SHA256 = "06038318b5142506f02e3c8ac97690849f0419574db97b6f4ac4a72975deb406"
TARGET = "sglang/srt/models/deepseek_v2.py"
# per release: (pristine sha256, size, patched sha256), read off the wheels independently of the table
RELEASES = {
    "0.5.14": (
        "947fdc256101f538a668090f82e5eb5f888e2434f2bbbf69a99cdaa628cf902e",
        114029,
        "e2dc711540c1664be961fc095b71da5553d280a82d955965ee0cfce24931326b",
    ),
    "0.5.23": (PRISTINE_SHA256, 148648, PATCHED_SHA256),
}


def wheel_file(wheel: Path, relpath: str) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(relpath)


def make_site(
    wheel: Path, site: Path, files: tuple[str, ...] = (), version: str = "0.5.23"
) -> Path:
    """A site-packages holding deepseek_v2.py (+ files) and sglang's dist-info, as pip leaves it."""
    with zipfile.ZipFile(wheel) as zf:
        names = [
            n
            for n in zf.namelist()
            if n.startswith(f"sglang-{version}.dist-info/") and not n.endswith("/")
        ]
        for name in [TARGET, *files, *names]:
            dest = site / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(zf.read(name))
    return site / TARGET
