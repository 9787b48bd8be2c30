"""Peak GPU memory of one trainer step at the Kimi shape for any length, on CPU, in seconds.

Runs the trainer's real step (step.forward_backward, gradient clipping, AdamW with its
states) on fake tensors (torch FakeTensorMode: shapes and dtypes, no data, no memory), the
Kimi-shaped drafter (hidden 7168, 64 x 112 heads, MLP 18,432, vocab 163,840 -> 32,000, TTT 7)
under bf16 autocast, and follows every storage made (a dispatch mode with weak references:
the bytes alive at each op), so the peak and what is alive at it come out by part (the code
that made each tensor). Flex attention (no CPU backward) is stood in for by a function that
keeps what flex keeps for backward (q, k, v, out, lse) and makes dq, dk, dv and its fp32 delta
in backward; the cuBLAS fp32-accumulating lm_head gradient writes in place (no temporary).

What it is for: which part holds memory at the peak, what a change saves, and whether a length
fits before a device call spends minutes finding out. It runs eager: torch.compile'd layer
halves on the GPU keep less (inductor recomputes elementwise work), so it over-counts; against
the 2026-12-04 H200 figures at 4K (before this file's changes): ours_mid 36.9 modelled vs 32.24
measured, ours_lean 29.2 vs 27.12, the plain unroll 50.0 vs 40.81 GiB. The sides are
bench_long_context's option sets (long_context_trials.OPTION_SETS).

Run:  PYTHONPATH=. python3 bench/memory_model.py --sides ours_mid,ours_lean --seqs 4096,131072
      [--parts 12] [--shard-tokens N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import weakref
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

GIB = 2**30


def _made_by() -> str:
    """The innermost three functions of this repository (or the optimizer) making a tensor."""
    f = sys._getframe(3)
    names = []
    ours = ("remote_agent", "/bench/", "torch/optim", "clip_grad")
    skip = ("_wrapped_call_impl", "_call_impl", "__torch_dispatch__")
    while f is not None:
        if any(x in f.f_code.co_filename for x in ours) and f.f_code.co_name not in skip:
            names.append(f.f_code.co_name)
        f = f.f_back
    return "/".join(reversed(names[:3])) or "setup"


class Live(TorchDispatchMode):
    """Bytes of the storages made by ops inside (and those added) that are still alive; the
    peak and, at the peak, what is alive by maker."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, weakref.ref] = {}
        self.info: dict[int, tuple[int, str]] = {}
        self.cur = self.peak = 0
        self.at_peak: list[tuple[int, str]] = []
        self.phase = ""
        self.peak_phase = ""

    def add(self, t) -> None:
        if not isinstance(t, torch.Tensor):
            return
        st = t.untyped_storage()
        key = st._cdata
        if key in self.refs:
            return
        n = st.nbytes()

        def gone(_, key=key, n=n):
            self.refs.pop(key, None)
            self.info.pop(key, None)
            self.cur -= n

        self.refs[key] = weakref.ref(st, gone)
        self.info[key] = (n, _made_by())
        self.cur += n
        if self.cur > self.peak:
            self.peak, self.peak_phase = self.cur, self.phase
            self.at_peak = list(self.info.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            self.add(t)
        return out


class _FlexStandIn(torch.autograd.Function):
    """What flex attention keeps and makes: q, k, v, out, lse saved; dq, dk, dv and a delta."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out, lse

    @staticmethod
    def backward(ctx, g_out, g_lse):
        q, k, v, _, lse = ctx.saved_tensors
        _delta = lse.new_empty(lse.shape)
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@contextlib.contextmanager
def _stand_ins():
    """Within: flex attention and its block masks stood in for (no CPU backward, no data),
    the cuBLAS fp32 accumulation of the lm_head gradient in place; restored after."""
    from remote_agent.eagle3.drafter.model import loss, ttt_attention
    from remote_agent.eagle3.drafter.train import shards

    def flex(q, k, v, block_mask=None, scale=None, enable_gqa=False, return_lse=True):
        return _FlexStandIn.apply(q, k, v)

    saved = [
        (ttt_attention, "_flex_fn", lambda compiled=True: flex),
        (ttt_attention, "_flex_block_mask", lambda doc, rows, compile_mask=False: None),
        (shards, "flex_block_mask_range", lambda doc, lo, hi, compile_mask=False: None),
        (loss, "mm_into", lambda total, a, b: None),
    ]
    before = [(mod, name, getattr(mod, name)) for mod, name, _ in saved]
    try:
        for mod, name, fn in saved:
            setattr(mod, name, fn)
        yield
    finally:
        for mod, name, fn in before:
            setattr(mod, name, fn)


def build(side: str, ttt: int, shard_tokens: int | None):
    """The Kimi-shaped drafter and the trainer's step context for an option set (fake)."""
    import bench_train
    import long_context_trials as trials

    from remote_agent.eagle3.distributed import Dist
    from remote_agent.eagle3.drafter.model.model import Eagle3Drafter, build_config
    from remote_agent.eagle3.drafter.train.config import DrafterSection, TrainSection
    from remote_agent.eagle3.drafter.train.step import StepContext, TTTStep

    k = bench_train.KIMI
    ds = DrafterSection(
        arch="llama", num_attention_heads=k["heads"], num_key_value_heads=k["kv_heads"],
        intermediate_size=k["inter"],
    )  # fmt: skip
    config = build_config(
        ds, target_hidden=k["hidden"], vocab_size=k["vocab"], draft_vocab_size=k["draft_vocab"],
        aux_layer_ids=[2, 30, 58], target_context=262144,
    )  # fmt: skip
    drafter = Eagle3Drafter(config)
    opts = dict(trials.OPTION_SETS[side])
    table = torch.empty(k["vocab"], k["hidden"], dtype=torch.bfloat16)
    host = bool(opts.pop("embed_on_host", False))
    host_head = bool(opts.pop("lm_head_on_host", False))
    drafter.embed_tokens.weight = torch.nn.Parameter(
        table.new_empty(0, k["hidden"]) if host else table, requires_grad=False
    )
    d2t, t2d = bench_train.vocab_mapping(k["vocab"], k["draft_vocab"])
    drafter.d2t, drafter.t2d = d2t, t2d
    tc = TrainSection(ttt_steps=ttt, compile=False, skip_idle_rows=False)
    if "shard_tokens" in opts or shard_tokens is not None:
        tc.shard_tokens = int(shard_tokens if shard_tokens is not None else opts["shard_tokens"])
    opts.pop("shard_tokens", None)
    step = TTTStep(drafter, tc.ttt_steps, tc.loss_chunk)
    for name, value in opts.items():
        setattr(step, name, value)
    step.compile_loss = False  # eager chunk math: the same kept tensors
    params = [p for p in drafter.parameters() if p.requires_grad]
    lm_head = torch.empty(k["vocab"], k["hidden"], dtype=torch.bfloat16)
    ctx = StepContext(
        step, lm_head, drafter.draft_ids(), drafter.t2d, tc.ttt_steps,
        [tc.step_weight**i for i in range(tc.ttt_steps)], drafter.midlayer.self_attn.scale,
        "flex", torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False), True, Dist(),
        tc, table if host else None,
    )  # fmt: skip
    if host_head:  # its device copy made by get() and dropped after the teacher: counted then
        from remote_agent.eagle3.drafter.model.memory import HostWeight

        ctx.host_head, ctx.lm_head = HostWeight(lm_head, torch.device("cpu")), None
    return drafter, ctx, params, config


