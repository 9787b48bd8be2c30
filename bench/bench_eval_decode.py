"""The reference speculative decoder, one prompt at a time vs batched (`eagle3 eval --batch`).

Same target, drafter, prompts and length; the batched decoder must give every prompt the same
tokens (checked, recorded) and is timed against the one-prompt decoder in the same run:

    python bench/bench_eval_decode.py [--preset ci|gpu] [--device cpu|cuda] [--prompts 16]
        [--tokens 64] [--out bench/results/eval-decode.json]

Target: a tiny DeepseekV3 (`ensure_tiny`, untrained: the timing needs no trained weights);
drafter: one random layer with the target's embedding and head (some real acceptance).
Keys: one_at_a_time {seconds, tokens_per_s}, batched {...}, speedup, tokens_equal, accept_length.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.machine_info import describe, save_result  # noqa: E402


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> int:
    p = argparse.ArgumentParser(description="the batched reference decoder vs one prompt at a time")
    p.add_argument("--preset", default="ci")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default="bench/results/eval-decode.json")
    a = p.parse_args()

    from remote_agent.eagle3.drafter.eval.evaluate import (
        BatchTarget,
        Target,
        speculative_decode,
        speculative_decode_batch,
    )
    from remote_agent.eagle3.drafter.eval.synthetic import capture_ids, load_target, random_drafter
    from remote_agent.eagle3.tiny.cache import ensure_tiny

    model, _ = load_target(ensure_tiny(a.preset), a.device)
    aux = capture_ids(model.config.num_hidden_layers)
    drafter = random_drafter(model, aux)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [
        torch.randint(3, vocab, (int(n),), generator=g).tolist()
        for n in torch.randint(16, 200, (a.prompts,), generator=g)
    ]
    eos: frozenset[int] = frozenset()
    # warm-up (kernels, allocator) on one prompt each way
    speculative_decode(Target(model, aux), drafter, prompts[0], 8, a.steps, eos)
    speculative_decode_batch(BatchTarget(model, aux), drafter, prompts[:2], 8, a.steps, eos)

    synchronize(a.device)
    t0 = time.perf_counter()
    one = [
        speculative_decode(Target(model, aux), drafter, q, a.tokens, a.steps, eos) for q in prompts
    ]
    synchronize(a.device)
    t1 = time.perf_counter()
    batch = speculative_decode_batch(
        BatchTarget(model, aux), drafter, prompts, a.tokens, a.steps, eos
    )
    synchronize(a.device)
    t2 = time.perf_counter()

    tokens = sum(len(d.tokens) for d in one)
    verify = sum(d.verify_steps for d in one)
    equal = all(x.tokens == y.tokens for x, y in zip(one, batch, strict=True))
    result = {
        "bench": "bench_eval_decode",
        "machine": describe(device=a.device),
        "preset": a.preset,
        "prompts": a.prompts,
        "max_new_tokens": a.tokens,
        "steps": a.steps,
        "accept_length": round(tokens / verify, 4) if verify else None,
        "one_at_a_time": {
            "seconds": round(t1 - t0, 3),
            "tokens_per_s": round(tokens / (t1 - t0), 1),
        },
        "batched": {"seconds": round(t2 - t1, 3), "tokens_per_s": round(tokens / (t2 - t1), 1)},
        "speedup": round((t1 - t0) / (t2 - t1), 2),
        "tokens_equal": equal,
    }
    save_result(Path(a.out), result)
    print(
        f"bench_eval_decode [{a.preset}, {a.device}]: {a.prompts} prompts x {a.tokens} tokens, "
        f"batched {result['batched']['seconds']} s vs one at a time "
        f"{result['one_at_a_time']['seconds']} s ({result['speedup']}x); tokens equal {equal}; "
        f"accept {result['accept_length']}"
    )
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
