"""Bench (a): drafter training throughput, peak memory and MFU for a Kimi-K2.5-shaped drafter.

Synthetic hidden states (no disk): one packed sequence of `--seq` tokens per step, run through
exactly the trainer's step (`step.forward_backward` with the trainer's default options, as
`eagle3 train` runs it with none: chunked teacher from the target lm_head, TTT unroll with the
flex kernel, fused lm_head + soft CE, backward) plus gradient clipping and the fused AdamW step
over fp32 masters, bf16 autocast. `--plain`: every memory option off (the plain unroll).

Default shape (Kimi-K2.5 Llama drafter as in SpecForge's kimi-k25-eagle3.json): hidden 7168,
64 heads / 64 KV heads (head 112), MLP 18,432, target vocab 163,840, draft vocab 32,000, 3 aux
layers, sequence 4,096, TTT 7. `--arch mla` benches the MLA drafter (q_lora 1536, kv_lora 512,
qk 128+64, v 128).

Model FLOPs per packed sequence (matmuls only; what the model needs, not what kernels execute):

    per TTT step, per token:   lin  = 2 * (2H * (nh + 2 nkv) hd  +  nh hd * H  +  3 H I  +  H Vd)
                               (MLA: q_a, q_b, kv_a, kv_b, o projections instead of q/k/v/o)
    per TTT step, per query t: attn = 2 * nh * (d_qk + d_v) * (keys visible to t)
                               keys = (position of t in its document + 1) + (TTT step k)
    once per token:            fc   = 2 * K Ht * H          teacher = 2 * H * V (forward only)
    training multiplier:       x3 (forward + backward) for the TTT-step matmuls and attention,
                               x2 for fc (its input needs no gradient), x1 for the teacher

    MFU = model FLOPs / step time / peak. The peak is measured in the same run (bf16 GEMM,
    8192^3) and the H200's ~790 TFLOP/s is reported next to it. `mfu` counts the teacher (real
    work the trainer must do); `mfu_drafter` leaves it out.

Run:  python3 bench/bench_train.py [--quick] [--arch llama|mla] [--device cpu]
Writes bench/results/train.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from machine_info import describe, save_result  # noqa: E402

H200_PEAK = 790e12

KIMI = dict(hidden=7168, heads=64, kv_heads=64, inter=18432, vocab=163840, draft_vocab=32000)
TINY = dict(hidden=64, heads=4, kv_heads=2, inter=128, vocab=2048, draft_vocab=512)


def measure_peak(device, dtype, n: int, iters: int) -> float:
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    sync(device)
    return 2 * n**3 * iters / (time.perf_counter() - t0)


def sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def model_flops(
    c: dict, doc_lengths: list[int], ttt: int, embed_once: bool = False, shard: int = 0
) -> dict:
    """FLOPs of one training step on a packed sequence (see the module docstring). With the
    trainer's embed_once / shard_tokens also `train_executed`: what the step executes (the
    input projections' embedding half once per unroll instead of per TTT step; in shards
    step 0's projections twice more, its k/v backward once more, the teacher's draft logits
    once more); `train_total` stays the model's count (MFU's numerator)."""
    h, th = c["hidden_size"], c["target_hidden_size"]
    k_aux = len(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    inter, vd, v = c["intermediate_size"], c["draft_vocab_size"], c["vocab_size"]
    heads = c["num_attention_heads"]
    if c["architectures"][0] == "LlamaForCausalLMEagle3":
        hd, kv = c["head_dim"], c["num_key_value_heads"]
        proj = 2 * h * (heads + 2 * kv) * hd + heads * hd * h
        d_qk = d_v = hd
    else:
        ql, kl = c["q_lora_rank"], c["kv_lora_rank"]
        nope, rope, dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        proj = (
            2 * h * ql
            + ql * heads * (nope + rope)
            + 2 * h * (kl + rope)
            + kl * heads * (nope + dv)
            + heads * dv * h
        )
        d_qk, d_v = nope + rope, dv
    tokens = sum(doc_lengths)
    lin = 2 * (proj + 3 * h * inter + h * vd) * tokens * ttt
    causal_keys = sum(n * (n + 1) // 2 for n in doc_lengths)
    keys = ttt * causal_keys + tokens * sum(range(ttt))
    attn = 2 * heads * (d_qk + d_v) * keys
    fc = 2 * k_aux * th * h * tokens
    teacher = 2 * h * v * tokens
    train_drafter = 3 * (lin + attn) + 2 * fc
    executed = train_drafter + teacher
    if c["architectures"][0] == "LlamaForCausalLMEagle3":
        in_out, kv_out = (heads + 2 * kv) * hd, 2 * kv * hd
    else:
        in_out, kv_out = ql + kl + rope, kl + rope
    if embed_once:  # the embedding half (H x in_out) once per unroll: forward, dgrad, wgrad
        executed -= 3 * 2 * h * in_out * tokens * (ttt - 1)
    if shard and tokens > shard:  # phases 1 and 3 of shards.py, and the teacher's draft p
        executed += 2 * 2 * (2 * h) * in_out * tokens + 2 * 2 * (2 * h) * kv_out * tokens
        executed += 2 * h * vd * tokens
    return {
        "tokens": tokens,
        "ttt_linear_fwd": lin,
        "attention_fwd": attn,
        "fc_fwd": fc,
        "teacher_fwd": teacher,
        "train_drafter": train_drafter,
        "train_total": train_drafter + teacher,
        "train_executed": executed,
        "per_token_total": (train_drafter + teacher) / tokens,
    }


def target_tensors(vocab: int, hidden: int, device, dtype, seed: int = 0):
    """Synthetic target lm_head and embedding, identical in every process (device generator)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    lm_head = (torch.randn(vocab, hidden, generator=g, device=device) * 0.05).to(dtype)
    embed = (torch.randn(vocab, hidden, generator=g, device=device) * 0.02).to(dtype)
    return lm_head, embed


