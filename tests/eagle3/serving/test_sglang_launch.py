"""sglang-launch builds the commands the runbook's service steps run; every flag must exist in
the real sglang release it launches (0.5.23 and 0.5.14, read from their wheels: a renamed flag
would otherwise fail at 3 a.m.)."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import REPO


def launch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "remote_agent.eagle3", "sglang-launch", *args, "--print"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def flags_of(wheel: Path) -> set[str]:
    """0.5.23 derives each CLI flag from a typed field (`model_path` -> `--model-path`, in
    arg_groups/arg_utils.py); older-style literal flags and aliases are collected too."""
    flags: set[str] = set()
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if not (name.startswith("sglang/srt/") and name.endswith(".py")):
                continue
            text = z.read(name).decode("utf-8", "replace")
            flags |= set(re.findall(r'"(--[a-z0-9-]+)"', text))
            if "/arg_groups/" in name or name.endswith("server_args.py"):
                fields = re.findall(r"^    ([a-z][a-z0-9_]*): ", text, re.M)
                flags |= {"--" + f.replace("_", "-") for f in fields}
    return flags


@pytest.fixture(scope="module")
def wheel_flags(sglang_wheel) -> set[str]:
    return flags_of(sglang_wheel)


@pytest.fixture(scope="module")
def release_flags(sglang_release) -> tuple[str, set[str]]:
    version, wheel = sglang_release
    return version, flags_of(wheel)


def test_extract_mode_flags(tmp_path, wheel_flags):
    out = launch(
        "extract",
        "--model",
        "/models/k",
        "--dump-dir",
        str(tmp_path / "d"),
        "--tp",
        "8",
        "--layers",
        "2,30,58",
    )
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert f"EAGLE3_DUMP_DIR={tmp_path / 'd'}" in line
    for flag in (
        "--enable-return-aux-hidden-states",
        "--disable-radix-cache",
        "--disable-prefill-cuda-graph",
    ):
        assert flag in line
    assert "--speculative-algorithm EAGLE3" in line and "--chunked-prefill-size -1" in line
    assert "--return-aux-hidden-state-layer-ids 2 30 58" in line
    used = set(re.findall(r" (--[a-z0-9-]+)", line))
    assert used <= wheel_flags, f"flags sglang 0.5.23 does not know: {used - wheel_flags}"


def test_serve_mode_flags(tmp_path, release_flags):
    version, wheel_flags = release_flags
    (tmp_path / "drafter").mkdir()
    (tmp_path / "drafter" / "config.json").write_text("{}")
    (tmp_path / "k").mkdir()  # no context length in either config: both 2048 for SGLang
    (tmp_path / "k" / "config.json").write_text("{}")
    out = launch("serve", "--model", str(tmp_path / "k"), "--draft", str(tmp_path / "drafter"))
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert "--speculative-algorithm EAGLE3" in line and " EAGLE " not in line + " "
    assert (
        "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
        in line
    )
    used = set(re.findall(r" (--[a-z0-9-]+)", line))
    assert used <= wheel_flags, f"flags sglang {version} does not know: {used - wheel_flags}"


def test_extract_on_a_release_without_capture_only_flags_is_refused(tmp_path, release_flags):
    """0.5.14 lacks the capture-only flags (read off its wheel): extract mode says so, exit 2,
    instead of a server that dies on an unknown argument; on 0.5.23 the flags exist."""
    from remote_agent.eagle3.sglang_versions import CAPTURE_ONLY_FLAGS, WITHOUT_CAPTURE_ONLY

    version, wheel_flags = release_flags
    lacks = not set(CAPTURE_ONLY_FLAGS) <= wheel_flags
    assert lacks == (version in WITHOUT_CAPTURE_ONLY)
    out = launch(
        "extract", "--model", "/m", "--dump-dir", str(tmp_path / "d"), "--sglang-version", version
    )
    if lacks:
        assert out.returncode == 2 and "--enable-return-aux-hidden-states" in out.stderr
        assert f"sglang {version}" in out.stderr and out.stdout == ""
    else:
        assert out.returncode == 0 and "--enable-return-aux-hidden-states" in out.stdout


def test_missing_inputs_are_bad_input(tmp_path):
    assert launch("extract", "--model", "/m").returncode == 2
    out = launch("serve", "--model", "/m", "--draft", str(tmp_path))
    assert out.returncode == 2 and "exported drafter" in out.stderr
