"""The demo-sized pipeline on two real boxes (network namespaces, one OpenSSH sshd each) through
one 2-host runbook: extraction split over both and verified over the union, with box 1 cut
off the network and its sshd killed mid-extraction, then back (reattached, no sample lost or
duplicated); the drafter trained by torchrun across both namespaces (gloo), box 1's trainer
killed mid-run (node lost), the run resumed from the shared checkpoint, and its weights equal
to the same training on one host with two ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.multibox.twobox import TwoBoxes, final_state, max_abs_diff, runbook, train_config
from tests.ssh.helpers import OutputTail
from tests.ssh.netns import have_netns
from tests.ssh.sshd import have_sshd
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.sshd, pytest.mark.netns]
torch = pytest.importorskip("torch")
SAMPLES = 28
TOLERANCE = 1e-5  # gloo all-reduce over 2 ranks sums in the same order on 1 host or 2


@pytest.fixture(scope="module")
def boxes(tmp_path_factory):
    if not (have_netns() and have_sshd()):
        pytest.skip("needs root, `ip netns` and OpenSSH sshd")
    b = TwoBoxes.start(tmp_path_factory.mktemp("twobox"), str(os.getpid() % 100000))
    yield b
    b.close()


@pytest.fixture(scope="module")
def inputs(tiny_target, tmp_path_factory) -> dict:
    from remote_agent.eagle3.drafter.eval.synthetic import build_inputs

    out = tmp_path_factory.mktemp("twobox-inputs")
    torch.manual_seed(0)
    info = build_inputs(
        tiny_target, out, n_samples=SAMPLES, prompt_tokens=24, new_tokens=24, draft_vocab=128
    )
    return {**info, "target": str(tiny_target)}


def _verify_json(dumps: Path, data: str) -> dict:
    import json

    out = subprocess.run(
        [sys.executable, "-m", "remote_agent.eagle3", "verify-dumps", str(dumps), "--dataset",
         data, "--json", "--no-values"],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    return json.loads(out.stdout[out.stdout.index("{") : out.stdout.rindex("}") + 1])


def test_two_box_pipeline_survives_a_lost_box(boxes, inputs, tmp_path, tally):
    work = tmp_path / "work"
    work.mkdir()
    run2 = work / "drafter-run"
    config = train_config(tmp_path / "train.json", inputs, run2, epochs=1)
    cli = boxes.cli(tmp_path)
    rb = cli.runbook(runbook(boxes, work, inputs, config))
    tail = OutputTail(cli.popen("run", str(rb), "--auto"))
    try:
        # ---- box 1 lost mid-extraction: link down and sshd killed, then back ---------------
        wait_for(lambda: tail.count("extract.box1 ⋯") or tail.count("extract.box1 │"), 90, "box1")
        boxes.lose(1)
        cut_while = json.loads(next((cli.state / "runs").glob("*/state.json")).read_text())
        assert cut_while["steps"]["extract.box1"]["status"] == "running"  # mid-job
        wait_for(lambda: tail.count("box1: reconnecting"), 20, "the engine to notice")
        time.sleep(2.0)
        boxes.recover(1)
        wait_for(lambda: (run2 / "checkpoints").is_dir() and any(
            int(p.name.split("-")[1]) >= 3 for p in (run2 / "checkpoints").glob("step-*")
        ), 180, "a checkpoint of the 2-host training")  # fmt: skip
        # ---- a node lost mid-training: box 1's trainer killed ------------------------------
        # the node's whole training: torchrun's agent and its worker
        assert boxes.kill_jobs(1, "torchrun", "remote_agent.eagle3 train"), "box 1's trainer"
        code = tail.wait(120)
    except BaseException:
        print(tail.text()[-6000:])
        raise
    finally:
        cli.cleanup()
    text = tail.text()
    steps = cli.state_json()["steps"]
    assert code == 1, text[-3000:]
    for h in ("box0", "box1"):  # extraction: reattached, never relaunched
        assert steps[f"extract.{h}"]["status"] == "succeeded", steps[f"extract.{h}"]
        assert steps[f"extract.{h}"]["attempt"] == 1
    report = _verify_json(work / "hidden-states", inputs["data"])
    held = report["ok"] and report["missing"] == 0 and report["duplicates"] == 0
    tally.trial("box cut off + sshd killed mid-extraction: no sample lost or duplicated", held)
    assert held, report
    assert report["samples"] == SAMPLES
    assert steps["train"]["status"] in ("failed", "lost"), steps["train"]
    # the audit names every host and its key: per-host records and the fan-out's outcome
    audit = cli.audit()
    for i, h in enumerate(("box0", "box1")):
        recs = [r for r in audit if r.get("step") == f"extract.{h}"]
        assert recs and all(r["where"]["host_key"] == boxes.sshd[i].fingerprint for r in recs)
    (done,) = [r for r in audit if r.get("step") == "extract" and r.get("status") == "succeeded"]
    assert [(x["host"], x["rank"], x["host_key"]) for x in done["hosts"]] == [
        (f"box{i}", i, boxes.sshd[i].fingerprint) for i in range(2)
    ]
    # ---- resume: both nodes relaunched, training continues from the shared checkpoint --------
    tail = OutputTail(cli.popen("run", str(rb), "--auto"))
    try:
        assert tail.wait(240) == 0, tail.text()[-3000:]
    except BaseException:
        print(tail.text()[-6000:])
        cli.cleanup()
        raise
    steps = cli.state_json()["steps"]
    assert steps["train"]["status"] == "succeeded"
    assert steps["train.box0"]["attempt"] == 2 and steps["train.box1"]["attempt"] == 2
    assert "resumed from step-" in tail.text()
    # ---- the same training on one host with two ranks -------------------------------------
    run1 = tmp_path / "one-host"
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "remote_agent.eagle3", "train", "--config", str(config), "--set",
         f"data.dump={work / 'hidden-states'}", "--out", str(run1)],
        check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=Path(__file__).resolve().parents[2], timeout=240,
    )  # fmt: skip
    a, b = final_state(run2), final_state(run1)
    assert a["global_step"] == b["global_step"]
    diff = max_abs_diff(a["model"], b["model"])
    held = diff <= TOLERANCE
    tally.trial("node lost mid-training, resumed: equal to one host with 2 ranks", held)
    assert held, f"max_abs_diff {diff}"
