"""Tiny but real targets, built offline: a byte-level BPE tokenizer trained on the Python standard
library's sources with a Kimi-style chat template, and a small DeepseekV3 (MLA + MoE) model.

Used by the CI tests, the demo runbook and (with the `gpu` preset, then trained) the GPU runs.
Deterministic for a given seed, Python version and package versions. Built once and cached by
cache.ensure_tiny; the Kimi-K2.5-shaped wrapper around these presets is kimi.py.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Kimi-K2.5-style special tokens (the real Kimi tokenizer is tiktoken-based and not available offline).
SPECIAL_TOKENS = [
    "[BOS]",
    "[EOS]",
    "[PAD]",
    "[UNK]",
    "<|im_system|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_middle|>",
    "<|im_end|>",
    "<think>",
    "</think>",
]

# Rendering matches Kimi's shape: `<|im_{role}|>{role}<|im_middle|>{content}<|im_end|>`; assistant
# reasoning is wrapped in <think>...</think> before the answer.
KIMI_STYLE_TEMPLATE = (
    "{%- for m in messages -%}"
    "<|im_{{ m['role'] }}|>{{ m['role'] }}<|im_middle|>"
    "{%- if m['role'] == 'assistant' and m.get('reasoning_content') -%}"
    "<think>{{ m['reasoning_content'] }}</think>"
    "{%- endif -%}"
    "{{ m['content'] }}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


@dataclass(frozen=True)
class TinyPreset:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    vocab_size: int
    max_position_embeddings: int
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # items of config.rope_scaling


# Kimi-K2.5's context settings (its config.json): 262144 positions, YaRN from 4096
KIMI_YARN = (
    ("type", "yarn"),
    ("rope_type", "yarn"),
    ("factor", 64.0),
    ("original_max_position_embeddings", 4096),
    ("beta_fast", 1.0),
    ("beta_slow", 1.0),
    ("mscale", 1.0),
    ("mscale_all_dim", 1.0),
)

PRESETS: dict[str, TinyPreset] = {
    # CPU: seconds to build and run; 8 layers so the capture ids [2, 4, 5] are distinct.
    "ci": TinyPreset(64, 8, 4, 32, 32, 16, 8, 16, 128, 32, 8, 2, 2048, 2048),
    # GPU: about 0.3 B parameters, real MLA head shapes scaled down; trained a few minutes.
    "gpu": TinyPreset(1024, 8, 16, 256, 128, 64, 32, 64, 2816, 512, 16, 4, 16384, 4096),
    # GPU, Kimi-shaped: Kimi's MLA head dims (kv_lora 512, rope 64, nope 128, v 128) and its
    # context settings, so a served drafter meets the real 262144-token constraint (issue 16)
    "kimi-gpu": TinyPreset(
        1024, 8, 16, 768, 512, 128, 64, 128, 2816, 512, 16, 4, 16384, 262144, KIMI_YARN
    ),
}


def stdlib_corpus(max_bytes: int) -> list[str]:
    """Python sources of the running interpreter's standard library, sorted, up to max_bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        if "test" in path.parts[-2:][0] or path.name.startswith("test"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return texts


def build_tokenizer(out_dir: Path, vocab_size: int, corpus_bytes: int = 3_000_000):
    """Train a byte-level BPE on stdlib sources; save a HF fast tokenizer with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(stdlib_corpus(corpus_bytes), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="[BOS]",
        eos_token="<|im_end|>",
        pad_token="[PAD]",
        unk_token="[UNK]",
    )
    fast.chat_template = KIMI_STYLE_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return fast


def deepseek_config(preset: TinyPreset, vocab_size: int, eos_token_id: int, pad_token_id: int):
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=vocab_size,
        hidden_size=preset.hidden_size,
        intermediate_size=preset.intermediate_size,
        moe_intermediate_size=preset.moe_intermediate_size,
        num_hidden_layers=preset.num_hidden_layers,
        num_attention_heads=preset.num_attention_heads,
        num_key_value_heads=preset.num_attention_heads,
        n_shared_experts=1,
        n_routed_experts=preset.n_routed_experts,
        num_experts_per_tok=preset.num_experts_per_tok,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        kv_lora_rank=preset.kv_lora_rank,
        q_lora_rank=preset.q_lora_rank,
        qk_rope_head_dim=preset.qk_rope_head_dim,
        qk_nope_head_dim=preset.qk_nope_head_dim,
        v_head_dim=preset.v_head_dim,
        max_position_embeddings=preset.max_position_embeddings,
        # the legacy keyword, still taken (as rope_parameters) though no longer in the signature
        rope_scaling=dict(preset.rope_scaling) if preset.rope_scaling else None,  # pyright: ignore[reportCallIssue]
        rms_norm_eps=1e-5,
        bos_token_id=0,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        tie_word_embeddings=False,
        architectures=["DeepseekV3ForCausalLM"],
    )


def build_target(out_dir: Path, tokenizer_dir: Path, preset_name: str, seed: int = 0):
    """A random-init tiny DeepseekV3 saved with safetensors next to its tokenizer."""
    import torch
    from transformers import AutoTokenizer, DeepseekV3ForCausalLM

    preset = PRESETS[preset_name]
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = deepseek_config(preset, len(tok), tok.eos_token_id, tok.pad_token_id)
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(config)
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tok.save_pretrained(str(out_dir))
    return model, tok
