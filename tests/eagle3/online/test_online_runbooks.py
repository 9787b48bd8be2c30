"""The two online placements as shipped (issue 30): each runbook validates with the CLI, the
server streams where the trainer listens, the one-box memory split is checked before SGLang
starts, the two-box layout serves on one host and trains on the other over TCP; the README and
docs/RUNBOOKS.md show both, and the docs say when online beats offline."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runbook.loader import load_runbook
from tests.support.paths import REPO

ONE_BOX = REPO / "runbooks" / "kimi-k25-eagle3-online.yaml"
TWO_BOXES = REPO / "runbooks" / "kimi-k25-eagle3-online-2box.yaml"


def _steps(path):
    rb = load_runbook(path).runbook
    return rb, {s.id: s for s in rb.steps}, [s.id for s in rb.steps]


@pytest.mark.parametrize("path", [ONE_BOX, TWO_BOXES], ids=["one-box", "two-boxes"])
def test_online_runbook_validates_and_streams_where_the_trainer_listens(path):
    proc = subprocess.run([sys.executable, "-m", "eagle_tui.cli", "validate", str(path)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, steps, order = _steps(path)
    server, train = steps["stream-server"], steps["train"]
    assert server.env["EAGLE3_DUMP_MODE"] == "stream"
    addr = server.env["EAGLE3_STREAM_ADDR"]
    assert addr == train.env["STREAM_ADDR"] and "{k}" in addr  # one address per trainer rank
    assert '--stream "$STREAM_ADDR"' in str(train.run) and "--online http://" in str(train.run)
    assert "--resume auto" in str(train.run) and train.idempotent and train.retry is not None
    assert order.index("stream-server") < order.index("canary") < order.index("train")
    assert order.index("train") < order.index("stop-stream-server") < order.index("revert-patch")
    assert "stop-stream-server" in steps["revert-patch"].requires


def test_one_box_checks_the_memory_split_before_the_server_starts():
    rb, steps, order = _steps(ONE_BOX)
    fraction = rb.vars["server_mem_fraction"]
    assert f"--mem-fraction-static {fraction}" in str(steps["placement"].run)
    assert "online-check" in str(steps["placement"].run) and "--trainer-gb" in str(
        steps["placement"].run
    )
    assert "placement" in steps["stream-server"].requires
    assert f"--mem-fraction-static={fraction}" in str(steps["stream-server"].run)
    assert order.index("placement") < order.index("stream-server")


def test_two_boxes_serve_on_one_host_and_train_on_the_other_over_tcp():
    rb, steps, _ = _steps(TWO_BOXES)
    server, train = steps["stream-server"], steps["train"]
    assert server.host == "gpu-a" and train.host == "gpu-b"
    assert server.env["EAGLE3_STREAM_ADDR"].startswith(f"tcp:{rb.vars['train_addr']}:")
    assert f"--online http://{rb.vars['serve_addr']}:" in str(train.run)
    assert "--host=0.0.0.0" in str(server.run)  # reachable from gpu-b


def test_docs_show_both_placements_and_when_to_pick_online():
    readme = (REPO / "README.md").read_text()
    runbooks = (REPO / "docs" / "RUNBOOKS.md").read_text()
    for doc in (readme, runbooks):
        assert "kimi-k25-eagle3-online.yaml" in doc and "-online-2box.yaml" in doc
    assert "Pick online when" in runbooks and "Pick offline when" in runbooks
    production = (REPO / "runbooks" / "kimi-k25-eagle3.yaml").read_text()
    assert "training=online" in production and "kimi-k25-eagle3-online.yaml" in production
