"""`eagle3 patch apply|revert --json` writes exactly one JSON object on stdout; progress records
(`@@eagle3 ...`) and any warning an import prints go to stderr. The last GPU run's
patch-apply.json was empty of JSON ("Expecting value") because bench/gpu_sglang.sh redirected
2>&1 into it: the staged site's sitecustomize imports transformers, whose torchao import prints
SyntaxWarnings on stderr, and the result record is on stderr too."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from patch_fixtures import make_site

from tests.support.paths import REPO


@pytest.mark.parametrize("action", ["apply", "revert"])
def test_json_stdout_stays_parseable_with_a_noisy_stderr(sglang_release, tmp_path, action):
    version, wheel = sglang_release
    target = make_site(wheel, tmp_path / "site", version=version)
    noisy = tmp_path / "noisy"
    noisy.mkdir()  # like the device's sitecustomize: an import that warns on stderr
    (noisy / "sitecustomize.py").write_text(
        "import sys\nprint('SyntaxWarning: x', file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{noisy}{os.pathsep}{REPO}"}
    cmd = [sys.executable, "-m", "remote_agent.eagle3", "patch"]
    if action == "revert":
        subprocess.run([*cmd, "apply", "--target", str(target), "--json"], env=env, check=True,
                       capture_output=True)  # fmt: skip
    proc = subprocess.run(
        [*cmd, action, "--target", str(target), "--version", version, "--json"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(proc.stdout)
    assert record["ok"] is True and record["state"] == (
        "patched" if action == "apply" else "pristine"
    )
    assert "SyntaxWarning" in proc.stderr and "@@eagle3" in proc.stderr
    with pytest.raises(ValueError):  # what the script read when it merged the two streams
        json.loads(proc.stderr + proc.stdout)
