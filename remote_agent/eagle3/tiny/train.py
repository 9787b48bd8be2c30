"""Give a tiny target real structure (next-token training), then let it answer prompts.

A random-weight target makes acceptance numbers meaningless (near-uniform distributions, or
greedy loops that inflate acceptance). This trains the tiny DeepseekV3 on the chat-rendered
stdlib data plus raw stdlib text for a fixed number of steps, then regenerates the assistant
turns with the trained target (greedy or sampled), so the drafter learns *this* target's outputs.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any

from remote_agent.eagle3.progress import Progress, emit
from remote_agent.wire.atomic_write import atomic_path


def _token_stream(
    tok: Any, conversations: list[list[dict]], corpus: list[str], seed: int
) -> list[int]:
    docs = [tok.apply_chat_template(m, tokenize=False) for m in conversations] + corpus
    random.Random(seed).shuffle(docs)
    ids: list[int] = []
    eos = tok.eos_token_id
    for text in docs:
        ids.extend(tok(text, add_special_tokens=False)["input_ids"])
        ids.append(eos)
    return ids


def train_target(
    model_dir: Path,
    conversations: list[list[dict]],
    steps: int,
    seq_len: int,
    batch: int,
    lr: float,
    device: str,
    seed: int = 0,
    corpus_bytes: int = 2_000_000,
) -> dict:
    """In-place next-token training of the target in `model_dir` (safetensors rewritten)."""
    import torch
    from transformers import AutoTokenizer

    from remote_agent.eagle3.extraction.reference import hf_model_class
    from remote_agent.eagle3.tiny.deepseek import stdlib_corpus

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=True)
    # Any: transformers' stubs type the loaded model's .to() as unbound (pyright reads it so)
    model: Any = hf_model_class(model_dir).from_pretrained(str(model_dir), dtype=torch.float32)
    model = model.to(device)
    model.train()
    stream = torch.tensor(_token_stream(tok, conversations, stdlib_corpus(corpus_bytes), seed))
    n_windows = (len(stream) - 1) // seq_len
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
        ),
    )
    gen = torch.Generator().manual_seed(seed)
    use_amp = device.startswith("cuda")
    progress = Progress("train-target", steps, "steps")
    start, loss_value = time.time(), float("nan")
    for _ in range(steps):
        idx = torch.randint(0, n_windows, (batch,), generator=gen) * seq_len
        x = torch.stack([stream[i : i + seq_len + 1] for i in idx.tolist()]).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):
            loss = model(input_ids=x[:, :-1], labels=x[:, :-1]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_value = loss.detach().item()
        progress.advance(1, loss=round(loss_value, 4))
    progress.finish(loss=round(loss_value, 4))
    model.eval()
    if use_amp:
        # saved the way real targets ship (Kimi-K2.5: bfloat16): SGLang's `--dtype auto` would run
        # a float32 checkpoint in float16, beside a bfloat16 drafter (serve_dtype.py)
        model.to(torch.bfloat16)
    from remote_agent.eagle3.tiny import kimi

    if kimi.is_kimi_wrapper(model_dir):  # transformers' own save breaks the released names
        kimi.save_released(model, model_dir)
    else:
        model.save_pretrained(str(model_dir), safe_serialization=True)
    tokens = steps * batch * seq_len
    return {
        "steps": steps,
        "final_loss": loss_value,
        "tokens": tokens,
        "tokens_per_s": tokens / max(time.time() - start, 1e-9),
        "stream_tokens": len(stream),
    }


def regenerate(
    model_dir: Path,
    prompts: list[dict],
    out: Path,
    max_new_tokens: int,
    batch: int,
    device: str,
    temperature: float = 0.0,
    seed: int = 0,
) -> dict:
    """Answer every prompt with the target (batched, left-padded); write OpenAI-style JSONL."""
    import torch
    from transformers import AutoTokenizer

    from remote_agent.eagle3.drafter.eval.synthetic import end_ids
    from remote_agent.eagle3.extraction.reference import hf_model_class

    tok = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=True)
    tok.padding_side = "left"
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model: Any = hf_model_class(model_dir).from_pretrained(str(model_dir), dtype=dtype)
    model = model.to(device).eval()
    stops = sorted(end_ids(model_dir, tok))  # Kimi: <|im_end|> ends a turn, not [EOS]
    torch.manual_seed(seed)
    progress = Progress("regenerate", len(prompts), "samples")
    n_tokens = 0
    # the file closes before atomic_path fsyncs and renames it (with-items exit in reverse)
    with atomic_path(out) as tmp, open(tmp, "w") as f, torch.no_grad():
        for i in range(0, len(prompts), batch):
            chunk = prompts[i : i + batch]
            texts = [
                tok.apply_chat_template(p["messages"], tokenize=False, add_generation_prompt=True)
                for p in chunk
            ]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            outs = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=temperature > 0,
                temperature=temperature if temperature > 0 else None,
                top_p=None,
                top_k=None,
                eos_token_id=stops,
                pad_token_id=tok.pad_token_id,
            )
            for p, row in zip(chunk, outs[:, enc["input_ids"].shape[1] :].tolist(), strict=True):
                cut = [row.index(e) for e in stops if e in row]
                if cut:
                    row = row[: min(cut)]
                n_tokens += len(row)
                answer = tok.decode(row, skip_special_tokens=True)
                f.write(
                    json.dumps(
                        {
                            "id": p["id"],
                            "messages": [*p["messages"], {"role": "assistant", "content": answer}],
                        }
                    )
                    + "\n"
                )
            progress.advance(len(chunk))
    progress.finish()
    emit("result", stage="regenerate", samples=len(prompts), tokens=n_tokens)
    return {"samples": len(prompts), "tokens": n_tokens}
