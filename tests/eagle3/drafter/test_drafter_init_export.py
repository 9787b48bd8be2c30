"""`eagle3 export --init`: an untrained drafter for a target without any dump (what SGLang 0.5.14
needs loaded before it captures anything), through the same export and contract as a trained
one, and what sglang-launch extract then makes the 0.5.14 server capture."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from sglang_source import Source, module_params, run_load_weights
from test_drafter_export import ENTRY, hf_config

from remote_agent.eagle3.cli import main
from remote_agent.eagle3.drafter.export.export import load_export

REPO = Path(__file__).resolve().parents[3]


def test_init_export_is_a_loadable_drafter_for_the_target(tiny_target, tmp_path, capsys):
    out = tmp_path / "init"
    args = [
        "export",
        "--init",
        "--config",
        "tiny-cpu",
        "--target",
        str(tiny_target),
        "--out",
        str(out),
    ]
    assert main(args) == 0
    assert "untrained" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    target = json.loads((tiny_target / "config.json").read_text())
    n = target["num_hidden_layers"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, n // 2, n - 3]
    assert config["target_hidden_size"] == target["hidden_size"]
    assert config["max_position_embeddings"] >= target["max_position_embeddings"]
    drafter, _ = load_export(out)
    assert sum(p.numel() for p in drafter.parameters()) > 0
    # the real 0.5.14 loader consumes it
    from tests.conftest import download_sglang_wheel

    src = Source(download_sglang_wheel("0.5.14"))
    module, cls = ENTRY[config["architectures"][0]]
    params, _ = module_params(src, module, cls, hf_config(config))
    params.pop("model.embed_tokens.weight")
    from safetensors.torch import load_file

    fake, _ = run_load_weights(src, module, cls, params, load_file(str(out / "model.safetensors")))
    assert all(p.loads for p in fake.values())
    # and with it, sglang-launch extract on 0.5.14 expects exactly the target's default layers
    # (the CPU tiny target is float32, which `--dtype auto` would serve as float16 beside this
    # bfloat16 drafter: serve_dtype.py refuses that, so the one dtype is named)
    proc = subprocess.run(
        [sys.executable, "-m", "remote_agent.eagle3", "sglang-launch", "extract", "--model",
         str(tiny_target), "--dump-dir", str(tmp_path / "d"), "--draft-model", str(out),
         "--sglang-version", "0.5.14", "--arg=--dtype", "--arg=bfloat16", "--print"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert re.search(rf"EAGLE3_DUMP_LAYER_IDS={2},{n // 2},{n - 3}\b", proc.stdout)
    assert main(args) == 2  # exists: not replaced without --force
    assert main([*args, "--force"]) == 0


def test_init_export_bad_input(tiny_target, tmp_path, capsys):
    assert main(["export", "--init", "--config", "tiny-cpu", "--out", str(tmp_path / "x")]) == 2
    assert "--target" in capsys.readouterr().err
    assert main(["export", "--out", str(tmp_path / "x")]) == 2
    assert "--init" in capsys.readouterr().err
    assert main(["export", "--init", "--config", "tiny-cpu", "--target", str(tmp_path),
                 "--out", str(tmp_path / "x")]) == 2  # fmt: skip
    assert "no config.json" in capsys.readouterr().err
