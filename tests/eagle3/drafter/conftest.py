"""Fixtures for the drafter tests: tiny target -> regenerated data, dump and vocab, once per session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models run fastest (and steadiest on a shared 2-core box) on one thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_inputs(tiny_target: Path, tmp_path_factory) -> dict:
    """data.jsonl + dump/ + vocab.safetensors built from the tiny target's own greedy answers."""
    import torch

    from remote_agent.eagle3.drafter.eval.synthetic import build_inputs

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("drafter-inputs")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        info = build_inputs(
            tiny_target, out, n_samples=32, prompt_tokens=40, new_tokens=40, draft_vocab=256
        )
    finally:
        torch.set_num_threads(before)
    info["target"] = str(tiny_target)
    info["root"] = str(out)
    return info


def write_config(path: Path, inputs: dict, **sections) -> Path:
    """A tiny training config (JSON) for the tiny target; `sections` override per section."""
    cfg = {
        "target": {"path": inputs["target"]},
        "data": {
            "dump": inputs["dump"],
            "dataset": inputs["data"],
            "vocab": inputs["vocab"],
            "max_tokens": 256,
            "prefetch": 2,
        },
        "drafter": {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128},
        "train": {
            "out_dir": str(path.parent / "run"),
            "epochs": 1,
            "lr": 1e-3,
            "log_every": 1,
            "save_every": 0,
            "ttt_steps": 3,
            "device": "cpu",
        },
    }
    for name, values in sections.items():
        if name == "drafter" and values.get("arch") == "mla":
            cfg[name] = {}  # GQA settings do not apply to MLA
        cfg.setdefault(name, {}).update(values)
    path.write_text(json.dumps(cfg))
    return path


@pytest.fixture
def make_config():
    """write_config as a fixture (test modules here are not a package)."""
    return write_config
