"""Small end-to-end inputs for the drafter from a (tiny) target: used by tests, benches, GPU checks.

Builds, in one directory, exactly what the real pipeline hands the trainer:

    data.jsonl (+ .index.json)   records {id, source, input_ids, loss_mask}: a chat-templated
                                 user turn (a snippet of Python stdlib source) followed by the
                                 target's own greedy answer (regenerated data; loss on the answer)
    dump/                        aux (residual entering layers [2, L//2, L-3]) + post-norm final
                                 hidden states, written through dense.ShardWriter
    vocab.safetensors            d2t/t2d mapping of the most frequent supervised tokens

The target's own greedy answers give the drafter something learnable even when the target has
random weights (its greedy continuations are a deterministic function of the context).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import torch


def capture_ids(num_layers: int) -> list[int]:
    return [2, num_layers // 2, num_layers - 3]


def load_target(target_dir: Path, device: str = "cpu", dtype=torch.float32):
    from transformers import AutoTokenizer

    from remote_agent.eagle3.extraction.reference import hf_model_class

    model = (
        hf_model_class(target_dir)
        .from_pretrained(str(target_dir), dtype=dtype, attn_implementation="eager")
        .to(device)
    )
    model.eval()
    tok = AutoTokenizer.from_pretrained(str(target_dir), trust_remote_code=True)
    return model, tok


def end_ids(target_dir: Path, tok) -> frozenset[int]:
    """Every token that ends a turn, as the serving engine stops: generation_config.json's
    eos_token_id (an int or a list; Kimi: <|im_end|>, [EOS], [EOT]), config.json's (or its
    text_config's) and the tokenizer's eos."""
    found: set[int] = set()

    def add(value: Any) -> None:
        if isinstance(value, int) and not isinstance(value, bool):
            found.add(value)
        elif isinstance(value, list):
            for v in value:
                add(v)

    for name in ("generation_config.json", "config.json"):
        path = Path(target_dir) / name
        if path.exists():
            c = json.loads(path.read_text())
            add(c.get("eos_token_id"))
            add((c.get("text_config") or {}).get("eos_token_id"))
    add(tok.eos_token_id)
    return frozenset(found)


def text_config(model) -> Any:
    c = model.config
    return getattr(c, "text_config", None) or c


def random_drafter(model, aux_ids: list[int], seed: int = 3):
    """A drafter with one random layer and the target's own embedding and head (so it accepts
    something): decoders and their benches need a real Eagle3Drafter, not a trained one."""
    from remote_agent.eagle3.drafter.model.model import Eagle3Drafter, build_config
    from remote_agent.eagle3.drafter.train.config import DrafterSection

    c = text_config(model)
    cfg = build_config(
        DrafterSection(arch="llama", num_attention_heads=4, num_key_value_heads=2),
        target_hidden=c.hidden_size, vocab_size=c.vocab_size, draft_vocab_size=c.vocab_size,
        aux_layer_ids=aux_ids, target_context=c.max_position_embeddings,
    )  # fmt: skip
    d = Eagle3Drafter(cfg)
    d.init_weights(0.05, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        d.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
        d.lm_head.weight.copy_(model.get_output_embeddings().weight)
    return d.to(next(model.parameters()).device).eval()


def prompts_from_stdlib(tok, n: int, prompt_tokens: int | list[int], seed: int) -> list[list[int]]:
    """n chat-templated user turns, each a random window of stdlib source (generation prompt on);
    prompt_tokens: one cap for all, or one per prompt (long prompts take longer windows)."""
    from remote_agent.eagle3.tiny.deepseek import stdlib_corpus

    caps = [prompt_tokens] * n if isinstance(prompt_tokens, int) else list(prompt_tokens)
    lines = [ln for text in stdlib_corpus(400_000) for ln in text.splitlines() if ln.strip()]
    rng = random.Random(seed)
    out = []
    for cap in caps:
        span = max(12, cap // 4)  # a line is a handful of tokens
        start = rng.randrange(0, max(1, len(lines) - span - 28))
        snippet = "\n".join(lines[start : start + span])
        ids = tok(snippet, add_special_tokens=False)["input_ids"][:cap]
        out.append(chat_prompt(tok, tok.decode(ids)))
    return out


def chat_prompt(tok, content: str) -> list[int]:
    """A user turn + generation prompt, via the chat template (Kimi-style literal without jinja2)."""
    msgs = [{"role": "user", "content": content}]
    try:
        rendered = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    except Exception:  # no template / no jinja2: the tiny targets' Kimi-style layout
        text = (
            f"<|im_user|>user<|im_middle|>{content}<|im_end|><|im_assistant|>assistant<|im_middle|>"
        )
        return list(tok(text, add_special_tokens=False)["input_ids"])
    if hasattr(rendered, "keys"):
        rendered = rendered["input_ids"]
    return list(rendered)


@torch.no_grad()
def greedy(model, prompt: list[int], new_tokens: int, eos: frozenset[int]) -> list[int]:
    """Plain greedy decoding with a full forward per token (no cache): the reference."""
    dev = next(model.parameters()).device
    seq = list(prompt)
    out: list[int] = []
    for _ in range(new_tokens):
        logits = model(torch.tensor([seq], device=dev)).logits[0, -1]
        t = int(logits.argmax())
        out.append(t)
        seq.append(t)
        if t in eos:
            break
    return out


@torch.no_grad()
def generate_batch(model, prompts: list[list[int]], new_tokens: int, pad: int, eos: frozenset[int]):
    """Greedy continuations for many prompts at once (left padding, KV cache)."""
    dev = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        att[i, width - len(p) :] = 1
    out = model.generate(
        input_ids=ids.to(dev),
        attention_mask=att.to(dev),
        max_new_tokens=new_tokens,
        min_new_tokens=0 if eos else new_tokens,
        do_sample=False,
        pad_token_id=pad,
        eos_token_id=sorted(eos) or None,
    )
    res = []
    for row in out[:, width:].tolist():
        end = next((i for i, t in enumerate(row) if t in eos), None)
        res.append(row if end is None else row[: end + 1])
    return res


@torch.no_grad()
def hidden_states(model, ids: list[int], aux_ids: list[int]):
    """(aux [T, K*H], final [T, H]) in the dump convention (HF hidden_states[i] = input of layer i)."""
    dev = next(model.parameters()).device
    hs = model(torch.tensor([ids], device=dev), output_hidden_states=True).hidden_states
    aux = torch.cat([hs[i][0] for i in aux_ids], dim=-1)
    return aux, hs[-1][0]


def build_vocab(records: list[dict], target_vocab: int, draft_vocab: int, path: Path) -> dict:
    """CONTRACTS.md mapping: most frequent supervised ids, sorted by target id."""
    from safetensors.torch import save_file

    counts = torch.zeros(target_vocab, dtype=torch.long)
    supervised = 0
    for r in records:
        ids = torch.tensor(r["input_ids"])[torch.tensor(r["loss_mask"], dtype=torch.bool)]
        counts += torch.bincount(ids, minlength=target_vocab)
        supervised += int(ids.numel())
    order = sorted(range(target_vocab), key=lambda i: (-int(counts[i]), i))[:draft_vocab]
    chosen = torch.tensor(sorted(order), dtype=torch.long)
    d2t = chosen - torch.arange(chosen.numel())
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[chosen] = True
    coverage = float(counts[chosen].sum()) / max(1, supervised)
    meta = {
        "target_vocab": str(target_vocab),
        "draft_vocab": str(draft_vocab),
        "coverage": f"{coverage:.6f}",
        "tokenizer_sha256": "",
        "data_sha256": "",
    }
    save_file({"d2t": d2t, "t2d": t2d}, str(path), metadata=meta)
    return meta


def build_inputs(
    target_dir: Path,
    out_dir: Path,
    n_samples: int = 64,
    prompt_tokens: int | list[int] = 48,
    new_tokens: int = 64,
    draft_vocab: int | None = 512,
    device: str = "cpu",
    seed: int = 0,
    gen_batch: int = 32,
) -> dict[str, Any]:
    """Write data.jsonl, dump/ and vocab.safetensors under out_dir; returns their paths."""
    from remote_agent.eagle3.data.records import DatasetIndex
    from remote_agent.eagle3.dense import DumpMeta, ShardWriter

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model, tok = load_target(Path(target_dir), device, dtype)
    tc = text_config(model)
    aux_ids = capture_ids(tc.num_hidden_layers)
    eos = end_ids(Path(target_dir), tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    prompts = prompts_from_stdlib(tok, n_samples, prompt_tokens, seed)
    records = []
    for lo in range(0, n_samples, gen_batch):
        answers = generate_batch(model, prompts[lo : lo + gen_batch], new_tokens, pad, eos)
        for i, (p, a) in enumerate(zip(prompts[lo : lo + gen_batch], answers, strict=True)):
            sid = f"s{lo + i:05d}-{hashlib.sha256(json.dumps(p).encode()).hexdigest()[:8]}"
            records.append(
                {
                    "id": sid,
                    "source": "stdlib",
                    "input_ids": p + a,
                    "loss_mask": [0] * len(p) + [1] * len(a),
                }
            )
    data = out_dir / "data.jsonl"
    data.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
    DatasetIndex.open(data)
    meta = DumpMeta(
        model=str(target_dir),
        hidden_size=tc.hidden_size,
        num_layers=tc.num_hidden_layers,
        aux_layer_ids=aux_ids,
        producer="hf-reference",
    )
    with ShardWriter(out_dir / "dump", meta, shard_bytes=8 << 20) as w:
        for r in records:
            aux, final = hidden_states(model, r["input_ids"], aux_ids)
            w.add(r["id"], torch.tensor(r["input_ids"]), aux, final)
    from remote_agent.eagle3.extraction.identity import record_identity

    record_identity(out_dir / "dump", Path(target_dir), "synthetic")  # train checks it
    vocab = out_dir / "vocab.safetensors"
    vocab_size = model.get_output_embeddings().weight.shape[0]
    vmeta = build_vocab(records, vocab_size, draft_vocab or vocab_size, vocab)
    return {
        "data": str(data),
        "dump": str(out_dir / "dump"),
        "vocab": str(vocab),
        "samples": len(records),
        "tokens": sum(len(r["input_ids"]) for r in records),
        "coverage": float(vmeta["coverage"]),
        "aux_layer_ids": aux_ids,
    }