def vocab_mapping(vocab: int, draft_vocab: int):
    import torch

    chosen = torch.randperm(vocab, generator=torch.Generator().manual_seed(1))[:draft_vocab]
    chosen = chosen.sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[chosen] = True
    return chosen - torch.arange(draft_vocab), t2d


def build(args, device):
    import torch

    from remote_agent.eagle3.distributed import Dist
    from remote_agent.eagle3.drafter.model.model import Eagle3Drafter, build_config
    from remote_agent.eagle3.drafter.model.ttt_attention import pick_backend
    from remote_agent.eagle3.drafter.train.config import DrafterSection, TrainSection
    from remote_agent.eagle3.drafter.train.loop import (
        StepContext,
        TTTStep,
        compile_layer,
        resolved_options,
    )

    dims = dict(TINY if device == "cpu" else KIMI)
    for key in dims:
        if getattr(args, key) is not None:
            dims[key] = getattr(args, key)
    if args.arch == "mla":
        mla = dict(
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
        )
        if device == "cpu":
            mla = dict(
                q_lora_rank=32,
                kv_lora_rank=16,
                qk_nope_head_dim=8,
                qk_rope_head_dim=8,
                v_head_dim=8,
            )
    else:
        mla = {}
    ds = DrafterSection(
        arch=args.arch,
        num_attention_heads=dims["heads"],
        num_key_value_heads=dims["kv_heads"] if args.arch == "llama" else None,
        intermediate_size=dims["inter"],
        **mla,
    )
    config = build_config(
        ds,
        target_hidden=dims["hidden"],
        vocab_size=dims["vocab"],
        draft_vocab_size=dims["draft_vocab"],
        aux_layer_ids=[2, 30, 58],
        target_context=262144,
    )
    bf16 = device != "cpu"
    torch.manual_seed(0)
    # on_device (bench_long_context): made and initialised on the GPU, not on the host (the
    # Kimi shape's 2.3 B host floats take tens of seconds there; other draws, same shapes)
    on_device = bool(getattr(args, "on_device", False)) and device != "cpu"
    with torch.device(device if on_device else "cpu"):
        drafter = Eagle3Drafter(config)
    gen = torch.Generator(device=device if on_device else "cpu").manual_seed(0)
    drafter.init_weights(0.02, gen)
    vd, v = dims["draft_vocab"], dims["vocab"]
    drafter.set_vocab(*vocab_mapping(v, vd))
    cdtype = torch.bfloat16 if bf16 else torch.float32
    drafter.embed_tokens.to(cdtype)
    drafter.to(device)
    lm_head, embed = target_tensors(v, dims["hidden"], device, cdtype)
    host_embed = None
    if not drafter.embed_tokens.weight.requires_grad:
        with torch.no_grad():
            drafter.embed_tokens.weight.copy_(embed)
        # the trainer's default (train.embed_on_host): the frozen embedding stays on the host,
        # each batch carries its rows (attach_embeds); off for the plain unroll and SpecForge
        if getattr(args, "host_embed", not getattr(args, "plain", False)):
            host_embed = embed.cpu()
            drafter.embed_tokens.weight = torch.nn.Parameter(
                embed.new_empty(0, embed.shape[1]), requires_grad=False
            )
    del embed
    tc = TrainSection(ttt_steps=args.ttt, compile=not args.no_compile)
    if getattr(args, "plain", False):  # every memory option off (bench_long_context's sets)
        step = TTTStep(drafter, tc.ttt_steps, tc.loss_chunk)
    else:  # what `eagle3 train` runs with no options (loop.resolved_options, for_training)
        cast_once, compiled = resolved_options(tc, 1, torch.device(device).type)
        step = TTTStep.for_training(drafter, tc, cast_once, compiled)
    if device != "cpu" and tc.compile:
        compile_layer(drafter, checkpointed=tc.checkpoint_ttt_steps)  # as the trainer compiles
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), fused=device != "cpu")
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if bf16
        else torch.autocast("cpu", enabled=False)
    )
    backend = pick_backend(args.attention, torch.device(device))
    ctx = StepContext(
        step,
        lm_head,
        drafter.draft_ids(),
        drafter.t2d,
        tc.ttt_steps,
        [tc.step_weight**k for k in range(tc.ttt_steps)],
        drafter.midlayer.self_attn.scale,
        backend,
        autocast,
        bf16,
        Dist(),
        tc,
        host_embed,
    )
    # the trainer's default on CUDA (train.lm_head_on_host): the teacher's lm_head waits on the
    # host between teachers; off for the plain unroll and SpecForge (its step gets the tensor)
    if getattr(args, "host_head", not getattr(args, "plain", False) and device != "cpu"):
        from remote_agent.eagle3.drafter.model.memory import HostWeight

        ctx.host_head, ctx.lm_head = HostWeight(lm_head, torch.device(device)), None
    return drafter, ctx, params, opt, config, backend


