"""Crashes on either side of the stream, as real processes killed for real (seeded):

* the producer (`eagle3 stream-reference`) dies in the middle of a SAMPLE frame and is
  restarted: the trainer drops the torn frame, asks again, and ends with weights equal to the
  offline run's bit for bit (no sample twice, none skipped);
* the trainer (`eagle3 train --online`) is SIGKILLed at a random moment (mid-step) and started
  again: it resumes from its checkpoint's position and ends equal to the offline run as well.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from remote_agent.eagle3.drafter.train import config as config_mod  # noqa: E402
from remote_agent.eagle3.drafter.train.loop import train  # noqa: E402
from remote_agent.eagle3.online import compare  # noqa: E402
from remote_agent.eagle3.online.producer import ReferenceProducer  # noqa: E402
from tests.support.paths import REPO  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def offline(inputs, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("offline") / "run"
    cfg = compare.config(inputs["target"], inputs["data"], run, inputs["dump"])
    train(config_mod.from_dict(cfg))
    return run


class Supervisor:
    """Runs the producer; when it dies it starts it again, with the next fault (then none)."""

    def __init__(self, target: Path, addr: str, port: int, faults: list[str], log: Path) -> None:
        self.cmd = [sys.executable, "-m", "remote_agent.eagle3", "stream-reference",
                    "--model", str(target), "--stream", addr, "--port", str(port)]  # fmt: skip
        self.faults, self.log, self.exits = list(faults), log, []
        self._stop = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            fault = self.faults.pop(0) if self.faults else ""
            env = {**ENV, "EAGLE3_STREAM_FAULT": fault}
            with open(self.log, "ab") as log:
                self._proc = subprocess.Popen(self.cmd, env=env, stdout=log, stderr=log)
            rc = self._proc.wait()
            if self._stop.is_set():
                return
            self.exits.append(rc)

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._thread.join(30)


def test_producer_killed_mid_sample(inputs, offline, tmp_path, tally):
    """Two deaths in one run (after a seeded number of frames each), restarted each time."""
    rng = random.Random(40)
    faults = [f"die_mid_frame:{rng.randrange(1, 12)}" for _ in range(2)]
    addr, port = f"unix:{tmp_path}/p.sock", free_port()
    sup = Supervisor(inputs["target"], addr, port, faults, tmp_path / "p.log")
    try:
        cfg = compare.config(
            inputs["target"], inputs["data"], tmp_path / "run",
            online={"server": f"http://127.0.0.1:{port}", "listen": addr,
                    "sample_timeout_s": 20, "producer_wait_s": 120},
        )  # fmt: skip
        train(config_mod.from_dict(cfg))
    finally:
        sup.stop()
    stats = json.loads((tmp_path / "run" / "online-stats.json").read_text())
    diff = compare.max_abs_diff(
        compare.final_weights(tmp_path / "run"), compare.final_weights(offline)
    )
    same = compare.losses(tmp_path / "run") == compare.losses(offline)
    ok = stats["listener"]["broken"] >= 2 and diff == 0.0 and same
    for i in range(2):  # one trial per death
        held = sup.exits[i : i + 1] == [17] and ok
        assert tally.trial("online: producer killed mid-sample, exact resume", held), (
            sup.exits,
            stats,
            diff,
        )


def _train_cmd(cfg_path: Path, url: str, addr: str) -> list[str]:
    return [sys.executable, "-m", "remote_agent.eagle3", "train", "--config", str(cfg_path),
            "--online", url, "--stream", addr]  # fmt: skip


EPOCHS_KILLED = 4  # 8 steps: each of the two killed processes has a step after its second


@pytest.fixture(scope="module")
def offline_longer(inputs, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("offline-longer") / "run"
    cfg = compare.config(
        inputs["target"], inputs["data"], run, inputs["dump"], train={"epochs": EPOCHS_KILLED}
    )
    train(config_mod.from_dict(cfg))
    return run


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _kill_inside_a_step(proc: subprocess.Popen, metrics: Path, rng: random.Random) -> bool:
    """SIGKILL `proc` a seeded fraction of one step's duration after its second step's metrics
    line (the duration measured between its first two lines): inside the next step, whatever
    the trainer's speed (a tiny step takes ~0.1 s since the fused loss and idle-row skipping;
    a fixed 0-1 s delay outlived the whole run). False: the process had already ended."""
    start, seen = _lines(metrics), []
    end = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < end and len(seen) < 2:
        new = _lines(metrics) - start
        seen += [time.monotonic()] * (new - len(seen))
        time.sleep(0.002)
    if len(seen) >= 2:
        time.sleep(rng.uniform(0.0, 1.0) * (seen[1] - seen[0]))
    killed = proc.poll() is None
    proc.kill()
    proc.wait()
    return killed


def test_trainer_killed_mid_step(inputs, offline_longer, tmp_path, tally):
    """Killed twice (each inside a step at a seeded moment), resumed each time."""
    rng = random.Random(50)
    addr = f"unix:{tmp_path}/t.sock"
    run = tmp_path / "run"
    cfg = compare.config(
        inputs["target"], inputs["data"], run, train={"save_every": 1, "epochs": EPOCHS_KILLED}
    )
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(json.dumps(cfg))
    kills = []
    with ReferenceProducer(inputs["target"], addr) as producer:
        cmd = _train_cmd(cfg_path, producer.url, addr)
        log = open(tmp_path / "train.log", "ab")
        metrics = run / "metrics.jsonl"
        for _ in range(2):
            proc = subprocess.Popen(cmd, env=ENV, stdout=log, stderr=log)
            kills.append(_kill_inside_a_step(proc, metrics, rng))
        again = subprocess.run(cmd, env=ENV, stdout=log, stderr=log, timeout=600)
        log.close()
    diff = compare.max_abs_diff(compare.final_weights(run), compare.final_weights(offline_longer))
    for killed in kills:
        held = killed and again.returncode == 0 and diff == 0.0
        assert tally.trial("online: trainer killed mid-step, exact resume", held), (
            kills,
            again.returncode,
            diff,
            (tmp_path / "train.log").read_text()[-3000:],
        )
