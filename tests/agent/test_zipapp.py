"""The agent works from a zipapp (how it ships over SFTP): jobwrap launches from the archive."""

from __future__ import annotations

import shutil
import sys
import zipapp
from pathlib import Path

from .agent_proc import REPO, AgentProc


def build(dest: Path) -> Path:
    """Only remote_agent/*.py, the agent core and the wire contracts (no eagle3 payload), main =
    remote_agent.__main__:entry."""
    stage = dest / "stage"
    for sub in ("", "agent", "wire"):
        (stage / "remote_agent" / sub).mkdir(parents=True, exist_ok=True)
        for f in (REPO / "remote_agent" / sub).glob("*.py"):
            shutil.copy(f, stage / "remote_agent" / sub / f.name)
    pyz = dest / "agent.pyz"
    zipapp.create_archive(stage, pyz, main="remote_agent.__main__:entry")
    shutil.rmtree(stage)
    return pyz


def test_zipapp_serves_and_runs_jobs(tmp_path: Path) -> None:
    pyz = build(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # nothing on PYTHONPATH to lean on
    a = AgentProc(
        tmp_path / "spool", argv=[sys.executable, str(pyz), "serve"], env=env, pythonpath=False
    )
    try:
        assert a.hello()["protocol"] == 1
        a.call("job.start", job_id="z", shell="echo from zip; exit 5", detach=True)
        data, end = a.watch_bytes("z")
        assert data == b"from zip\n" and end["exit"]["exit_code"] == 5
        info = a.call("job.status", job_id="z")
        wrap_cmd = (tmp_path / "spool" / "jobs" / "z" / "jobwrap.log").read_text()
        assert info["exit"]["reason"] == "exited" and wrap_cmd == ""  # jobwrap ran cleanly
    finally:
        a.close()
