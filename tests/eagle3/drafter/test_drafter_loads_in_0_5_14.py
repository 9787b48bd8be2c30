"""The exported drafter against SGLang 0.5.14's own drafter classes (the release the GPU check
serves): parameter table and the real load_weights, exactly as test_drafter_export.py does for
0.5.23 (its helpers, another wheel)."""

from __future__ import annotations

import pytest
import torch
from sglang_source import Source, module_params, run_load_weights
from test_drafter_export import ENTRY, VARIANTS, hf_config

from remote_agent.eagle3.drafter.export.export import export_tensors
from remote_agent.eagle3.drafter.model import contract
from tests.support.drafters import tiny_drafter


@pytest.fixture(scope="module")
def sglang_0_5_14() -> Source:
    from tests.conftest import download_sglang_wheel

    return Source(download_sglang_wheel("0.5.14"))


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={v[k]}" for k in v))
def test_parameter_table_equals_0_5_14_module(sglang_0_5_14, variant):
    m = tiny_drafter(**variant)
    module, cls = ENTRY[m.config["architectures"][0]]
    theirs, conditional = module_params(sglang_0_5_14, module, cls, hf_config(m.config))
    assert not conditional, f"unresolved branches in SGLang's __init__: {conditional}"
    theirs.pop("model.embed_tokens.weight")
    assert contract.sglang_params(m.config) == theirs


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={v[k]}" for k in v))
def test_0_5_14_load_weights_fills_every_parameter(sglang_0_5_14, variant):
    m = tiny_drafter(**variant)
    module, cls = ENTRY[m.config["architectures"][0]]
    params, _ = module_params(sglang_0_5_14, module, cls, hf_config(m.config))
    params.pop("model.embed_tokens.weight")
    tensors = export_tensors(m.state_dict(), m.config, m.d2t, m.t2d, torch.bfloat16, "midlayer")
    fake, hot = run_load_weights(sglang_0_5_14, module, cls, params, tensors)
    assert torch.equal(hot, m.draft_ids())
    for name, p in fake.items():
        assert p.loads, f"{name} never loaded"
