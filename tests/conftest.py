"""Shared fixtures: tiny real models and the real sglang 0.5.23 wheel, both cached on disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("EAGLE3_TEST_CACHE", REPO / ".cache"))
os.environ.setdefault("EAGLE3_CACHE", str(CACHE / "eagle3"))

SGLANG_VERSION = "0.5.23"


@pytest.fixture(scope="session")
def tiny_target() -> Path:
    """Directory of the CI tiny DeepseekV3 target (config, safetensors, tokenizer)."""
    pytest.importorskip("torch")
    from remote_agent.eagle3.tiny import ensure_tiny

    return ensure_tiny("ci")


@pytest.fixture(scope="session")
def sglang_wheel() -> Path:
    """The real sglang 0.5.23 wheel from PyPI (downloaded once, cached in .cache/wheels)."""
    dest = CACHE / "wheels"
    found = sorted(dest.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
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
                f"sglang=={SGLANG_VERSION}",
            ],
            check=True,
        )
        found = sorted(dest.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    return found[0]
