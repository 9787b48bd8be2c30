"""A Kimi-K2.5-faithful fixture: its chat template (fixtures/kimi_k25_chat_template.jinja) and a
small byte-level BPE tokenizer carrying Kimi's control tokens, flagged as Kimi's
tokenizer_config flags them: all of them special (`</think>` too: SGLang/Dynamo strip it with
skip_special_tokens), eos_token `[EOS]` while turns end on `<|im_end|>` (generation_config).
Built offline with `tokenizers` (the real Kimi tokenizer is tiktoken-based and not available)."""

from __future__ import annotations

from pathlib import Path

TEMPLATE_PATH = Path(__file__).parent / "fixtures" / "kimi_k25_chat_template.jinja"
KIMI_SPECIAL = [
    "[BOS]",
    "[EOS]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "[EOT]",
    "<|im_system|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|im_middle|>",
    "<think>",
    "</think>",
    "[UNK]",
    "[PAD]",
]
CORPUS = [
    "You are Kimi, an AI assistant created by Moonshot AI.",
    "The weather in Paris is sunny and 21 degrees. Let me check the tools first.",
    "def add(a, b):\n    return a + b\n",
    "## Return of functions.get_weather:0\n",
    '{"city": "Paris", "temperature": 21, "condition": "sunny"}',
    "今天天气很好。我们去公园散步吧。你好，世界！思考一下这个问题。",
    "First I think about the question, then I answer it briefly and clearly.",
]


def build_kimi_tokenizer(out_dir: Path):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in KIMI_SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="[BOS]",
        eos_token="[EOS]",
        pad_token="[PAD]",
        unk_token="[UNK]",
    )
    fast.chat_template = TEMPLATE_PATH.read_text()
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return fast
