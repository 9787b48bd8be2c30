"""SGLang 0.5.23's loader contract for EAGLE-3 drafters, restated so the exporter can check itself.

SGLang skips unknown weight names silently (llama_eagle3) or with a log line (kimi_k25_eagle3),
and leaves parameters it never received at their random init; a drafter exported with a typo
serves at acceptance ~1 and nobody notices. So the exporter routes every tensor through a
re-implementation of `load_weights` onto the parameters SGLang's module has, and refuses to
write unless every tensor lands on a parameter with the right shape, every parameter is filled
exactly once, `d2t` exists when the vocabulary is reduced, and the aux layer ids resolve to the
intended capture layers. tests/eagle3/drafter/test_contract.py checks this restatement against
SGLang's real source (parsed from the wheel).

Sources: sglang/srt/models/llama_eagle3.py (LlamaModel, LlamaDecoderLayer, load_weights),
sglang/srt/models/llama.py (LlamaAttention.qkv_proj/o_proj, LlamaMLP.gate_up_proj/down_proj),
sglang/srt/models/kimi_k25_eagle3.py (Eagle3MLAModel, Eagle3MLADecoderLayer, load_weights),
sglang/srt/models/deepseek_v2.py (DeepseekV2AttentionMLA, DeepseekV2MLP,
set_eagle3_layers_to_capture).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

LLAMA_ARCH = "LlamaForCausalLMEagle3"
MLA_ARCH = "Eagle3DeepseekV2ForCausalLM"

# llama_eagle3.load_weights: (param_name, shard_name, shard_id)
LLAMA_STACKED = [
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", 0),
    (".gate_up_proj", ".up_proj", 1),
]
LLAMA_LEGACY = {
    "midlayer": "layers.0",
    "aux_norm_low": "fc_norm.0",
    "aux_norm_mid": "fc_norm.1",
    "aux_norm_high": "fc_norm.2",
}
MLA_STACKED = [(".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1)]


def resolve_capture_ids(layer_ids: list[int] | None, num_layers: int) -> list[int]:
    """deepseek_v2.set_eagle3_layers_to_capture: +1 to every id only when the first id is 1."""
    if layer_ids is None:
        return [2, num_layers // 2, num_layers - 3]
    if layer_ids and layer_ids[0] == 1:
        return [v + 1 for v in layer_ids]
    return list(layer_ids)


def config_ids_for(capture: list[int]) -> list[int]:
    """Ids to write in eagle_config so SGLang captures `capture` (input-of-layer convention).

    A first capture layer of 1 cannot be expressed: [1, ...] is shifted to [2, ...], and any
    other first id is taken literally.
    """
    if capture and capture[0] == 1:
        raise ValueError(
            f"capture layers {capture} start at layer 1: SGLang shifts every id by +1 when the "
            "first id is 1, so no eagle_config can capture the input of layer 1 first; re-dump "
            "with a different first layer"
        )
    return list(capture)


def sglang_params(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of SGLang's drafter module (TP 1), embedding excluded.

    The embedding is replaced by the target's at load (set_embed) when hidden sizes match.
    """
    c = config
    h, th = c["hidden_size"], c.get("target_hidden_size") or c["hidden_size"]
    ids = (c.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    k = c.get("num_aux_hidden_states") or (len(ids) if ids else 3)
    inter, eps_dims = c["intermediate_size"], h
    draft_vocab = c.get("draft_vocab_size") or c["vocab_size"]
    arch = c["architectures"][0]
    p: dict[str, tuple[int, ...]] = {}
    if arch == LLAMA_ARCH:
        heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
        hd = c.get("head_dim") or h // heads
        layer = "model.layers.0."
        p[layer + "self_attn.qkv_proj.weight"] = ((heads + 2 * kv) * hd, 2 * h)
        p[layer + "self_attn.o_proj.weight"] = (h, heads * hd)
        p[layer + "mlp.gate_up_proj.weight"] = (2 * inter, h)
        p[layer + "mlp.down_proj.weight"] = (h, inter)
        for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            p[layer + n + ".weight"] = (eps_dims,)
        eagle = c.get("eagle_config") or {}
        if eagle.get("norm_before_fc", c.get("norm_before_fc", False)):
            p["model.input_norm.weight"] = (th * k,)
    elif arch == MLA_ARCH:
        heads = c["num_attention_heads"]
        ql, kvl = c["q_lora_rank"], c["kv_lora_rank"]
        nope, rope, vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        layer = "model.midlayer."
        p[layer + "self_attn.fused_qkv_a_proj_with_mqa.weight"] = (ql + kvl + rope, 2 * h)
        p[layer + "self_attn.q_a_layernorm.weight"] = (ql,)
        p[layer + "self_attn.q_b_proj.weight"] = (heads * (nope + rope), ql)
        p[layer + "self_attn.kv_a_layernorm.weight"] = (kvl,)
        p[layer + "self_attn.kv_b_proj.weight"] = (heads * (nope + vd), kvl)
        p[layer + "self_attn.o_proj.weight"] = (h, heads * vd)
        p[layer + "mlp.gate_up_proj.weight"] = (2 * inter, h)
        p[layer + "mlp.down_proj.weight"] = (h, inter)
        for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            p[layer + n + ".weight"] = (h,)
    else:
        raise ValueError(f"unknown drafter architecture {arch!r}")
    p["model.fc.weight"] = (h, th * k)
    if c.get("bias"):
        p["model.fc.bias"] = (h,)
    if c.get("fc_norm") or c.get("use_aux_norm"):
        for i in range(k):
            p[f"model.fc_norm.{i}.weight"] = (th,)
    p["model.norm.weight"] = (h,)
    if not c.get("tie_word_embeddings"):
        p["lm_head.weight"] = (draft_vocab, h)
    if h != th:
        p["model.embed_tokens.weight"] = (c["vocab_size"], h)
    return p


@dataclass
class Routed:
    """Where one checkpoint tensor goes: a parameter (and shard), d2t, ignored (t2d) or nowhere."""

    name: str
    kind: str  # "param" | "d2t" | "ignored" | "skipped"
    param: str | None = None
    shard: Any = None


def route(name: str, arch: str, params: dict[str, tuple[int, ...]]) -> Routed:
    """The name mapping of `load_weights` (llama_eagle3 or kimi_k25_eagle3), without loading."""
    if arch == LLAMA_ARCH:
        n = name
        for legacy, new in LLAMA_LEGACY.items():
            if legacy in n:
                n = n.replace(legacy, new)
        if "d2t" in n:
            return Routed(name, "d2t")
        if "t2d" in n:
            return Routed(name, "ignored")
        for param_name, weight_name, shard in LLAMA_STACKED:
            if weight_name not in n:
                continue
            n = n.replace(weight_name, param_name)
            target = f"model.{n}" if n not in params else n
            return (
                Routed(name, "param", target, shard)
                if target in params
                else Routed(name, "skipped")
            )
        target = n if n in params else f"model.{n}"
        return Routed(name, "param", target) if target in params else Routed(name, "skipped")
    if arch == MLA_ARCH:
        if name == "d2t" or name.endswith(".d2t"):
            return Routed(name, "d2t")
        if name == "t2d" or name.endswith(".t2d"):
            return Routed(name, "ignored")
        mapped = re.sub(r"^layers\.0\.", "midlayer.", name)
        if not mapped.startswith("lm_head."):
            mapped = f"model.{mapped}"
        for param_name, weight_name, shard in MLA_STACKED:
            if weight_name in mapped and mapped.replace(weight_name, param_name) in params:
                return Routed(name, "param", mapped.replace(weight_name, param_name), shard)
        if "q_a_proj" in mapped or "kv_a_proj_with_mqa" in mapped:
            fused = mapped.replace("kv_a_proj_with_mqa", "q_a_proj").replace(
                "q_a_proj", "fused_qkv_a_proj_with_mqa"
            )
            shard = "q_a" if "q_a_proj" in mapped else "kv_a"
            return (
                Routed(name, "param", fused, shard) if fused in params else Routed(name, "skipped")
            )
        return Routed(name, "param", mapped) if mapped in params else Routed(name, "skipped")
    raise ValueError(f"unknown drafter architecture {arch!r}")


def shard_shape(
    config: dict[str, Any], param_shape: tuple[int, ...], shard: Any
) -> tuple[int, ...]:
    """Shape of one shard of a fused parameter (what the checkpoint tensor must be)."""
    if shard is None:
        return param_shape
    c = config
    if shard in ("q", "k", "v"):
        heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
        hd = c.get("head_dim") or c["hidden_size"] // heads
        rows = heads * hd if shard == "q" else kv * hd
        return (rows, param_shape[1])
    if shard in (0, 1):
        return (param_shape[0] // 2, param_shape[1])
    if shard == "q_a":
        return (c["q_lora_rank"], param_shape[1])
    if shard == "kv_a":
        return (c["kv_lora_rank"] + c["qk_rope_head_dim"], param_shape[1])
    raise ValueError(f"unknown shard {shard!r}")


SHARDS = {
    "qkv_proj": {"q", "k", "v"},
    "gate_up_proj": {0, 1},
    "fused_qkv_a_proj_with_mqa": {"q_a", "kv_a"},
}


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    routes: list[Routed] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check(
    tensors: dict[str, tuple[int, ...]],
    config: dict[str, Any],
    intended_capture: list[int] | None = None,
    num_target_layers: int | None = None,
    target_context_length: int | None = None,
) -> Report:
    """Every tensor to exactly one parameter (shard) with the right shape; nothing left over;
    and a context length SGLang accepts next to a target of `target_context_length` tokens."""
    from remote_agent.eagle3.drafter.model.context import mismatch

    rep = Report()
    arch = (config.get("architectures") or ["?"])[0]
    if arch not in (LLAMA_ARCH, MLA_ARCH):
        rep.problems.append(
            f"architectures[0] is {arch!r}; SGLang EAGLE3 drafters: {LLAMA_ARCH}, {MLA_ARCH}"
        )
        return rep
    for key in (
        "hidden_size",
        "vocab_size",
        "draft_vocab_size",
        "target_hidden_size",
        "eagle_config",
    ):
        if key not in config:
            rep.problems.append(f"config.json lacks '{key}'")
    if config.get("rope_scaling"):
        rep.problems.append(
            f"rope_scaling is {config['rope_scaling']!r}; the drafter is trained with plain RoPE"
        )
    if target_context_length is not None:
        why = mismatch(config, target_context_length)
        if why:
            rep.problems.append(why)
    if config.get("num_hidden_layers") != 1:
        rep.problems.append(f"num_hidden_layers is {config.get('num_hidden_layers')}, expected 1")
    if rep.problems:
        return rep
    params = sglang_params(config)
    filled: dict[str, set] = {}
    for name, shape in tensors.items():
        r = route(name, arch, params)
        rep.routes.append(r)
        if r.kind == "skipped":
            rep.problems.append(
                f"{name}: SGLang has no parameter for this name (it would be skipped)"
            )
            continue
        if r.kind == "d2t":
            if tuple(shape) != (config["draft_vocab_size"],):
                rep.problems.append(
                    f"d2t: shape {tuple(shape)}, expected ({config['draft_vocab_size']},)"
                )
            continue
        if r.kind != "param":
            continue
        assert r.param is not None  # a "param" route names its parameter
        want = shard_shape(config, params[r.param], r.shard)
        if tuple(shape) != tuple(want):
            rep.problems.append(
                f"{name} -> {r.param}: shape {tuple(shape)}, expected {tuple(want)}"
            )
        got = filled.setdefault(r.param, set())
        key = r.shard if r.shard is not None else "whole"
        if key in got:
            rep.problems.append(f"{name} -> {r.param}: written twice")
        got.add(key)
    for param in params:
        need = next(
            (s for suffix, s in SHARDS.items() if param.endswith(suffix + ".weight")), {"whole"}
        )
        have = filled.get(param, set())
        if have != need:
            missing = sorted(map(str, need - have))
            rep.problems.append(
                f"{param}: never loaded ({', '.join(missing)} missing); SGLang would keep its random init"
            )
    if config["draft_vocab_size"] < config["vocab_size"] and not any(
        r.kind == "d2t" for r in rep.routes
    ):
        rep.problems.append("draft vocabulary is reduced but there is no d2t tensor")
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        rep.problems.append("eagle_config.eagle_aux_hidden_state_layer_ids is missing")
    elif intended_capture is not None:
        got_ids = resolve_capture_ids(ids, num_target_layers or max(ids) + 3)
        if got_ids != list(intended_capture):
            rep.problems.append(
                f"eagle_aux_hidden_state_layer_ids {ids} make SGLang capture layers {got_ids}, "
                f"but the drafter was trained on {list(intended_capture)}"
            )
    return rep
