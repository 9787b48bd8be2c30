"""The cockpit leaves no agent behind, however it ends: the harness (or an error) ends the app
while `q` is still closing the engine (Textual cancels every worker, the quit worker too), while
a step's job is followed, or before the run has opened.

The agent left running was finalized after the test's loop had closed: "Event loop is closed"
(PytestUnraisableExceptionWarning in test_reopen.py and test_cockpit_smaller.py), once a crash
at the session's end."""

from __future__ import annotations

import pytest

from tests.support.leaks import recording_agents, run_and_collect, running

from .helpers import opened, status, wait_for


@pytest.mark.parametrize("ending", ["quit", "follow", "open"])
def test_the_cockpit_leaves_no_agent_however_it_ends(env, monkeypatch, ending: str):
    started = recording_agents(monkeypatch)

    async def main() -> None:
        app = env.app()
        async with app.run_test(size=(100, 30)) as pilot:
            if ending == "open":
                return  # ends while the open connects (or right after)
            await opened(pilot)
            if ending == "quit":
                await pilot.press("q")  # the harness ends the app while the quit closes
                return
            app.main.select("long")
            await pilot.press("r")
            await wait_for(pilot, lambda: status(app, "long") == "running", what="the job")
            await wait_for(pilot, lambda: app.record("long").job_id, what="the job's id")

    assert run_and_collect(main) == []
    assert started, "no agent was started"
    assert running(started) == [], "an agent the cockpit started was never reaped"
