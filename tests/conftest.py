"""Shared fixtures: tiny real models and the real sglang 0.5.23 wheel, both cached on disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ssh.sshd import have_sshd
from tests.support.paths import REPO

CACHE = Path(os.environ.get("EAGLE3_TEST_CACHE", REPO / ".cache"))
os.environ.setdefault("EAGLE3_CACHE", str(CACHE / "eagle3"))

SGLANG_VERSION = "0.5.23"


@pytest.fixture(scope="session")
def tiny_target() -> Path:
    """Directory of the CI tiny DeepseekV3 target (config, safetensors, tokenizer)."""
    pytest.importorskip("torch")
    from remote_agent.eagle3.tiny import ensure_tiny

    return ensure_tiny("ci")


SGLANG_VERSIONS = ("0.5.14", "0.5.23")  # every release with a hash-table entry


def download_sglang_wheel(version: str) -> Path:
    """The real sglang wheel of `version` from PyPI (downloaded once, cached in .cache/wheels)."""
    dest = CACHE / "wheels"
    found = sorted(dest.glob(f"sglang-{version}-*.whl"))
    if not found:
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "-d",
                str(dest),
                f"sglang=={version}",
            ],
            check=True,
        )
        found = sorted(dest.glob(f"sglang-{version}-*.whl"))
    return found[0]


@pytest.fixture(scope="session")
def sglang_wheel() -> Path:
    """The real sglang 0.5.23 wheel."""
    return download_sglang_wheel(SGLANG_VERSION)


@pytest.fixture(scope="session", params=SGLANG_VERSIONS)
def sglang_release(request) -> tuple[str, Path]:
    """(version, real wheel) for each supported sglang release: tests using it run per version."""
    return request.param, download_sglang_wheel(request.param)


# one place for the sshd skip: a test marked `sshd` runs only where OpenSSH is installed
def pytest_collection_modifyitems(config, items):
    if have_sshd():
        return
    skip = pytest.mark.skip(reason="OpenSSH sshd/ssh-keygen not installed (.ci/system-deps)")
    for item in items:
        if "sshd" in item.keywords:
            item.add_marker(skip)
