"""Jobs run in the agent's environment: its python first on PATH, the agent package importable."""

from __future__ import annotations

import os
import sys

from .agent_proc import AgentProc


def test_jobs_see_the_agents_python_and_package(agent: AgentProc, tmp_path):
    agent.call(
        "job.start",
        job_id="env1",
        argv=[
            "python",
            "-c",
            "import sys, remote_agent.eagle3.progress as p; print(sys.executable); print(p.PREFIX)",
        ],
        cwd=str(tmp_path),
        detach=False,
    )
    data, end = agent.watch_bytes("env1")
    exe, prefix = data.decode().splitlines()
    assert os.path.dirname(exe) == os.path.dirname(sys.executable)
    assert prefix == "@@eagle3 "
    assert end["exit"]["exit_code"] == 0
