"""A tiny target shaped like the Kimi-K2.5 checkpoint, built offline (issue 26).

What makes it Kimi-shaped, the way both HF transformers 5.17 and SGLang 0.5.14 load the real one:
- config.json: `model_type: kimi_k25`, `architectures: [KimiK25ForConditionalGeneration]`, a
  DeepSeek-V3 (MLA + MoE) `text_config` and a tiny `vision_config` (both transformers' key names
  and SGLang's `init_pos_emb_*` / `vt_*` names, so each side builds the same small tower);
- weights in the released layout: `language_model.model.layers.N.*`,
  `language_model.lm_head.weight`, `vision_tower.*`, `mm_projector.proj.{0,2}.*` (transformers'
  own save writes `language_model.model.blocks.N`, which SGLang cannot load: renamed here);
- a tiktoken tokenizer with remote code: `tiktoken.model` (a BPE trained here, ranks in merge
  order), `tokenization_kimi.py` (kimi_remote/), Kimi's special tokens at Kimi's offsets in
  the 256 reserved ids after the base vocabulary, `chat_template.jinja` with thinking and tool
  calls;
- `kimi_k25_processor.py` + preprocessor_config.json: SGLang builds the multimodal processor of a
  Kimi-K2.5 model even for text-only serving (AutoProcessor, trust_remote_code).
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

REMOTE = Path(__file__).resolve().parent / "kimi_remote"
ARCHITECTURE = "KimiK25ForConditionalGeneration"
TEXT_ARCHITECTURE = "DeepseekV3ForCausalLM"
# the Kimi-K2.5-shaped presets: `KimiK25ForConditionalGeneration` around the named
# deepseek.PRESETS DeepSeek-V3, with a tiktoken tokenizer; the base vocabulary leaves Kimi's 256
# reserved special ids on top, so the model vocabulary is the preset's
KIMI_WRAPPED = {"kimi-k25-ci": "ci", "kimi-k25-gpu": "kimi-gpu"}
# Kimi's special tokens by offset from the base vocabulary (163584 in the real tokenizer:
# [BOS] 163584, <|im_end|> 163586, <|media_pad|> 163605 = media_placeholder_token_id, ...)
SPECIAL_OFFSETS = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|im_end|>",
    3: "<|im_user|>",
    4: "<|im_assistant|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    9: "[EOT]",
    10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>",
    12: "<|tool_calls_section_end|>",
    13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>",
    15: "<|tool_call_end|>",
    17: "<|im_middle|>",
    18: "<|media_begin|>",
    19: "<|media_content|>",
    20: "<|media_end|>",
    21: "<|media_pad|>",
    22: "<think>",
    23: "</think>",
    254: "[UNK]",
    255: "[PAD]",
}
RESERVED = 256

# Kimi-K2.5's conversation shape (written for this target): a default system turn, tools declared
# in a `tool_declare` system turn, `<|im_{role}|>{name}<|im_middle|>...<|im_end|>`; an assistant
# turn at or after the last user turn keeps its reasoning (`<think>r</think>`, thinking mode and
# interleaved tool-call reasoning), earlier ones render `<think></think>`; tool calls as
# `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|>`;
# tool results as `## Return of ID`. `thinking=false` (instant mode) closes the think block in the
# generation prompt.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>"
    "{%- endif -%}"
    "{%- if not messages or messages[0]['role'] != 'system' -%}"
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI."
    "<|im_end|>{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- set name = m.get('name') or m['role'] -%}"
    "{%- if m['role'] == 'user' -%}<|im_user|>{{ name }}<|im_middle|>{{ m['content'] }}"
    "{%- elif m['role'] == 'assistant' -%}<|im_assistant|>{{ name }}<|im_middle|>"
    "{%- if loop.index0 > ns.last_user and m.get('reasoning_content') -%}"
    "<think>{{ m['reasoning_content'] }}</think>"
    "{%- else -%}<think></think>{%- endif -%}"
    "{{ m['content'] or '' }}"
    "{%- if m.get('tool_calls') -%}<|tool_calls_section_begin|>"
    "{%- for tc in m['tool_calls'] -%}"
    "<|tool_call_begin|>functions.{{ tc['function']['name'] }}:{{ loop.index0 }}"
    "<|tool_call_argument_begin|>"
    "{%- if tc['function']['arguments'] is string -%}{{ tc['function']['arguments'] }}"
    "{%- else -%}{{ tc['function']['arguments'] | tojson }}{%- endif -%}<|tool_call_end|>"
    "{%- endfor -%}<|tool_calls_section_end|>{%- endif -%}"
    "{%- elif m['role'] == 'tool' -%}<|im_system|>tool<|im_middle|>## Return of "
    "{{ m.get('tool_call_id', '') }}\n{{ m['content'] }}"
    "{%- else -%}<|im_system|>{{ name }}<|im_middle|>{{ m['content'] }}"
    "{%- endif -%}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if thinking is defined and not thinking -%}<think></think>{%- endif -%}"
    "{%- endif -%}"
)

# SGLang's Kimi-K2.5 processor reads these at startup (real values from Kimi-K2.5's processor)
MEDIA_PROC_CFG = {
    "patch_size": 14,
    "merge_kernel_size": 2,
    "in_patch_limit": 16384,
    "patch_limit_on_one_side": 512,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


def _unicode_to_byte() -> dict[str, int]:
    # the remote tokenizer's own byte alphabet: one definition for both sides
    from remote_agent.eagle3.tiny.kimi_remote.tokenization_kimi import byte_alphabet

    return {c: b for b, c in byte_alphabet().items()}


def build_tokenizer(out_dir: Path, base_vocab: int, corpus_bytes: int = 3_000_000) -> None:
    """Train a byte-level BPE on stdlib sources and write it the way Kimi ships its tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from remote_agent.eagle3.tiny.deepseek import stdlib_corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=base_vocab,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(stdlib_corpus(corpus_bytes), trainer=trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    to_byte = _unicode_to_byte()
    # ranks: the 256 bytes, then every merge in training order (tiktoken merges by rank)
    ranks: dict[bytes, int] = {bytes([b]): b for b in range(256)}
    for merge in merges:
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        token = bytes(to_byte[c] for c in left + right)
        ranks.setdefault(token, len(ranks))
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"{base64.b64encode(t).decode()} {r}" for t, r in sorted(ranks.items(), key=_rank)]
    (out_dir / "tiktoken.model").write_text("\n".join(lines) + "\n")
    base = len(ranks)
    added = {
        str(base + off): {
            "content": name,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for off, name in SPECIAL_OFFSETS.items()
    }
    config = {
        "tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "added_tokens_decoder": added,
        "additional_special_tokens": [
            n for n in SPECIAL_OFFSETS.values() if n not in ("[BOS]", "[EOS]", "[PAD]", "[UNK]")
        ],
        "model_max_length": 262144,
        "clean_up_tokenization_spaces": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    shutil.copyfile(REMOTE / "tokenization_kimi.py", out_dir / "tokenization_kimi.py")


def _rank(item: tuple[bytes, int]) -> int:
    return item[1]


def special_id(tok_dir: Path, name: str) -> int:
    """The id of one of Kimi's special tokens in a tokenizer built by build_tokenizer."""
    cfg = json.loads((Path(tok_dir) / "tokenizer_config.json").read_text())
    for i, t in cfg["added_tokens_decoder"].items():
        if t["content"] == name:
            return int(i)
    raise KeyError(name)


def vision_config(text_hidden: int) -> dict[str, Any]:
    """A one-block vision tower: transformers' names and SGLang's (`init_pos_emb_*`, `vt_*`)."""
    hidden, heads, inter, pos = 32, 2, 64, 4
    return {
        "patch_size": 14,
        "pos_emb_height": pos,
        "pos_emb_width": pos,
        "pos_emb_time": 1,
        "num_attention_heads": heads,
        "num_hidden_layers": 1,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "merge_kernel_size": [2, 2],
        # SGLang 0.5.14's KimiK25VisionConfig / MoonViT / K2VLMultiModalProjector read these
        "init_pos_emb_height": pos,
        "init_pos_emb_width": pos,
        "init_pos_emb_time": 1,
        "pos_emb_type": "divided_fixed",
        "video_attn_type": "spatial_temporal",
        "merge_type": "sd2_tpool",
        "mm_projector_type": "patchmerger",
        "mm_hidden_size": hidden,
        "projector_hidden_act": "gelu",
        "projector_ln_eps": 1e-5,
        "vt_hidden_size": hidden,
        "vt_num_attention_heads": heads,
        "vt_num_hidden_layers": 1,
        "vt_intermediate_size": inter,
        "text_hidden_size": text_hidden,
    }


def released_name(name: str) -> str:
    """transformers 5.17's saved Kimi-K2.5 key -> the released checkpoint's key."""
    if name.startswith("language_model.model.blocks."):
        return "language_model.model.layers." + name.removeprefix("language_model.model.blocks.")
    if name.startswith("vision_tower.encoder.patch_embed."):
        return "vision_tower.patch_embed." + name.removeprefix("vision_tower.encoder.patch_embed.")
    if name.startswith("model.mm_projector."):
        return name.removeprefix("model.")
    return name


def is_kimi_wrapper(model_dir: Path) -> bool:
    try:
        return (
            json.loads((Path(model_dir) / "config.json").read_text()).get("model_type")
            == "kimi_k25"
        )
    except (OSError, ValueError):
        return False


def save_released(model: Any, out_dir: Path, vision: dict[str, Any] | None = None) -> None:
    """Save a transformers Kimi_K25ForConditionalGeneration in the released checkpoint's layout
    (what SGLang loads): weights renamed, `architectures` the real class name, SGLang's vision
    keys kept (from `vision` or the config.json already in `out_dir`)."""
    import tempfile

    from safetensors import safe_open
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    old = out_dir / "config.json"
    if vision is None and old.exists():
        vision = json.loads(old.read_text()).get("vision_config")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tensors = {}
        for f in sorted(Path(tmp).glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():  # noqa: SIM118 (safe_open is not a dict)
                    tensors[released_name(k)] = h.get_tensor(k).contiguous()
        for f in out_dir.glob("model*.safetensors*"):
            f.unlink()
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        cfg = json.loads((Path(tmp) / "config.json").read_text())
        gen = Path(tmp) / "generation_config.json"
        if gen.exists() and not (out_dir / "generation_config.json").exists():
            shutil.copyfile(gen, out_dir / "generation_config.json")
    cfg["architectures"] = [ARCHITECTURE]
    # transformers leaves the wrapper's dtype at float32 after .to(bfloat16); SGLang's
    # `--dtype auto` reads it (and runs a "float32" target in float16, beside a bf16 drafter)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    cfg["dtype"] = cfg["text_config"]["dtype"] = dtype
    cfg["vision_config"] = {**cfg["vision_config"], **(vision or {})}
    if old.exists():  # keys set at build time (token ids, SGLang's DeepSeek keys) survive
        prev = json.loads(old.read_text())
        for k in ("media_placeholder_token_id", "bos_token_id", "eos_token_id", "pad_token_id"):
            if k in prev:
                cfg[k] = prev[k]
        cfg["text_config"] = {**prev.get("text_config", {}), **cfg["text_config"]}
    # SGLang's DeepseekV3ForCausalLM reads text_config.architectures[0] (shared-expert fusion);
    # the real checkpoint names it, transformers' save leaves it null
    cfg["text_config"]["architectures"] = [TEXT_ARCHITECTURE]
    old.write_text(json.dumps(cfg, indent=2) + "\n")


def build_target(out_dir: Path, tok_dir: Path, preset_name: str, seed: int = 0) -> None:
    """A random-init tiny Kimi-K2.5 (Kimi_K25ForConditionalGeneration) in the released layout."""
    import torch
    from transformers.models.kimi_k25 import Kimi_K25Config, Kimi_K25ForConditionalGeneration

    from remote_agent.eagle3.tiny.deepseek import PRESETS, deepseek_config

    preset = PRESETS[preset_name]
    vocab = len(Path(tok_dir, "tiktoken.model").read_text().splitlines()) + RESERVED
    eos, pad = special_id(tok_dir, "<|im_end|>"), special_id(tok_dir, "[PAD]")
    text = deepseek_config(preset, vocab, eos, pad).to_dict()
    text["bos_token_id"] = special_id(tok_dir, "[BOS]")
    vision = vision_config(preset.hidden_size)
    hf_vision = {k: vision[k] for k in list(vision)[:9]}
    config = Kimi_K25Config(
        text_config=text,
        vision_config=hf_vision,
        projection_hidden_size=vision["hidden_size"],
        tie_word_embeddings=False,
        image_token_id=special_id(tok_dir, "<|media_pad|>"),
        vision_start_token_id=special_id(tok_dir, "<|media_begin|>"),
        vision_end_token_id=special_id(tok_dir, "<|media_end|>"),
        video_token_id=special_id(tok_dir, "<|media_content|>"),
    )
    torch.manual_seed(seed)
    # saved in bfloat16 as Kimi-K2.5 ships (the init is drawn in float32, then cast): SGLang's
    # `--dtype auto` then runs target and drafter in one dtype even before any training
    model = Kimi_K25ForConditionalGeneration(config).eval()
    torch.nn.Module.to(
        model, torch.bfloat16
    )  # in place (transformers' `to` overloads confuse types)
    save_released(model, out_dir, vision)
    cfg = json.loads((out_dir / "config.json").read_text())
    cfg["media_placeholder_token_id"] = config.image_token_id
    cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"] = text["bos_token_id"], eos, pad
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen = out_dir / "generation_config.json"
    gen_cfg = json.loads(gen.read_text()) if gen.exists() else {}
    gen_cfg.update(eos_token_id=eos, bos_token_id=text["bos_token_id"], pad_token_id=pad)
    gen.write_text(json.dumps(gen_cfg, indent=2) + "\n")
    for name in ("tiktoken.model", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(Path(tok_dir) / name, out_dir / name)
    shutil.copyfile(REMOTE / "tokenization_kimi.py", out_dir / "tokenization_kimi.py")
    shutil.copyfile(REMOTE / "kimi_k25_processor.py", out_dir / "kimi_k25_processor.py")
    proc = {
        "auto_map": {"AutoProcessor": "kimi_k25_processor.KimiK25Processor"},
        "processor_class": "KimiK25Processor",
        "media_proc_cfg": MEDIA_PROC_CFG,
    }
    (out_dir / "preprocessor_config.json").write_text(json.dumps(proc, indent=1) + "\n")
    (out_dir / "processor_config.json").write_text(
        json.dumps({k: proc[k] for k in ("auto_map", "processor_class")}, indent=1) + "\n"
    )
