"""The drafter's context length against SGLang 0.5.23's real loader code (read from the wheel).

`_derive_context_length` (sglang/srt/configs/model_config.py) and `get_context_length`
(sglang/srt/utils/hf_transformers/common.py) are compiled from the wheel's source and executed;
only their environment (the env-var switch, is_in_ci, logger) is stubbed, set as in production.
The draft's config is read with transformers' AutoConfig, as SGLang reads it.
"""

from __future__ import annotations

import ast
import json
import logging
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from remote_agent.eagle3.drafter.export.export import export_checkpoint
from remote_agent.eagle3.drafter.model import context
from remote_agent.eagle3.drafter.train import config as config_mod
from remote_agent.eagle3.drafter.train.loop import train
from remote_agent.eagle3.errors import BadInput, Failed
from remote_agent.eagle3.serving import sglang_launch_cmd

KIMI_LEN = 262144
KIMI_YARN = {
    "type": "yarn",
    "factor": 64.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
KIMI_EXAMPLE = config_mod.EXAMPLES / "kimi-k25-8gpu.yaml"


def _function(text: str, name: str, cls: str | None = None) -> ast.FunctionDef:
    body = ast.parse(text).body
    if cls is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)


def _assignment(text: str, name: str) -> ast.Assign:
    return next(
        n
        for n in ast.parse(text).body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == name for t in n.targets)
    )


@pytest.fixture(scope="module")
def real(sglang_wheel) -> SimpleNamespace:
    """The wheel's get_context_length and ModelConfig._derive_context_length, compiled."""
    with zipfile.ZipFile(sglang_wheel) as z:
        common = z.read("sglang/srt/utils/hf_transformers/common.py").decode()
        model_config = z.read("sglang/srt/configs/model_config.py").decode()
    g: dict = {}
    mod = ast.Module(
        [_assignment(common, "CONTEXT_LENGTH_KEYS"), _function(common, "get_context_length")], []
    )
    exec(compile(mod, "sglang/srt/utils/hf_transformers/common.py", "exec"), g)
    derive = _function(model_config, "_derive_context_length", cls="ModelConfig")
    h: dict = {
        "get_context_length": g["get_context_length"],
        "envs": SimpleNamespace(
            SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=SimpleNamespace(get=lambda: False)
        ),
        "is_in_ci": lambda: False,
        "logger": logging.getLogger("sglang-under-test"),
        "Optional": object,
    }
    exec(compile(ast.Module([derive], []), "sglang/srt/configs/model_config.py", "exec"), h)
    return SimpleNamespace(get_context_length=g["get_context_length"], derive=h[derive.name])


def _serve_as_draft(real, draft_dir: Path, target_dir: Path) -> int:
    """What SGLang does with the pair: the target's context length, then the draft's ModelConfig."""
    from transformers import AutoConfig

    target = AutoConfig.from_pretrained(str(target_dir))
    target_len = real.get_context_length(getattr(target, "text_config", None) or target)
    draft = AutoConfig.from_pretrained(str(draft_dir))
    me = SimpleNamespace(is_draft_model=True, hf_text_config=draft, hf_config=draft)
    real.derive(me, target_len)
    return me.context_len


@pytest.fixture(scope="module")
def kimi_target(tiny_target: Path, tmp_path_factory) -> Path:
    """The tiny MLA target with Kimi-K2.5's context settings (262144 tokens, YaRN x64 of 4096)."""
    out = tmp_path_factory.mktemp("kimi-shaped")
    for f in tiny_target.iterdir():
        if f.name != "config.json":
            (out / f.name).symlink_to(f)
    c = json.loads((tiny_target / "config.json").read_text())
    c.update(max_position_embeddings=KIMI_LEN, rope_scaling=KIMI_YARN)
    (out / "config.json").write_text(json.dumps(c))
    return out


@pytest.fixture(scope="module")
def kimi_inputs(kimi_target: Path, tmp_path_factory) -> dict:
    """Data and a dump made with the Kimi-shaped target itself: its config differs from the
    tiny target's, so the tiny dump's recorded identity refuses it (extraction/identity.py)."""
    from remote_agent.eagle3.drafter.eval.synthetic import build_inputs

    out = tmp_path_factory.mktemp("kimi-inputs")
    info = build_inputs(kimi_target, out, n_samples=6, prompt_tokens=24, new_tokens=16)
    return {**info, "target": str(kimi_target), "root": str(out)}


