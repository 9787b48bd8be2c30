"""Fixtures for the SSH transport: real sshd instances on loopback, their keys, a test
known_hosts and ssh config, and a CLI runner that points `eagle-tui run` at them."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.faults.tally import TALLY, Tally, write_if_asked

from .helpers import SshCli, write_ssh_config
from .sshd import Sshd, keygen, kill_tagged


@pytest.fixture
def tally() -> Tally:
    """The fault suite's attack tally (tests/faults/tally.py): these trials count there too."""
    return TALLY


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001
    table = TALLY.table()
    others = any(  # the faults' and multibox conftests print the same table when loaded too
        getattr(p, "__name__", "").endswith(("faults.conftest", "multibox.conftest"))
        for p in config.pluginmanager.get_plugins()
    )
    if table and not others:
        terminalreporter.section("attack tally (class, trials, promise held)")
        terminalreporter.write_line(table)
        write_if_asked()


@pytest.fixture(scope="session")
def ssh_keys(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("client-keys")
    return {"user": keygen(d / "id_ed25519"), "stranger": keygen(d / "id_stranger")}


def _start(tmp_path_factory, ssh_keys, name: str, **kw) -> Sshd:
    if os.geteuid() != 0:
        pytest.skip("the test sshd runs as root (login as root with a test HOME)")
    root = tmp_path_factory.mktemp(name)
    home = root / "home"
    s = Sshd(root / "sshd", [ssh_keys["user"].with_suffix(".pub")], home, uuid.uuid4().hex, **kw)
    return s.start()


@pytest.fixture(scope="session")
def box(tmp_path_factory, ssh_keys):
    s = _start(tmp_path_factory, ssh_keys, "box")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def box2(tmp_path_factory, ssh_keys):
    """A second sshd: the jump host, and the second box of multi-host runs."""
    s = _start(tmp_path_factory, ssh_keys, "box2", log_level="DEBUG1")
    yield s
    s.stop()


@pytest.fixture
def ssh_cli(tmp_path, box, box2, ssh_keys):
    known = tmp_path / "known_hosts"
    known.write_text(box.known_hosts_line() + box2.known_hosts_line())
    config = write_ssh_config(tmp_path / "ssh_config", ssh_keys["user"], box=box, box2=box2)
    cli = SshCli(tmp_path, known, config)
    yield cli
    cli.cleanup()
    for s in (box, box2):
        kill_tagged(s.tag)  # agents and jobs of this test (each test's CLI has exited)
