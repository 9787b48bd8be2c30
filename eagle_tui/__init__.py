"""eagle-tui: the operator's cockpit (Textual app and headless CLI) over the runbook engine."""

# the one version: pyproject.toml reads it (dynamic), `eagle-tui --version` prints it, and
# CHANGELOG.md has a section for it (tests/test_version.py ties the three)
__version__ = "0.1.0"