def model(side: str, seq: int, ttt: int = 7, parts: int = 12, shard_tokens=None) -> dict:
    """Peak GiB of the second step (AdamW states exist) and what is alive at the peak."""
    import long_context_trials as trials
    from torch._subclasses.fake_tensor import FakeTensorMode

    from remote_agent.eagle3.drafter.train.data import embed_rows
    from remote_agent.eagle3.drafter.train.loop import forward_backward

    t0 = time.time()
    with _stand_ins(), FakeTensorMode(allow_non_fake_inputs=True):
        drafter, ctx, params, config = build(side, ttt, shard_tokens)
        opt = torch.optim.AdamW(params, lr=1e-4, foreach=False)
        from remote_agent.eagle3.drafter.train.step import teacher_head

        head = teacher_head(ctx)
        b = trials.device_batch(config, seq, "cpu", head, ctx.draft_ids)
        del head
        if ctx.host_embed is not None:
            b.embeds = embed_rows(ctx.host_embed, b.input_ids, ctx.steps)
        live = Live()
        heads = [ctx.lm_head] if ctx.lm_head is not None else []
        for t in [*drafter.parameters(), *drafter.buffers(), *heads, *vars(b).values()]:
            live.add(t)
        with live:
            for i in range(2):
                if i == 1:  # the second step: optimizer states exist
                    live.peak, live.at_peak = live.cur, list(live.info.values())
                live.phase = "forward_backward"
                forward_backward(ctx, b, i)
                live.phase = "clip"
                torch.nn.utils.clip_grad_norm_(params, 0.5, foreach=False)
                live.phase = "optimizer"
                opt.step()
                opt.zero_grad(set_to_none=True)
    by: dict[str, int] = defaultdict(int)
    for n, maker in live.at_peak:
        by[maker] += n
    top = sorted(by.items(), key=lambda x: -x[1])[:parts]
    return {
        "side": side,
        "seq": seq,
        "shard_tokens": ctx.tc.shard_tokens,
        "peak_gib": round(live.peak / GIB, 2),
        "peak_in": live.peak_phase,
        "alive_at_peak_gib": {k: round(v / GIB, 2) for k, v in top},
        "model_s": round(time.time() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--sides", default="ours_mid")
    p.add_argument("--seqs", default="4096")
    p.add_argument("--ttt", type=int, default=7)
    p.add_argument("--parts", type=int, default=12, help="makers listed at the peak")
    p.add_argument("--shard-tokens", type=int, help="override the side's train.shard_tokens")
    args = p.parse_args(argv)
    for side in args.sides.split(","):
        for seq in (int(x) for x in args.seqs.split(",")):
            print(json.dumps(model(side, seq, args.ttt, args.parts, args.shard_tokens)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
