"""Export and the SGLang loader contract, compared with SGLang 0.5.23's real source (the wheel).

What is derived from SGLang's code (sglang_source.py), not typed here: the parameter names and
shapes of LlamaForCausalLMEagle3 / Eagle3DeepseekV2ForCausalLM for our config (their __init__
bodies interpreted), what their real load_weights does with each exported tensor, and the
capture-id rule of set_eagle3_layers_to_capture.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from sglang_source import Source, capture_rule, module_params, run_load_weights

from remote_agent.eagle3.drafter.export.export import export_checkpoint, export_tensors, load_export
from remote_agent.eagle3.drafter.model import contract
from remote_agent.eagle3.drafter.model.model import Eagle3Drafter
from remote_agent.eagle3.drafter.train import checkpoint as ckpt
from remote_agent.eagle3.errors import Failed
from tests.support.drafters import tiny_drafter

ENTRY = {
    contract.LLAMA_ARCH: ("llama_eagle3", "LlamaForCausalLMEagle3"),
    contract.MLA_ARCH: ("kimi_k25_eagle3", "Eagle3DeepseekV2ForCausalLM"),
}
VARIANTS = [
    dict(arch="llama", num_key_value_heads=2),
    dict(arch="llama", num_key_value_heads=4, fc_norm=True, head_dim=12),
    dict(arch="mla"),
    dict(arch="mla", fc_norm=True, norm_output=True),
]


@pytest.fixture(scope="module")
def sglang(sglang_wheel) -> Source:
    return Source(sglang_wheel)


def hf_config(config: dict):
    from transformers import AutoConfig

    return AutoConfig.for_model(**json.loads(json.dumps(config)))


def fake_checkpoint(root: Path, m: Eagle3Drafter, capture=(2, 4, 5)) -> Path:
    state = {
        "model": {k: v for k, v in m.state_dict().items() if k != "embed_tokens.weight"},
        "vocab": {"d2t": m.d2t, "t2d": m.t2d},
        "model_config": m.config,
        "capture_layer_ids": list(capture),
        "num_target_layers": 8,
        "global_step": 7,
    }
    return ckpt.save(root, 7, state, {"step": 7})


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={v[k]}" for k in v))
def test_parameter_table_equals_sglang_module(sglang, variant):
    m = tiny_drafter(**variant)
    module, cls = ENTRY[m.config["architectures"][0]]
    theirs, conditional = module_params(sglang, module, cls, hf_config(m.config))
    assert not conditional, f"unresolved branches in SGLang's __init__: {conditional}"
    theirs.pop("model.embed_tokens.weight")  # replaced by the target's (set_embed)
    assert contract.sglang_params(m.config) == theirs


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={v[k]}" for k in v))
@pytest.mark.parametrize("prefix", ["midlayer", "layers.0"])
def test_real_load_weights_consumes_every_tensor_and_fills_every_parameter(sglang, variant, prefix):
    m = tiny_drafter(**variant)
    module, cls = ENTRY[m.config["architectures"][0]]
    params, _ = module_params(sglang, module, cls, hf_config(m.config))
    params.pop("model.embed_tokens.weight")
    tensors = export_tensors(m.state_dict(), m.config, m.d2t, m.t2d, torch.bfloat16, prefix)
    assert contract.check({k: tuple(v.shape) for k, v in tensors.items()}, m.config, [2, 4, 5]).ok
    fake, hot = run_load_weights(sglang, module, cls, params, tensors)
    assert torch.equal(hot, m.draft_ids())  # d2t became hot_token_id = d2t + arange
    for name, p in fake.items():
        assert p.loads, f"{name} never loaded"
        if name.endswith("qkv_proj.weight"):
            assert sorted(s for s, _ in p.loads) == ["k", "q", "v"]
        elif name.endswith("gate_up_proj.weight"):
            assert sorted(s for s, _ in p.loads) == [0, 1]
            assert all(shape == (p.shape[0] // 2, p.shape[1]) for _, shape in p.loads)
        else:
            assert p.loads == [(None, p.shape)], name
    loaded = sum(len(p.loads) for p in fake.values())
    # every tensor except d2t/t2d went somewhere (MLA fuses q_a + kv_a into one load)
    fused = 1 if m.config["architectures"][0] == contract.MLA_ARCH else 0
    assert loaded == len(tensors) - 2 - fused


def test_contract_routing_agrees_with_real_load_weights_on_bad_names(sglang):
    for variant in (dict(arch="llama"), dict(arch="mla")):
        m = tiny_drafter(**variant)
        arch = m.config["architectures"][0]
        module, cls = ENTRY[arch]
        params, _ = module_params(sglang, module, cls, hf_config(m.config))
        for bad in (
            "midlayer.self_attn.qkv.weight",
            "fc2.weight",
            "layers.1.mlp.down_proj.weight",
            "head.weight",
        ):
            fake, _ = run_load_weights(sglang, module, cls, params, {bad: torch.zeros(3)})
            assert not any(p.loads for p in fake.values()), bad  # SGLang drops it
            assert contract.route(bad, arch, contract.sglang_params(m.config)).kind == "skipped"


@pytest.mark.parametrize(
    "ids", [[1, 29, 57], [2, 30, 58], [1, 30, 58], [0, 5, 9], [3], None, [1], [2, 1]]
)
def test_capture_rule_is_sglangs(sglang, ids):
    real = capture_rule(sglang)
    assert contract.resolve_capture_ids(ids, 61) == real(ids, 61)


def test_export_writes_a_loadable_directory(tmp_path):
    m = tiny_drafter("llama", num_key_value_heads=2)
    ck = fake_checkpoint(tmp_path / "ck", m)
    info = export_checkpoint(ck, tmp_path / "out")
    out = Path(info["out"])
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "eagle3_export.json",
        "model.safetensors",
    ]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [contract.LLAMA_ARCH]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["draft_vocab_size"] == 50 and config["vocab_size"] == 100
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        assert f.get_tensor("lm_head.weight").dtype == torch.bfloat16
    assert "embed_tokens.weight" not in names and {"d2t", "t2d", "fc.weight"} <= names
    back, _ = load_export(out)
    for k, v in m.state_dict().items():
        if k != "embed_tokens.weight":
            torch.testing.assert_close(back.state_dict()[k].float(), v.float().bfloat16().float())


def test_a_checkpoint_failing_the_contract_is_not_written(tmp_path, monkeypatch):
    m = tiny_drafter("llama")
    ck = fake_checkpoint(tmp_path / "ck", m)
    import remote_agent.eagle3.drafter.export.export as export_mod

    real = export_mod.export_tensors

    def typo(*a, **kw):  # a renamed tensor: SGLang would skip it and keep a random lm_head
        t = real(*a, **kw)
        t["lmhead.weight"] = t.pop("lm_head.weight")
        return t

    monkeypatch.setattr(export_mod, "export_tensors", typo)
    with pytest.raises(Failed, match="lmhead.weight.*skipped") as exc:
        export_checkpoint(ck, tmp_path / "out")
    assert "lm_head.weight: never loaded" in str(exc.value)
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.tmp*"))


def test_contract_catches_missing_d2t_wrong_shapes_and_capture_drift():
    m = tiny_drafter("mla")
    tensors = {
        k: tuple(v.shape) for k, v in export_tensors(m.state_dict(), m.config, m.d2t, m.t2d).items()
    }
    no_d2t = dict(tensors)
    no_d2t.pop("d2t")
    assert any("no d2t" in p for p in contract.check(no_d2t, m.config).problems)
    wrong = dict(tensors)
    wrong["midlayer.self_attn.kv_b_proj.weight"] = (1, 1)
    assert any("kv_b_proj" in p and "shape" in p for p in contract.check(wrong, m.config).problems)
    drift = contract.check(tensors, m.config, intended_capture=[3, 4, 5])
    assert any("capture layers [2, 4, 5]" in p for p in drift.problems)


def test_mla_export_roundtrip(tmp_path):
    m = tiny_drafter("mla", draft_vocab=100)  # full vocabulary: d2t all zeros, still written
    ck = fake_checkpoint(tmp_path / "ck", m)
    out = Path(export_checkpoint(ck, tmp_path / "out", layer_prefix="layers.0")["out"])
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [contract.MLA_ARCH] and config["q_lora_rank"] == 24
    back, _ = load_export(out, dtype=torch.float32)
    assert torch.equal(back.d2t, torch.zeros(100, dtype=torch.long))