CASES = [
    {"max_position_embeddings": 131072},
    {"max_position_embeddings": KIMI_LEN, "rope_scaling": KIMI_YARN},
    {"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}},
    {"max_position_embeddings": 8192, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
    {"seq_length": 32768, "max_position_embeddings": 2048},
    {},
]


@pytest.mark.parametrize("cfg", CASES)
def test_our_context_length_is_sglangs(real, cfg):
    assert context.context_length(cfg) == real.get_context_length(SimpleNamespace(**cfg))
    # Kimi-K2.5's multimodal wrapper: SGLang reads its text_config
    assert context.context_length({"text_config": cfg}) == real.get_context_length(
        SimpleNamespace(**cfg)
    )


def _kimi_training_config(tmp_path, tiny_inputs, make_config, target: Path, **drafter) -> Path:
    shipped = yaml.safe_load(KIMI_EXAMPLE.read_text())["drafter"]
    path = make_config(
        tmp_path / "c.json",
        tiny_inputs,
        drafter={**shipped, **drafter},
        train={"max_steps": 1, "ttt_steps": 2},
    )
    data = json.loads(path.read_text())
    data["target"]["path"] = str(target)
    data["data"]["max_tokens"] = 128
    path.write_text(json.dumps(data))
    return path


def test_shipped_kimi_drafter_is_accepted_by_sglang_for_a_262144_token_target(
    real, kimi_target, kimi_inputs, tmp_path, make_config
):
    cfg = _kimi_training_config(tmp_path, kimi_inputs, make_config, kimi_target)
    train(config_mod.load(cfg))
    out = Path(export_checkpoint(tmp_path / "run", tmp_path / "export", target=kimi_target)["out"])
    exported = json.loads((out / "config.json").read_text())
    assert exported["max_position_embeddings"] == KIMI_LEN and exported["rope_scaling"] is None
    assert exported["num_attention_heads"] == 64 and exported["head_dim"] == 128
    assert _serve_as_draft(real, out, kimi_target) == KIMI_LEN
    args = SimpleNamespace(model=kimi_target, draft=out, arg=[])
    sglang_launch_cmd.refuse_short_drafter(args)  # the launcher agrees


def test_a_short_drafter_fails_in_real_sglang_and_is_refused_by_export_and_serve(
    real, kimi_target, tiny_target, tiny_inputs, tmp_path, make_config
):
    # trained for the tiny target (2048 tokens), then paired with the 262144-token one
    cfg = _kimi_training_config(tmp_path, tiny_inputs, make_config, tiny_target)
    train(config_mod.load(cfg))
    out = Path(export_checkpoint(tmp_path / "run", tmp_path / "export")["out"])
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 2048
    with pytest.raises(ValueError, match="SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"):
        _serve_as_draft(real, out, kimi_target)  # the real failure this guards against
    with pytest.raises(Failed, match=r"context length is 2048.*target's is 262144") as exc:
        export_checkpoint(tmp_path / "run", tmp_path / "export2", target=kimi_target)
    assert not (tmp_path / "export2").exists() and "max_position_embeddings" in str(exc.value)
    args = SimpleNamespace(model=kimi_target, draft=out, arg=[])
    with pytest.raises(BadInput, match=r"2048.*262144"):
        sglang_launch_cmd.refuse_short_drafter(args)
    # serving the target at the drafter's length is what SGLang accepts too
    sglang_launch_cmd.refuse_short_drafter(
        SimpleNamespace(model=kimi_target, draft=out, arg=["--context-length=2048"])
    )


def test_an_explicit_shorter_max_position_is_refused_at_training(
    kimi_target, kimi_inputs, tmp_path, make_config
):
    cfg = _kimi_training_config(
        tmp_path, kimi_inputs, make_config, kimi_target, max_position_embeddings=131072
    )
    with pytest.raises(BadInput, match=r"131072.*262144"):
        train(config_mod.load(cfg))
    assert not (tmp_path / "run" / "checkpoints").exists() or not any(
        (tmp_path / "run" / "checkpoints").iterdir()
    )


def test_serve_launch_refuses_before_starting_anything(kimi_target, tmp_path, capsys):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"max_position_embeddings": 131072}))
    from remote_agent.eagle3.cli import main

    code = main(
        ["sglang-launch", "serve", "--model", str(kimi_target), "--draft", str(draft), "--print"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "131072" in err and "262144" in err and "launching" not in err


def test_the_shipped_kimi_config_leaves_the_context_to_the_target():
    shipped = yaml.safe_load(KIMI_EXAMPLE.read_text())["drafter"]
    assert "max_position_embeddings" not in shipped and "rope_scaling" not in shipped
    assert shipped["num_attention_heads"] * shipped["head_dim"] == 8192
