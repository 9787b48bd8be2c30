"""`eagle3 online-check`: the one-box split of each GPU between SGLang and the trainer."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from remote_agent.eagle3.online.placement import check
from tests.support.paths import REPO


def test_the_arithmetic_and_the_remedy():
    ok = check(141.0, 0.62, 40.0, server_overhead_gb=6.0, margin_gb=4.0)
    assert ok["fits"] and ok["need_gb"] == round(0.62 * 141 + 6 + 40 + 4, 2)
    bad = check(141.0, 0.85, 40.0)
    assert not bad["fits"] and "lower --mem-fraction-static to 0.64" in bad["remedy"]
    fraction = float(bad["remedy"].split(" to ")[1].split()[0])
    assert check(141.0, fraction, 40.0)["fits"]  # the named fraction does fit


def test_cli_exit_codes():
    env = {**os.environ, "PYTHONPATH": str(REPO), "EAGLE3_PROGRESS": "json"}

    def run(*args):
        return subprocess.run([sys.executable, "-m", "remote_agent.eagle3", "online-check", *args],
                              env=env, capture_output=True, text=True, timeout=60)  # fmt: skip

    fits = run("--mem-fraction-static", "0.62", "--trainer-gb", "40", "--gpu-gb", "141")
    assert fits.returncode == 0 and "fits" in fits.stdout
    lines = fits.stderr.splitlines()  # the @@eagle3 records go to stderr
    result = [json.loads(x.split(" ", 1)[1]) for x in lines if x.startswith("@@eagle3 ")]
    assert result and result[-1]["fits"] is True
    tight = run("--mem-fraction-static", "0.9", "--trainer-gb", "40", "--gpu-gb", "141")
    assert tight.returncode == 1 and "DOES NOT FIT" in tight.stdout
    assert (
        run("--mem-fraction-static", "1.5", "--trainer-gb", "1", "--gpu-gb", "80").returncode == 2
    )
