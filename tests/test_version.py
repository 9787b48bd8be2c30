"""One version: eagle_tui.__version__ is what the installed package, `eagle-tui --version` and
CHANGELOG.md say (pyproject.toml reads it: `dynamic = ["version"]`)."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version

import pytest

from eagle_tui import __version__
from tests.support.paths import REPO


def test_pyproject_reads_the_package_version() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "eagle_tui.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    assert version("eagle-tui") == __version__  # the installed metadata (make setup)


def test_the_cli_prints_it() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "eagle_tui.cli", "--version"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == f"eagle-tui {__version__}"


def test_the_changelog_has_its_section() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text
    assert re.search(rf"^## \[{re.escape(__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", text, re.M)
