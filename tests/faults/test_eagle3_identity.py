"""Attacks on the dump's model identity (extraction/identity.py): two tiny targets of the same
shape (same config.json, different weights; and one with a different tokenizer) must never
share a dump. Extraction by the reference extractor and by the SGLang client (its loopback
stand-in from tests/eagle3/extraction), `verify-dumps --model` and `train` each refuse the
other model with exit code 2 and a message naming both."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

torch = pytest.importorskip("torch")

sys.path.insert(0, str(REPO / "tests" / "eagle3" / "extraction"))

from eagle3_standins import FakeSGLang, load_hook_package, write_dataset  # noqa: E402

from remote_agent.eagle3.cli import main  # noqa: E402
from remote_agent.eagle3.extraction.identity import FILE, model_identity  # noqa: E402

LENGTHS = [9, 14, 6, 11]
DUMP_ARGS = ["--disk-margin-gb", "0"]


@pytest.fixture(scope="module")
def twins(tiny_target, tmp_path_factory) -> dict[str, Path]:
    """a: the tiny target; b: same config and shapes, every tensor perturbed; c: a's weights
    with another chat template in its tokenizer files."""
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("twins")
    a, b, c = (shutil.copytree(tiny_target, root / n) for n in ("a", "b", "c"))
    for f in sorted(Path(b).glob("*.safetensors")):
        g = torch.Generator().manual_seed(1)
        tensors = {
            k: (v.float() + 1e-3 * torch.randn(v.shape, generator=g)).to(v.dtype)
            if v.is_floating_point()
            else v
            for k, v in load_file(str(f)).items()
        }
        save_file(tensors, str(f), metadata={"format": "pt"})
    cfg = Path(c) / "tokenizer_config.json"
    obj = json.loads(cfg.read_text())
    obj["chat_template"] = "{{ messages[0]['content'] }}"
    cfg.write_text(json.dumps(obj))
    (Path(c) / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    return {"a": Path(a), "b": Path(b), "c": Path(c)}


def hf_extract(model: Path, data: Path, out: Path, *extra) -> int:
    args = ["extract", "--backend", "hf", "--model", str(model), "--dataset", str(data)]
    return main([*args, "--out", str(out), *DUMP_ARGS, "--min-free-gb", "0", *map(str, extra)])


def test_the_twins_share_a_shape_and_differ_in_identity(twins, tally) -> None:
    ia, ib, ic = (model_identity(twins[n]) for n in "abc")
    same_shape = (twins["a"] / "config.json").read_bytes() == (
        twins["b"] / "config.json"
    ).read_bytes()
    held = same_shape and ia["weights_sha256"] != ib["weights_sha256"]
    assert tally.trial("identity: same config, other weights differ", held)
    held = (
        ic["tokenizer_sha256"] != ia["tokenizer_sha256"]
        and ic["weights_sha256"] == ia["weights_sha256"]
    )
    assert tally.trial("identity: other tokenizer differs", held)
    again = model_identity(twins["a"])
    assert tally.trial("identity: stable for one model", again == ia)


def test_reference_resume_refuses_the_other_model(twins, tmp_path, capsys, tally) -> None:
    data = write_dataset(tmp_path / "d.jsonl", LENGTHS)
    out = tmp_path / "dump"
    assert hf_extract(twins["a"], data, out, "--limit", 2) == 0
    recorded = json.loads((out / FILE).read_text())
    assert tally.trial("identity: recorded at extraction", recorded == model_identity(twins["a"]))
    capsys.readouterr()
    for other in ("b", "c"):
        # the same path with other bytes: the copy keeps meta.json's model path identical
        swapped = tmp_path / "swap"
        shutil.rmtree(swapped, ignore_errors=True)
        shutil.copytree(twins[other], swapped)
        (out / FILE).write_text(json.dumps({**recorded, "path": str(swapped.resolve())}))
        rc = hf_extract(swapped, data, out)
        err = capsys.readouterr().err
        named = str(swapped.resolve()) in err and "differ in" in err
        assert tally.trial("identity: reference resume refuses another model", rc == 2 and named)
    (out / FILE).write_text(json.dumps(recorded))
    assert hf_extract(twins["a"], data, out) == 0  # the right model resumes
    assert tally.trial("identity: reference resume with the same model", True)


@pytest.fixture
def sglang_env(tmp_path, monkeypatch):
    hookmod = load_hook_package(tmp_path / "hookpkg")

    def configure(dump_dir: Path) -> None:
        for key in list(os.environ):
            if key.startswith("EAGLE3_DUMP_"):
                monkeypatch.delenv(key)
        for k, v in {"DIR": str(dump_dir), "SHARD_MB": "0.05", "FLUSH_S": "0.5"}.items():
            monkeypatch.setenv(f"EAGLE3_DUMP_{k}", v)
        monkeypatch.setenv("EAGLE3_DUMP_MIN_FREE_MB", "0")
        hookmod.reset()

    monkeypatch.setattr(hookmod, "_writer_rank", lambda model: 0)
    yield hookmod, configure
    hookmod.reset()


def sglang_extract(url: str, data: Path, out: Path, *extra) -> int:
    args = ["extract", "--server", url, "--dataset", str(data), "--out", str(out), *DUMP_ARGS]
    return main([*args, "--canary-timeout", "30", "--dump-timeout", "60", *map(str, extra)])


def test_sglang_resume_refuses_a_server_of_the_other_model(
    twins, sglang_env, tmp_path, capsys, tally
) -> None:
    hookmod, configure = sglang_env
    data = write_dataset(tmp_path / "d.jsonl", LENGTHS)
    out = tmp_path / "dump"
    configure(out)
    with FakeSGLang(hookmod, twins["a"]) as fake:
        assert sglang_extract(fake.url, data, out, "--limit", 2) == 0
    recorded = json.loads((out / FILE).read_text())
    held = recorded["weights_sha256"] == model_identity(twins["a"])["weights_sha256"]
    assert tally.trial("identity: SGLang client records the served model", held)
    capsys.readouterr()
    configure(out)
    with FakeSGLang(hookmod, twins["b"]) as fake:
        rc = sglang_extract(fake.url, data, out)
        sent = fake.batches
    err = capsys.readouterr().err
    named = str(twins["a"].resolve()) in err and str(twins["b"].resolve()) in err
    held = rc == 2 and named and sent == 0  # refused before any request
    assert tally.trial("identity: SGLang resume refuses another model", held)


def test_verify_dumps_and_train_refuse_the_other_model(
    twins, tmp_path, capsys, tally, make_inputs
) -> None:
    inputs = make_inputs(twins["a"], tmp_path / "inputs")
    dump, data = Path(inputs["dump"]), Path(inputs["data"])
    verify = ["verify-dumps", str(dump), "--dataset", str(data), "--no-values", "--model"]
    assert tally.trial(
        "identity: verify-dumps accepts its model", main([*verify, str(twins["a"])]) == 0
    )
    capsys.readouterr()
    for other in ("b", "c"):
        rc = main([*verify, str(twins[other])])
        err = capsys.readouterr().err
        named = str(twins["a"].resolve()) in err and str(twins[other].resolve()) in err
        assert tally.trial("identity: verify-dumps refuses another model", rc == 2 and named)
    cfg = {
        "target": {"path": str(twins["b"])},
        "data": {"dump": str(dump), "dataset": str(data), "vocab": inputs["vocab"]},
        "drafter": {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64},
        "train": {"out_dir": str(tmp_path / "run"), "max_steps": 1, "device": "cpu"},
    }
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    rc = main(["train", "--config", str(path)])
    err = capsys.readouterr().err
    named = str(twins["a"].resolve()) in err and str(twins["b"].resolve()) in err
    held = rc == 2 and named and not (tmp_path / "run" / "checkpoints").exists()
    assert tally.trial("identity: train refuses another target", held)


@pytest.fixture
def make_inputs():
    def build(target: Path, out: Path) -> dict:
        from remote_agent.eagle3.drafter.eval.synthetic import build_inputs

        return build_inputs(
            target, out, n_samples=4, prompt_tokens=16, new_tokens=8, draft_vocab=64
        )

    return build
