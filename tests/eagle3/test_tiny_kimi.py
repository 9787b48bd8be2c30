"""The tiny Kimi-K2.5-shaped target (remote_agent/eagle3/tiny/kimi.py), on CPU with real
transformers 5.17, real tiktoken and SGLang 0.5.14's own config class (from the PyPI wheel):
the wrapper config, the released weight layout, the tiktoken remote-code tokenizer (round trips,
special tokens at turn boundaries, loss masks without offsets, identity hash), and the
final-state check catching a corrupted final row."""

from __future__ import annotations

import importlib.util
import json
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tiktoken")

from remote_agent.eagle3.tiny import kimi as tiny_kimi  # noqa: E402


@pytest.fixture(scope="module")
def kimi(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("kimi")
    tiny_kimi.build_tokenizer(root / "tok", 600, corpus_bytes=300_000)
    tiny_kimi.build_target(root / "model", root / "tok", "ci", seed=0)
    return root / "model"


@pytest.fixture(scope="module")
def tok(kimi):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(kimi), trust_remote_code=True)


def test_config_is_the_real_wrapper_shape(kimi):
    cfg = json.loads((kimi / "config.json").read_text())
    assert cfg["model_type"] == "kimi_k25"
    assert cfg["architectures"] == ["KimiK25ForConditionalGeneration"]
    text = cfg["text_config"]
    # SGLang's DeepseekV3ForCausalLM reads text_config.architectures[0] (a device run died on None)
    assert text["architectures"] == ["DeepseekV3ForCausalLM"]
    assert text["kv_lora_rank"] == 32 and text["n_routed_experts"] == 8
    assert cfg["tie_word_embeddings"] is False and cfg["dtype"] == text["dtype"] == "bfloat16"
    vision = cfg["vision_config"]
    for key in ("init_pos_emb_height", "vt_hidden_size", "merge_type", "text_hidden_size"):
        assert key in vision  # SGLang's names, beside transformers' own
    assert vision["text_hidden_size"] == text["hidden_size"]
    pad = tiny_kimi.special_id(kimi, "<|media_pad|>")
    assert cfg["media_placeholder_token_id"] == pad
    base = len((kimi / "tiktoken.model").read_text().splitlines())
    assert pad == base + 21  # Kimi: 163584 + 21 = 163605
    assert text["vocab_size"] == base + tiny_kimi.RESERVED