def attach_embeds(batch, ctx, device):
    """The batch with the rows of the host embedding (the loader's Batch.embeds, on the
    device like the rest of it) when the embedding stays on the host (build); else as it is."""
    from remote_agent.eagle3.drafter.train.data import embed_rows

    if ctx.host_embed is not None:
        ids = batch.input_ids.cpu()
        batch.embeds = embed_rows(ctx.host_embed, ids, ctx.steps).to(device)
    return batch


def teacher_states(lm_head, draft_ids, n: int, g):
    """Final hidden states whose target argmax is a drafted token (as for ~all supervised tokens
    of real data with a 32K frequency vocabulary): a scaled lm_head row plus noise."""
    import torch

    tgt = draft_ids.cpu()[torch.randint(0, draft_ids.numel(), (n,), generator=g)]
    rows = lm_head.index_select(0, tgt.to(lm_head.device)).float().cpu()
    return (0.5 * rows + 0.1 * torch.randn(n, rows.shape[1], generator=g)).to(torch.bfloat16)


def synthetic_batch(config, seq: int, docs: int, device, seed: int = 0, teacher=None):
    """One packed sequence of `docs` equal documents, every position supervised. `teacher`
    (lm_head, draft_ids) makes every teacher argmax drafted; without it the argmax is random."""
    import torch

    from remote_agent.eagle3.drafter.train.data import packed_batch

    g = torch.Generator().manual_seed(seed)
    h, k = config["hidden_size"], 3
    lengths = [seq // docs] * docs
    lengths[-1] += seq - sum(lengths)
    # target-like magnitudes: residual streams of a few units, a post-norm final state of ~1
    aux = (torch.randn(seq, k * h, generator=g) * 2.0).to(torch.bfloat16)
    if teacher is None:
        final = torch.randn(seq, h, generator=g).to(torch.bfloat16)
    else:
        final = teacher_states(*teacher, seq, g)
    ids = torch.randint(0, config["vocab_size"], (seq,), generator=g)
    mask = torch.ones(seq, dtype=torch.bool)
    parts = list(zip(*(t.split(lengths) for t in (ids, aux, final, mask)), strict=True))
    return packed_batch(parts, seq, []).to(device), lengths


CHAT_LENGTHS = (384, 768, 1024, 1536, 2048, 3072)  # tokens per conversation (mean 1,472)
PROMPT_SHARE = (0.15, 0.45)  # unsupervised share of each conversation (system + user turns)


def chat_docs(
    config, teacher, tokens: int, seed: int = 0, lengths=CHAT_LENGTHS, prompt_share=PROMPT_SHARE
) -> list[dict]:
    """Conversations for the chat workload: a prompt (loss mask 0) then the answer (mask 1)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    h, out, total = config["hidden_size"], [], 0
    while total < tokens:
        n = lengths[int(torch.randint(0, len(lengths), (1,), generator=g))]
        lo, hi = prompt_share
        prompt = int(n * (lo + (hi - lo) * float(torch.rand(1, generator=g))))
        mask = torch.zeros(n, dtype=torch.bool)
        mask[prompt:] = True
        out.append(
            {
                "ids": torch.randint(0, config["vocab_size"], (n,), generator=g),
                "aux": (torch.randn(n, 3 * h, generator=g) * 2.0).to(torch.bfloat16),
                "final": teacher_states(*teacher, n, g),
                "mask": mask,
            }
        )
        total += n
    return out


def pack_docs(docs: list[dict], seq: int, device, ctx=None) -> list:
    """The trainer's packing (first fit, longest first here) and batch layout, on the device
    (with the host embedding's rows where ctx keeps it there: attach_embeds)."""
    from remote_agent.eagle3.drafter.train.data import first_fit, packed_batch

    docs = sorted(docs, key=lambda d: -d["ids"].numel())
    bins = first_fit([d["ids"].numel() for d in docs], seq, window=len(docs))
    out = []
    for b in bins:
        parts = [(docs[i]["ids"], docs[i]["aux"], docs[i]["final"], docs[i]["mask"]) for i in b]
        batch = packed_batch(parts, seq, []).to(device)
        out.append(attach_embeds(batch, ctx, device) if ctx is not None else batch)
    return out


def run(args) -> dict:
    import torch

    from remote_agent.eagle3.drafter.train.step import teacher_head

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    seq = args.seq or (4096 if device != "cpu" else 256)
    if device == "cpu":
        pass  # threads: OMP_NUM_THREADS decides
    drafter, ctx, params, opt, config, backend = build(args, device)
    batch, lengths = synthetic_batch(
        config, seq, args.docs, device, teacher=(teacher_head(ctx), ctx.draft_ids)
    )
    attach_embeds(batch, ctx, device)
    warmup, steps = (2, 4) if args.quick else (3, 10)
    if args.steps:
        steps = args.steps

    from remote_agent.eagle3.drafter.train.loop import forward_backward

    def one(i: int) -> None:  # the trainer's step: forward_backward, clip, AdamW
        forward_backward(ctx, batch, i)
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    for i in range(warmup):
        one(i)
    sync(device)
    warm_s = time.perf_counter() - t0
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(steps):
        t = time.perf_counter()
        one(warmup + i)
        sync(device)
        times.append(time.perf_counter() - t)
    step_s = sorted(times)[len(times) // 2]
    flops = model_flops(config, lengths, args.ttt)
    if device == "cuda":
        peak = measure_peak(device, torch.bfloat16, 8192, 30 if not args.quick else 10)
        peak_mem = torch.cuda.max_memory_allocated() / 2**30
    else:
        peak = measure_peak(device, torch.float32, 1024, 5)
        peak_mem = None
    ref_peak = args.peak or (H200_PEAK if device == "cuda" else peak)
    # teacher share: time it alone on the same batch
    from remote_agent.eagle3.drafter.model.loss import teacher

    sync(device)
    t = time.perf_counter()
    teacher(batch.final[0], teacher_head(ctx), ctx.draft_ids, ctx.t2d, ctx.tc.teacher_chunk)
    sync(device)
    teacher_s = time.perf_counter() - t
    n_params = sum(p.numel() for p in params)
    result = {
        "bench": "train",
        "machine": describe(device=device),
        "arch": config["architectures"][0],
        "shape": {
            "hidden": config["hidden_size"],
            "heads": config["num_attention_heads"],
            "kv_heads": config.get("num_key_value_heads"),
            "intermediate": config["intermediate_size"],
            "vocab": config["vocab_size"],
            "draft_vocab": config["draft_vocab_size"],
            "seq": seq,
            "docs": args.docs,
            "ttt": args.ttt,
            "trainable_params": n_params,
        },
        "attention": backend,
        "compile": not args.no_compile and device != "cpu",
        "precision": "bf16 autocast, fp32 masters" if device != "cpu" else "fp32",
        "warmup_steps": warmup,
        "warmup_s": round(warm_s, 1),
        "step_s_median": round(step_s, 4),
        "step_s_all": [round(x, 4) for x in times],
        "tokens_per_s": round(seq / step_s, 1),
        "teacher_s": round(teacher_s, 4),
        "peak_mem_gb": None if peak_mem is None else round(peak_mem, 2),
        "flops": flops,
        "model_tflops_per_s": round(flops["train_total"] / step_s / 1e12, 2),
        "measured_peak_tflops": round(peak / 1e12, 1),
        "reference_peak_tflops": round(ref_peak / 1e12, 1),
        "mfu": round(flops["train_total"] / step_s / ref_peak, 4),
        "mfu_drafter": round(flops["train_drafter"] / step_s / ref_peak, 4),
        "mfu_vs_measured_peak": round(flops["train_total"] / step_s / peak, 4),
        "goal_mfu": 0.40,
    }
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"))
    p.add_argument("--quick", action="store_true", help="2 warmup + 4 timed steps")
    p.add_argument("--arch", choices=("llama", "mla"), default="llama")
    p.add_argument("--seq", type=int, help="packed tokens per step (default 4096; cpu 256)")
    p.add_argument("--docs", type=int, default=1, help="documents packed into the sequence")
    p.add_argument("--ttt", type=int, default=7)
    p.add_argument("--steps", type=int, help="timed steps")
    p.add_argument("--attention", default="auto", choices=("auto", "flex", "chunked", "dense"))
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--plain", action="store_true", help="every memory option off (plain unroll)")
    p.add_argument("--peak", type=float, help="reference peak FLOP/s (default: H200 790e12)")
    for key in KIMI:
        p.add_argument(f"--{key.replace('_', '-')}", dest=key, type=int)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "train.json")
    args = p.parse_args(argv)
    result = run(args)
    save_result(args.out, result)
    print(
        json.dumps({k: v for k, v in result.items() if k not in ("flops", "step_s_all")}, indent=1)
    )
    print(
        f"bench_train: {result['arch']} seq {result['shape']['seq']} ttt {result['shape']['ttt']}: "
        f"{result['tokens_per_s']} tok/s, {result['model_tflops_per_s']} model TFLOP/s, "
        f"MFU {result['mfu']:.1%} (drafter only {result['mfu_drafter']:.1%}; measured peak "
        f"{result['measured_peak_tflops']} TFLOP/s), peak memory {result['peak_mem_gb']} GB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
