"""Attack: a parallel context the hook cannot read (a field missing, None, raising as 0.5.23's
ParallelContext does before publish, DP replicas without a replica rank). The writer-rank lookup
must refuse with a DumpConfigError every time, never fall back to rank 0 (two ranks writing as 0
would interleave their rows in one dump). The hook package is the real shipped one, imported
under a stand-in `sglang.srt.runtime_context` (the one fake: SGLang is not importable on CPU)."""

from __future__ import annotations

import random
import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eagle3" / "extraction"))

from eagle3_standins import load_hook_package, standin_model  # noqa: E402

FIELDS = ("attn_tp_rank", "attn_cp_rank", "attn_dp_size", "attn_dp_rank")


class Parallel:
    def __init__(self, values: dict, broken: dict) -> None:
        self._values, self._broken = values, broken

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._broken:
            raise self._broken[name](f"parallel name {name!r} has not been written")
        if name not in self._values:
            raise AttributeError(f"ParallelContext has no {name!r}")
        return self._values[name]


def install(monkeypatch, parallel, server_args) -> None:
    rc = types.ModuleType("sglang.srt.runtime_context")
    rc.get_parallel = lambda: parallel
    if server_args is not None:
        rc.get_server_args = lambda: types.SimpleNamespace(**server_args)
    monkeypatch.setitem(sys.modules, "sglang", types.ModuleType("sglang"))
    monkeypatch.setitem(sys.modules, "sglang.srt", types.ModuleType("sglang.srt"))
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", rc)


def test_unreadable_ranks_are_refused_never_rank_0(tmp_path, monkeypatch, tally):
    hook = load_hook_package(tmp_path)
    rng = random.Random("writer-rank")
    model = standin_model(16, 8, [2, 4, 5])
    for _ in range(120):
        values = {"attn_tp_rank": 0, "attn_cp_rank": 0, "attn_dp_size": rng.choice([1, 2, 4])}
        values["attn_dp_rank"] = rng.randrange(values["attn_dp_size"])
        broken: dict = {}
        server_args: dict | None = {"dp_size": 1}
        attack = rng.choice(["missing", "none", "raises", "replicas", "no-server-args"])
        if attack in ("missing", "none", "raises"):
            name = rng.choice(FIELDS)
            if attack == "missing":
                del values[name]
            elif attack == "none":
                values[name] = None
            else:
                broken[name] = rng.choice([RuntimeError, ValueError])
        elif attack == "replicas":  # --dp-size 2 without DP attention, and no dp_rank to tell
            server_args = {"dp_size": rng.choice([2, 4]), "enable_dp_attention": False}
        else:
            server_args = None
        install(monkeypatch, Parallel(values, broken), server_args)
        try:
            got = hook._writer_rank(model)
            held = False
        except hook.DumpConfigError:
            got, held = "refused", True
        tally.trial("writer rank unreadable: refused, never rank 0", held)
        assert held, (attack, values, broken, server_args, got)


def test_readable_ranks_give_unique_tags(tmp_path, monkeypatch, tally):
    """The other side: every writer of a readable topology gets its own tag, the rest none."""
    hook = load_hook_package(tmp_path)
    model = standin_model(16, 8, [2, 4, 5])
    for replicas in (1, 2):
        for dp_size in (1, 2, 4):
            tags = []
            for replica in range(replicas):
                for dp_rank in range(dp_size):
                    for tp in range(2):
                        values = {"attn_tp_rank": tp, "attn_cp_rank": 0, "attn_dp_size": dp_size,
                                  "attn_dp_rank": dp_rank, "dp_rank": replica if replicas > 1 else None}  # fmt: skip
                        install(monkeypatch, Parallel(values, {}), {"dp_size": replicas})
                        tags.append(hook._writer_rank(model))
            writers = [t for t in tags if t is not None]
            held = len(writers) == len(set(writers)) == replicas * dp_size
            tally.trial("writer rank readable: one unique tag per writer", held)
            assert held, (replicas, dp_size, tags)
