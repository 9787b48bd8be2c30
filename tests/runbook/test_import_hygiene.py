"""The engine is usable without the TUI: nothing under runbook/ may import textual."""

import subprocess
import sys

from tests.support.paths import REPO


def test_runbook_modules_do_not_import_textual():
    modules = sorted(
        ".".join(p.relative_to(REPO).with_suffix("").parts)
        for p in (REPO / "runbook").rglob("*.py")
        if p.name != "__init__.py" or p.parent != REPO / "runbook"
    )
    code = (
        "import sys\n"
        f"for m in {modules!r}:\n"
        "    __import__(m)\n"
        "bad = sorted(k for k in sys.modules if k == 'textual' or k.startswith('textual.'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert len(modules) > 10
    assert out.stdout.strip() == "", f"runbook/ pulled in textual: {out.stdout}"


def test_headless_cli_does_not_import_textual():
    code = "import sys, eagle_tui.cli, eagle_tui.headless; print(any(k.startswith('textual') for k in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert out.stdout.strip() == "False"


def test_agent_core_is_stdlib_only():
    """The agent ships to bare boxes: importing it must not pull in any third-party package."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import remote_agent.agent.server, remote_agent.agent.jobs, remote_agent.agent.probes, remote_agent.agent.stats\n"
        "import remote_agent.wire.progress, remote_agent.eagle3.progress, remote_agent.wire.atomic_write\n"
        "import remote_agent.wire.check_vocabulary\n"
        "third = sorted({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)"
        " - {'remote_agent'})\n"
        "print(','.join(third))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert out.stdout.strip() == ""
