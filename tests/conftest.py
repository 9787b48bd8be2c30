"""Shared fixtures: tiny real models and the real sglang 0.5.23 wheel, both cached on disk.
Also the suite's tiers (markers given centrally: `attack`, `slow`), the per-worker isolation for
pytest-xdist and the attack tally's summary (summed over xdist workers)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.faults.tally import TALLY, trials_scale, write_if_asked
from tests.ssh.sshd import have_sshd
from tests.support.paths import REPO
from tests.tiers import attack_item, slow_item

CACHE = Path(os.environ.get("EAGLE3_TEST_CACHE", REPO / ".cache"))
os.environ.setdefault("EAGLE3_CACHE", str(CACHE / "eagle3"))

SGLANG_VERSION = "0.5.23"


@pytest.fixture(scope="session")
def tiny_target() -> Path:
    """Directory of the CI tiny DeepseekV3 target (config, safetensors, tokenizer)."""
    pytest.importorskip("torch")
    from remote_agent.eagle3.tiny.cache import ensure_tiny

    return ensure_tiny("ci")


SGLANG_VERSIONS = ("0.5.14", "0.5.23")  # every release with a hash-table entry


def download_sglang_wheel(version: str) -> Path:
    """The real sglang wheel of `version` from PyPI (downloaded once, cached in .cache/wheels)."""
    dest = CACHE / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    # one downloader at a time (xdist workers share the cache): a half-written wheel is never seen
    with open(dest / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _download_locked(dest, version)


def _download_locked(dest: Path, version: str) -> Path:
    found = sorted(dest.glob(f"sglang-{version}-*.whl"))
    if not found:
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


def pytest_collection_modifyitems(config, items):
    """The tiers, given here so test files need no marks of their own (tests/tiers.py says
    which are `attack` and `slow`), and the one place for the sshd skip: a test marked `sshd`
    runs only where OpenSSH is installed."""
    no_sshd = None
    if not have_sshd():
        no_sshd = pytest.mark.skip(reason="OpenSSH sshd/ssh-keygen not installed (.ci/system-deps)")
    for item in items:
        if attack_item(item):
            item.add_marker(pytest.mark.attack)
        if slow_item(item):
            item.add_marker(pytest.mark.slow)
        if no_sshd is not None and "sshd" in item.keywords:
            item.add_marker(no_sshd)


_FALLBACK_ROOT = pytest.StashKey[Path]()


def _xdist_controller(config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_configure(config) -> None:
    """Each test process (the one of a plain run, or each xdist worker) its own fallback state
    dir and spool: a test that sets neither never meets another worker's runs."""
    if _xdist_controller(config):
        return  # the workers it starts pick their own
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    root = Path(tempfile.mkdtemp(prefix=f"eagle-tui-tests-{worker}-"))
    config.stash[_FALLBACK_ROOT] = root
    os.environ.setdefault("EAGLE_TUI_STATE_DIR", str(root / "state"))
    os.environ.setdefault("EAGLE_TUI_SPOOL", str(root / "spool"))


def pytest_unconfigure(config) -> None:
    root = config.stash.get(_FALLBACK_ROOT, None)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


# The attack tally: a worker hands its rows to the controller, which sums them and prints.
def pytest_sessionfinish(session, exitstatus) -> None:  # noqa: ARG001
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["attack_tally"] = TALLY.rows()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # noqa: ARG001
    TALLY.merge([tuple(r) for r in getattr(node, "workeroutput", {}).get("attack_tally", [])])


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001
    if hasattr(config, "workerinput"):
        return
    table = TALLY.table()
    if table:
        scale = trials_scale()
        knob = "" if scale == 1 else f", EAGLE_TUI_TRIALS={scale:g}"
        terminalreporter.section(f"attack tally (class, trials, promise held{knob})")
        terminalreporter.write_line(table)
    write_if_asked()
