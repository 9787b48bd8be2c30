from __future__ import annotations

import asyncio
import inspect
import os

import pytest

from tests.support.jobs import kill_leftover_jobs

from .helpers import RUNBOOKS, Env

os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run `async def` tests of this directory on a fresh event loop (no asyncio plugin needed)."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}
    asyncio.run(pyfuncitem.obj(**kwargs))
    return True


@pytest.fixture
def host() -> str:
    """The box the tests drive. `local` now; the loopback sshd fixture (issue 3) can override this
    fixture (e.g. in a conftest of its own) to run the same tests over SSH."""
    return "local"


@pytest.fixture
def env(tmp_path, monkeypatch, host) -> Env:
    monkeypatch.setenv("EAGLE_TUI_SPOOL", str(tmp_path / "spool"))
    monkeypatch.setenv("EAGLE_TUI_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "work").mkdir()
    return Env(tmp_path, RUNBOOKS / "actions.yaml", host=host)


@pytest.fixture
def cockpit_env(env) -> Env:
    env.runbook = RUNBOOKS / "cockpit.yaml"
    return env


@pytest.fixture(autouse=True)
def _no_job_left_behind(tmp_path):
    """Detached jobs outlive the app by design: kill any a test left (e.g. a gated one)."""
    yield
    kill_leftover_jobs(tmp_path / "spool")


@pytest.fixture(autouse=True)
def _own_spool(tmp_path_factory, monkeypatch) -> None:
    """Each test its own box spool: runs of fixed ids (the seeded run) leave their audit head
    and driver lock in the spool, which must not meet the next test's fresh copy."""
    monkeypatch.setenv("EAGLE_TUI_SPOOL", str(tmp_path_factory.mktemp("spool")))
