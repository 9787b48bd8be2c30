"""Issue 15, defects 3 and 11 outside the cockpit: `status` exits non-zero when a step failed and
never cuts ids when piped; `runs` lists every run with whole ids; `--version`."""

from __future__ import annotations

import pytest

from eagle_tui import __version__
from eagle_tui.cli import main as cli_main

RUNBOOK = """\
name: a-runbook-with-a-rather-long-name-for-narrow-tables
steps:
  - id: a-step-with-a-long-identifier-that-a-pipe-must-not-truncate
    title: fails
    run: exit 4
"""


def test_status_exits_1_on_a_failed_step_and_keeps_ids_whole_when_piped(tmp_path, capsys):
    rb = tmp_path / "rb.yaml"
    rb.write_text(RUNBOOK)
    common = ["--state-dir", str(tmp_path / "state")]
    assert cli_main(["run", str(rb), *common, "--auto", "--host", "local", "--quiet"]) == 1
    capsys.readouterr()
    assert cli_main(["status", *common]) == 1  # capsys: stdout is not a TTY, as in a pipe
    out = capsys.readouterr().out
    assert "a-step-with-a-long-identifier-that-a-pipe-must-not-truncate" in out
    assert "…" not in out
    assert cli_main(["runs", *common]) == 0
    out = capsys.readouterr().out
    assert "a-runbook-with-a-rather-long-name-for-narrow-tables" in out and "…" not in out
    assert "unfinished: 1 failed" in out  # a failed run can be retried: not finished


def test_version(capsys):
    with pytest.raises(SystemExit):
        from eagle_tui.cli import build_parser

        build_parser().parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"eagle-tui {__version__}"