def test_weights_are_in_the_released_layout(kimi):
    from safetensors import safe_open

    with safe_open(str(kimi / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())  # noqa: SIM118
    assert "language_model.lm_head.weight" in names
    assert "language_model.model.embed_tokens.weight" in names
    assert "language_model.model.layers.7.mlp.experts.0.up_proj.weight" in names
    assert not any(".blocks." in n and n.startswith("language_model") for n in names)
    assert "vision_tower.patch_embed.proj.weight" in names
    assert "mm_projector.pre_norm.weight" in names and "mm_projector.proj.0.weight" in names
    # SGLang's KimiK25 load_weights: "language_model." stripped, the rest is DeepseekV3's
    lang = {n.replace("language_model.", "") for n in names if n.startswith("language_model.")}
    assert "lm_head.weight" in lang and "model.norm.weight" in lang


def test_sglang_0_5_14_config_class_reads_it(kimi, tmp_path):
    from tests.conftest import download_sglang_wheel

    with zipfile.ZipFile(download_sglang_wheel("0.5.14")) as z:
        src = z.read("sglang/srt/configs/kimi_k25.py")
    path = tmp_path / "sglang_kimi_k25_config.py"
    path.write_bytes(src)
    spec = importlib.util.spec_from_file_location("sglang_kimi_k25_config", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = json.loads((kimi / "config.json").read_text())
    sg = mod.KimiK25Config(**cfg)
    assert sg.text_config.architectures[0] == "DeepseekV3ForCausalLM"
    assert sg.hidden_size == cfg["text_config"]["hidden_size"]
    assert sg.vision_config.vt_hidden_size == sg.vision_config.hidden_size == 32
    assert sg.vision_config.init_pos_emb_height == 4
    assert sg.media_placeholder_token_id == cfg["media_placeholder_token_id"]


def test_hf_loads_every_weight_it_saved(kimi):
    from safetensors import safe_open

    from remote_agent.eagle3.extraction.reference import hf_model_class, load_model

    assert hf_model_class(kimi).__name__ == "AutoModelForImageTextToText"
    model = load_model(kimi, torch.float32, torch.device("cpu"))
    with safe_open(str(kimi / "model.safetensors"), framework="pt") as f:
        head = f.get_tensor("language_model.lm_head.weight")
        embed = f.get_tensor("language_model.model.embed_tokens.weight")
        q = f.get_tensor("language_model.model.layers.3.self_attn.q_a_proj.weight")
    assert head.dtype == torch.bfloat16  # as Kimi-K2.5 ships
    assert torch.equal(model.lm_head.weight, head.float())
    assert torch.equal(model.get_input_embeddings().weight, embed.float())
    dec = model.get_decoder()
    assert torch.equal(dec.layers[3].self_attn.q_a_proj.weight, q.float())


def test_tokenizer_round_trips_and_is_remote_tiktoken(kimi, tok):
    assert type(tok).__name__ == "TikTokenTokenizer"
    assert type(tok.model).__module__.startswith("tiktoken")
    for text in (
        "def f(x):\n    return x ** 2  # ok",
        "你好，世界 and Ünïcödé\t\n\n",
        "  lead",
        "",
    ):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    enc = tok("abc def", add_special_tokens=False, return_offsets_mapping=True)
    assert enc.get("offset_mapping") is None  # a slow tokenizer, like Kimi's: no offsets


def test_special_tokens_are_single_ids_at_turn_boundaries(kimi, tok):
    msgs = [
        {"role": "user", "content": "sum 2 and 3"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "call the tool",
            "tool_calls": [{"function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
        },
        {"role": "tool", "tool_call_id": "functions.add:0", "content": "5"},
        {"role": "assistant", "content": "5", "reasoning_content": "done"},
    ]
    text = tok.apply_chat_template(msgs, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    sid = {n: tiny_kimi.special_id(kimi, n) for n in tiny_kimi.SPECIAL_OFFSETS.values()}
    for name in ("<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|tool_call_begin|>"):
        assert sid[name] in ids
    assert ids.count(sid["<|im_end|>"]) == text.count("<|im_end|>") == 5  # system + 4 turns
    assert ids.count(sid["<think>"]) == 2  # reasoning kept after the last user turn
    assert tok.decode(ids) == text
    prompt = tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_assistant|>assistant<|im_middle|>")
    assert text.startswith(prompt)  # the generation prompt is a prefix of the answered turn


def test_loss_masks_without_offsets_cover_exactly_the_answer(kimi, tok):
    from remote_agent.eagle3.data.loss_mask import MaskBuilder

    msgs = [
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "It is 5.", "reasoning_content": "2+3=5"},
    ]
    samples, stats, errors = MaskBuilder(tok).build("s0", msgs)
    assert not errors and len(samples) == 1
    s = samples[0]
    supervised = tok.decode([i for i, m in zip(s.input_ids, s.loss_mask, strict=True) if m])
    assert supervised == "<think>2+3=5</think>It is 5.<|im_end|>"
    assert stats.straddling_tokens == 0


def test_identity_hash_covers_the_remote_code(kimi, tmp_path):
    import shutil

    from remote_agent.eagle3.data.tokenizer_files import remote_code_files, tokenizer_sha256

    d = tmp_path / "tok"
    shutil.copytree(kimi, d)
    assert remote_code_files(d) == ["tokenization_kimi.py"]
    before = tokenizer_sha256(d)
    with open(d / "tokenization_kimi.py", "a") as f:
        f.write("\n# a changed remote tokenizer\n")
    assert tokenizer_sha256(d) != before


def test_final_state_check_catches_a_corrupted_final_row(kimi, tok):
    """The canary's rule on a real forward: argmax(final[-1] @ lm_head^T) is the greedy token;
    a final row that is not the model's (here: the previous position's) is caught."""
    from remote_agent.eagle3.extraction.final_check import check_against_server, load_lm_head

    model = tiny_kimi_model(kimi)
    lm_head = load_lm_head(kimi)
    finals, tokens = [], []
    for text in ("def add(a, b):", "import os\nimport sys", "class A:\n    pass"):
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True)
        finals.append(out.hidden_states[-1][0])  # post-norm, what the dump stores
        tokens.append(int(out.logits[0, -1].argmax()))
    ok = check_against_server(finals, tokens, lm_head)
    assert ok["ok"] and ok["argmax_matches"] == ok["prompts"] == 3
    bad = [f.clone() for f in finals]
    bad[1][-1] = bad[1][-2]  # the last row holds the wrong position's state
    caught = check_against_server(bad, tokens, lm_head, ["a", "b", "c"])
    wrong = [p["sample"] for p in caught["per_prompt"] if not p["match"]]
    if int((bad[1][-2:-1] @ lm_head.T).argmax()) != tokens[1]:
        assert not caught["ok"] and wrong == ["b"]
    noise = [f.clone() for f in finals]
    noise[2][-1] = torch.randn_like(noise[2][-1]) * 50
    assert [
        p["sample"]
        for p in check_against_server(noise, tokens, lm_head, ["a", "b", "c"])["per_prompt"]
        if not p["match"]
    ] == ["c"]


def tiny_kimi_model(kimi):
    from remote_agent.eagle3.extraction.reference import load_model

    return load_model(kimi, torch.float32, torch.device("cpu"))


def test_accept_feeds_turn_two_the_answer_not_raw_reasoning(kimi, tok):
    """MT-Bench turn 2 in the published Kimi mode: the server's text has lost the `</think>`
    marker (a special token), so the split is made on the generated ids."""
    from remote_agent.eagle3.serving.checks import assistant_turn

    ids = tok("add them</think>It is 5.<|im_end|>", add_special_tokens=False)["input_ids"]
    text = tok.decode(ids, skip_special_tokens=True)
    assert text == "add themIt is 5."  # what SGLang's text field would carry
    turn = assistant_turn(tok, {"text": text, "output_ids": ids})
    assert turn == {"role": "assistant", "content": "It is 5.", "reasoning_content": "add them"}
    history = [{"role": "user", "content": "2+3?"}, turn, {"role": "user", "content": "and 4?"}]
    rendered = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
    assert "add them" not in rendered and "<think></think>It is 5." in rendered
    plain = assistant_turn(tok, {"text": "hi", "output_ids": tok("hi")["input_ids"]})
    assert plain == {"role": "assistant", "content": "hi"}
