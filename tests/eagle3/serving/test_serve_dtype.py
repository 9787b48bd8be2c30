"""The served dtype of target and drafter against SGLang's real `_get_and_verify_dtype`.

Found on the GPU (issue 16): the tiny target was saved float32, so `--dtype auto` ran it in
float16 while the bfloat16 drafter ran in bfloat16. The function is compiled from each supported
release's wheel and executed on the same config dicts our check reads; `sglang-launch` must refuse
the split before anything starts, and accept it once `--dtype` makes both agree.
"""

from __future__ import annotations

import ast
import json
import logging
import zipfile
from pathlib import Path

import pytest
import torch

from remote_agent.eagle3.drafter.export.serve_dtype import dtype_mismatch, served_dtype
from remote_agent.eagle3.errors import BadInput
from remote_agent.eagle3.serving import sglang_launch_cmd

TORCH_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


@pytest.fixture(scope="module")
def real_dtype(sglang_release):
    """(version, the wheel's _get_and_verify_dtype compiled and callable)."""
    version, wheel = sglang_release
    with zipfile.ZipFile(wheel) as z:
        text = z.read("sglang/srt/configs/model_config.py").decode()
    body = ast.parse(text).body
    fn = next(
        n for n in body if isinstance(n, ast.FunctionDef) and n.name == "_get_and_verify_dtype"
    )
    table = next(
        n
        for n in body
        if isinstance(n, ast.Assign)
        and any(getattr(t, "id", None) == "_STR_DTYPE_TO_TORCH_DTYPE" for t in n.targets)
    )
    g: dict = {
        "torch": torch,
        "logger": logging.getLogger("sglang-under-test"),
        "PretrainedConfig": object,
        "Union": __import__("typing").Union,
    }
    exec(compile(ast.Module([table, fn], []), "model_config.py", "exec"), g)
    return version, g["_get_and_verify_dtype"]


CONFIGS = [
    {"model_type": "deepseek_v3", "dtype": "float32"},
    {"model_type": "deepseek_v3", "dtype": "bfloat16"},
    {"model_type": "deepseek_v3", "torch_dtype": "float16"},
    {"model_type": "llama", "torch_dtype": "bfloat16"},
    {"model_type": "llama"},
    {"model_type": "gemma2", "torch_dtype": "float32"},
]


@pytest.mark.parametrize("flag", ["auto", "bfloat16", "float16", "float32"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: json.dumps(c, sort_keys=True))
def test_served_dtype_is_sglangs(real_dtype, config, flag):
    _version, real = real_dtype
    assert served_dtype(config, flag) == TORCH_NAMES[real(dict(config), flag)]


def _model(tmp_path: Path, name: str, config: dict) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


def _args(tmp_path: Path, target: dict, drafter: dict, mode: str, extra: list[str]):
    parser = __import__("argparse").ArgumentParser()
    sglang_launch_cmd.add_arguments(parser)
    base = {"max_position_embeddings": 4096, "num_hidden_layers": 8, "model_type": "deepseek_v3"}
    model = _model(tmp_path, "target", {**base, **target})
    draft = _model(
        tmp_path,
        "drafter",
        {"max_position_embeddings": 4096, "architectures": ["LlamaForCausalLMEagle3"], **drafter},
    )
    argv = [mode, "--model", str(model), "--draft", str(draft), "--tp", "1", "--print"]
    if mode == "extract":
        argv += ["--dump-dir", str(tmp_path / "dumps"), "--sglang-version", "0.5.14"]
    return parser.parse_args(argv + [f"--arg={a}" for a in extra])


@pytest.mark.parametrize("mode", ["extract", "serve"])
def test_launch_refuses_a_float32_target_beside_a_bf16_drafter(tmp_path, mode, capsys):
    args = _args(tmp_path, {"dtype": "float32"}, {"torch_dtype": "bfloat16"}, mode, [])
    with pytest.raises(BadInput) as e:
        sglang_launch_cmd.run(args)
    msg = str(e.value)
    assert "target in float16" in msg and "drafter in bfloat16" in msg
    assert "--arg=--dtype --arg=bfloat16" in msg
    assert "launching:" not in capsys.readouterr().out  # refused before anything starts


@pytest.mark.parametrize("mode", ["extract", "serve"])
def test_launch_accepts_once_dtype_makes_them_agree(tmp_path, mode, capsys):
    args = _args(
        tmp_path, {"dtype": "float32"}, {"torch_dtype": "bfloat16"}, mode, ["--dtype", "bfloat16"]
    )
    assert sglang_launch_cmd.run(args) == 0
    assert "--dtype bfloat16" in capsys.readouterr().out


def test_a_bf16_target_and_drafter_need_no_flag():
    assert dtype_mismatch({"dtype": "bfloat16"}, {"torch_dtype": "bfloat16"}, []) is None
    # Kimi-K2.5 wraps its language model: the text config decides
    assert (
        dtype_mismatch({"text_config": {"dtype": "bfloat16"}}, {"torch_dtype": "bfloat16"}, [])
        is None
    )
    # a wrapper declaring bfloat16 only at its top level is bfloat16 too
    kimi = {"torch_dtype": "bfloat16", "text_config": {"model_type": "kimi_k2"}}
    assert dtype_mismatch(kimi, {"torch_dtype": "bfloat16"}, []) is None
    assert "target in bfloat16" in (dtype_mismatch(kimi, {"torch_dtype": "float16"}, []) or "")
