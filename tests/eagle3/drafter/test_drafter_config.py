"""The strict config loader and the train command's input errors (exit 2, file and key named)."""

from __future__ import annotations

import json

import pytest

from remote_agent.eagle3.cli import main
from remote_agent.eagle3.drafter.train import config as config_mod
from remote_agent.eagle3.errors import BadInput


def test_defaults_and_documented_fields():
    cfg = config_mod.load(None)
    assert cfg.train.ttt_steps == 7 and cfg.train.step_weight == 0.8
    assert (cfg.train.sim_steps, cfg.train.sim_topk, cfg.train.sim_draft_tokens) == (3, 1, 4)
    text = config_mod.explain()
    for section in config_mod.SECTIONS.values():
        for f in section.__dataclass_fields__.values():
            assert f.metadata.get("doc"), f"{f.name} has no documentation"
            assert f"  {f.name}:" in text


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"train": {"lrr": 1}}, r"unknown key 'train.lrr' \(did you mean 'lr'\?\)"),
        ({"trian": {}}, r"unknown section 'trian' \(did you mean 'train'\?\)"),
        ({"train": {"ttt_steps": "7"}}, r"'train.ttt_steps' must be int"),
        ({"train": {"ttt_steps": True}}, r"'train.ttt_steps' must be int"),
        ({"drafter": {"arch": "gpt"}}, r"'drafter.arch' must be one of llama, mla"),
        ({"train": {"betas": [0.9, "x"]}}, r"'train.betas' must be list\[float\]"),
        ({"data": []}, r"'data' must be a mapping"),
    ],
)
def test_strict_loader_rejects_with_a_clear_message(tmp_path, data, message):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BadInput, match=message) as exc:
        config_mod.load(path)
    assert str(path) in str(exc.value)


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 2.0e-4\n  epochs: 3\ndata:\n  vocab: null\n")
    cfg = config_mod.load(path, ["train.lr=5e-5", "drafter.arch=mla", "data.max_len=2048"])
    assert cfg.train.lr == 5e-5 and cfg.train.epochs == 3 and cfg.drafter.arch == "mla"
    assert cfg.data.max_len == 2048 and cfg.data.vocab is None
    assert isinstance(config_mod.load(path, ["train.lr=1"]).train.lr, float)
    with pytest.raises(BadInput, match="section.key"):
        config_mod.load(path, ["lr=1"])


def test_train_command_exit_codes(tmp_path, capsys):
    assert main(["train", "--explain"]) == 0
    assert "ttt_steps" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text('{"train": {"nope": 1}}')
    assert main(["train", "--config", str(bad)]) == 2
    assert "unknown key 'train.nope'" in capsys.readouterr().err
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    assert main(["train", "--config", str(empty)]) == 2
    assert "data.dump is required" in capsys.readouterr().err


def test_example_configs_load():
    from pathlib import Path

    examples = Path(config_mod.__file__).parents[1] / "examples"  # drafter/examples/
    found = sorted(examples.glob("*.yaml"))
    assert found
    for path in found:
        cfg = config_mod.load(path)
        assert cfg.train.ttt_steps >= 1, path
