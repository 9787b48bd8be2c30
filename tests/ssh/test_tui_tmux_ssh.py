"""The cockpit's tmux end-to-end scenario (tests/tui/test_tmux_e2e.py) over the real loopback
sshd: run to the end with key presses, type the confirmation, quit mid-job, reattach, finish,
export the audit and verify it, with every step on the box reached over SSH."""

from __future__ import annotations

import pytest

from tests.tui.test_tmux_e2e import run_tmux_e2e
from tests.tui.tmux_driver import TmuxDriver

pytestmark = [
    pytest.mark.sshd,
    pytest.mark.skipif(
        not TmuxDriver.available(), reason="tmux is not installed (apt-get install tmux)"
    ),
]


def test_tmux_scenario_over_ssh(ssh_cli, box, tmp_path, capsys):
    host_args = [
        "--host",
        "box",
        "--ssh-config",
        str(ssh_cli.ssh_config),
        "--known-hosts",
        str(ssh_cli.known_hosts),
    ]
    run_tmux_e2e(tmp_path, host_args, capsys)
    from runbook.audit import read_records

    (audit,) = (tmp_path / "state" / "runs").glob("*/audit.jsonl")
    steps = [
        r for r in read_records(audit) if r["event"] == "step.state" and r["status"] == "running"
    ]
    assert steps and all(r["where"]["transport"] == "ssh" and r["where"]["host_key"] for r in steps)
