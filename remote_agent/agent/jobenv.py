"""The environment jobs and `command` probes start from."""

from __future__ import annotations

import os
import sys

from remote_agent import package_parent


def job_base_env() -> dict[str, str]:
    """The environment jobs start from: the agent's, with its interpreter's bin directory first
    on PATH (so `python`, `torchrun` and `eagle3` resolve to the box's configured environment)
    and this package importable (so `python -m remote_agent.eagle3 ...` works from a zipapp)."""
    env = dict(os.environ)
    bindir = os.path.dirname(sys.executable or "")
    if bindir:
        parts = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and p != bindir]
        env["PATH"] = os.pathsep.join([bindir, *parts])
    parent = package_parent()
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != parent]
    env["PYTHONPATH"] = os.pathsep.join([parent, *rest])
    return env
