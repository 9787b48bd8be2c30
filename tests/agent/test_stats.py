"""Disk/GPU samples: ring buffer, `stats.since`, persistence across agent restarts."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from remote_agent.agent.stats import Stats
from tests.support.waiting import wait_for

from .agent_proc import AgentProc


def stats_events(a: AgentProc) -> list[dict]:
    return [e for e in a.events if e["event"] == "stats"]


def test_sample_shape(agent: AgentProc, tmp_path: Path) -> None:
    s = agent.call("stats.sample", paths=[str(tmp_path), str(tmp_path / "not-yet")])
    assert s["seq"] is None and s["t"] > 0
    assert [d["path"] for d in s["disk"]] == [str(tmp_path), str(tmp_path / "not-yet")]
    for d in s["disk"]:
        assert d["total"] > 0 and 0 <= d["free"] <= d["total"] and d["used"] >= 0
    if shutil.which("nvidia-smi") is None:
        assert s["gpus"] is None and s["gpu_error"] == "no GPU: nvidia-smi not found"


def test_watch_since_and_restart(start_agent: Callable[..., AgentProc], spool: Path) -> None:
    a1 = start_agent()
    assert a1.call("stats.watch", paths=["/"], interval_s=0.05) == {"last_seq": 0}
    a1.wait_until(lambda: len(stats_events(a1)) >= 6, 30, "6 stats events")
    seqs = [e["seq"] for e in stats_events(a1)]
    assert seqs == list(range(1, len(seqs) + 1))
    assert all(e["disk"][0]["path"] == "/" for e in stats_events(a1))
    since = a1.call("stats.since", seq=3)["samples"]
    assert [s["seq"] for s in since][:3] == [4, 5, 6]
    a1.kill9()

    # A fresh agent serves the history that was persisted, then continues the sequence.
    a2 = start_agent(keep_raw=True)
    history = a2.call("stats.since", seq=0)
    hseqs = [s["seq"] for s in history["samples"]]
    assert hseqs[: len(seqs)] == seqs and hseqs == list(range(1, len(hseqs) + 1))
    last = history["last_seq"]
    assert a2.call("stats.watch", paths=["/"], interval_s=0.05)["last_seq"] == last
    a2.wait_until(lambda: len(stats_events(a2)) >= 2, 30, "new samples")
    new = [e["seq"] for e in stats_events(a2)]
    assert new[0] == last + 1 and new == list(range(last + 1, last + 1 + len(new)))

    # unwatch: no more events, but the sampler keeps filling the ring.
    a2.call("stats.unwatch")
    mark = len(a2.raw)
    stop_seq = a2.call("stats.since", seq=0)["last_seq"]
    wait_for(lambda: a2.call("stats.since", seq=0)["last_seq"] >= stop_seq + 3, 30, "sampling")
    assert not [x for x in a2.raw[mark:] if b'"event":"stats"' in x]
    lines = (spool / "stats.jsonl").read_text().splitlines()
    file_seqs = [json.loads(x)["seq"] for x in lines]
    assert file_seqs == sorted(set(file_seqs))


def test_two_agents_on_one_spool_share_one_sequence(
    start_agent: Callable[..., AgentProc], spool: Path
) -> None:
    """After a reconnect the old agent may still be alive: only one of them samples, the
    other follows the file, and both hand out the same samples under the same seq."""
    a1 = start_agent()
    a2 = start_agent()
    a1.call("stats.watch", paths=["/"], interval_s=0.05)
    a2.call("stats.watch", paths=["/"], interval_s=0.05)
    for a in (a1, a2):
        a.wait_until(lambda a=a: len(stats_events(a)) >= 8, 30, "events on both agents")
    e1 = {e["seq"]: e["t"] for e in stats_events(a1)}
    e2 = {e["seq"]: e["t"] for e in stats_events(a2)}
    common = set(e1) & set(e2)
    assert common and all(e1[s] == e2[s] for s in common)
    file_seqs = [json.loads(x)["seq"] for x in (spool / "stats.jsonl").read_text().splitlines()]
    assert file_seqs == list(range(1, len(file_seqs) + 1))


def test_ring_and_file_are_trimmed(tmp_path: Path) -> None:
    os.mkdir(tmp_path / "spool", 0o700)
    s = Stats(tmp_path / "spool", emit=lambda e: None, ring=5)
    for _ in range(23):
        s.tick()
    assert [x["seq"] for x in s.ring] == [19, 20, 21, 22, 23]
    lines = (tmp_path / "spool" / "stats.jsonl").read_text().splitlines()
    assert len(lines) <= 11 and json.loads(lines[-1])["seq"] == 23
    fresh = Stats(tmp_path / "spool", emit=lambda e: None, ring=5)
    assert [x["seq"] for x in fresh.op_since({"seq": 20})["samples"]] == [21, 22, 23]


@pytest.mark.parametrize("args", [{"paths": "/"}, {"paths": ["/"], "interval_s": -1}, {"seq": "x"}])
def test_bad_stats_args(agent: AgentProc, args: dict) -> None:
    op = "stats.since" if "seq" in args else "stats.watch"
    resp = agent.request(op, args)
    assert resp["ok"] is False and resp["error"]["type"] == "bad_request"
