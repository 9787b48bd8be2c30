"""Worker of bench_long_context.py: one trainer side in its own process, trials of one length each.

A side is ours with an option set (OPTION_SETS) or SpecForge 0.2.0 (bench_specforge's SFStep on
a draft sharing our frozen embedding and vocab maps). The worker builds it on the GPU, then runs
trials in order: `--seqs` (a ladder), then, with `--search`, probes chosen from the memory of the
successes so far (peak = a + b x length, fitted on the last two: the next probe is the predicted
longest that fits, at most double the last, at least one `--step` longer), until the first
failure. With `--go-file` it first runs `--seqs`, then waits (everything else of the benchmark
may be running) until the orchestrator writes the file, then runs `--then-seqs` and the search:
SpecForge keeps its compiled kernels from the 4K equal-work trial into its max_seq ladder.

Per trial: a fresh batch (one document, every position supervised), `--warmup` steps (the first
compiles), `--timed` steps with the GPU to itself (gpu_gate: every other worker paused), the
peak memory (counters reset per trial), and on failure the error, its kind (oom / error), the
frame in this repository or SpecForge where it happened and the free memory then. After every
phase the record is written to `<work>/<role>.json`, so a worker killed by the budget still says
where it was (`phase`) and what it finished.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

from gpu_gate import exclusive

REPO = Path(__file__).resolve().parents[1]
H200_PEAK = 790e12

# our option sets (TTTStep attributes; train.* keys of the same names, checkpoint_steps =
# checkpoint_ttt_steps); every one exact (tests/eagle3/drafter/test_drafter_long_memory.py).
# ours: the plain unroll (TTTStep's own defaults: every option off); ours_mid: the trainer's
# defaults (config.TrainSection as loop.resolved_options applies it on one GPU); ours_lean:
# the defaults plus per-step checkpointing, for the longest sequences


def _defaults() -> dict[str, Any]:
    from remote_agent.eagle3.drafter.train.config import TrainSection

    tc = TrainSection()
    return {
        "cast_weights_once": tc.cast_weights_once is not False,  # null = on without FSDP
        "recompute_elementwise": tc.recompute_elementwise,
        "compile_loss": tc.compile_loss,
        "checkpoint_steps": tc.checkpoint_ttt_steps,
        "embed_once": tc.embed_once,
        "embed_on_host": tc.embed_on_host is not False,  # null = on (one GPU, a dump)
        "lm_head_on_host": tc.lm_head_on_host is not False,  # null = on with CUDA
        "shard_tokens": tc.shard_tokens,
    }


OPTION_SETS: dict[str, dict[str, Any]] = {
    "ours": {},
    "ours_mid": _defaults(),
    "ours_lean": {**_defaults(), "checkpoint_steps": True},
}
# CPU rehearsal (--tiny): lengths past which a trial raises an emulated OOM, so the failure,
# search and bisection paths run without a GPU
TINY_OOM = {"ours_mid": 1600, "ours_lean": 1600, "specforge": 700}


def shape_args(args) -> argparse.Namespace:
    """bench_train.build's arguments: the Kimi shape (the tiny preset with --tiny)."""
    import bench_train

    dims = dict(bench_train.TINY if args.tiny else bench_train.KIMI)
    return argparse.Namespace(
        arch="llama", ttt=args.ttt, attention="auto", no_compile=args.tiny, on_device=True,
        plain=True, **dims,
    )  # fmt: skip


def device_batch(config, seq: int, device, lm_head, draft_ids, seed: int = 0):
    """One document of `seq` tokens, all supervised, made on the device (a 256K batch on the
    host would take minutes): aux of residual-stream size, final states whose target argmax is
    a drafted token (bench_train.teacher_states, on the device)."""
    import torch

    from remote_agent.eagle3.drafter.train.data import Batch

    g = torch.Generator(device=device).manual_seed(seed)
    h = config["hidden_size"]
    aux = (torch.randn(1, seq, 3 * h, generator=g, device=device) * 2.0).to(torch.bfloat16)
    pick = torch.randint(0, draft_ids.numel(), (seq,), generator=g, device=device)
    rows = lm_head.index_select(0, draft_ids[pick]).float()
    final = 0.5 * rows + 0.1 * torch.randn(rows.shape, generator=g, device=device)
    ids = torch.randint(0, config["vocab_size"], (1, seq), generator=g, device=device)
    pos = torch.arange(seq, device=device)[None]
    return Batch(
        ids,
        aux,
        final.to(torch.bfloat16)[None],
        torch.ones(1, seq, dtype=torch.bool, device=device),
        torch.zeros(1, seq, dtype=torch.int32, device=device),
        pos,
        seq,
        [],
    )


def where_failed(exc: BaseException) -> str:
    """The innermost frame in this repository or SpecForge: where a trial failed."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if str(REPO) in f.filename or "specforge" in f.filename]
    f = (mine or frames)[-1]
    return f"{Path(f.filename).name}:{f.lineno} {f.name}"


def make_side(side: str, args, device: str):
    """(one_step(batch, i), config, ctx) for an option set of ours or for 'specforge'."""
    import bench_train
    import torch

    ns = shape_args(args)
    if side not in OPTION_SETS:  # SpecForge imported before our trainer exists (import_sf)
        from bench_specforge import import_sf

        import_sf(Path(args.wheel), device)
    opts = OPTION_SETS.get(side, {})
    ns.host_embed = bool(opts.get("embed_on_host"))  # not TTTStep attributes: build's
    ns.host_head = bool(opts.get("lm_head_on_host")) and device != "cpu"
    checkpointed = bool(opts.get("checkpoint_steps"))
    if checkpointed:
        ns.no_compile = True  # compiled below as the trainer does under checkpointing
    drafter, ctx, params, opt, config, _backend = bench_train.build(ns, device)
    if side in OPTION_SETS:
        from remote_agent.eagle3.drafter.train.loop import compile_layer, forward_backward

        for name, value in opts.items():
            if name == "shard_tokens":  # a train.* option: the step reads it from ctx.tc
                ctx.tc = dataclasses.replace(ctx.tc, shard_tokens=value)
                continue
            if name in ("embed_on_host", "lm_head_on_host"):
                continue
            assert hasattr(ctx.model, name), name
            setattr(ctx.model, name, value)
        if getattr(args, "shard_tokens", 0):  # the max_seq ladder's shard size (the card's)
            ctx.tc = dataclasses.replace(ctx.tc, shard_tokens=args.shard_tokens)
        if checkpointed and device == "cuda":
            compile_layer(drafter, checkpointed=True)
            ctx.tc = dataclasses.replace(ctx.tc, compile=True)  # the merge too, as the trainer

        def one(b, i):
            forward_backward(ctx, b, i)
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
            opt.zero_grad(set_to_none=True)

        return one, config, ctx
    from bench_specforge import SFStep, sf_draft_like

    attention = "flex_attention" if device != "cpu" else "sdpa"
    with torch.device(device):  # made on the GPU: no host initialisation of 2.3 B floats
        draft = sf_draft_like(drafter, config, device, attention)
    lm_head, draft_ids = ctx.lm_head, ctx.draft_ids
    drafter = params = opt = None  # free our trainer before building SpecForge's
    ctx.model = None
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    step = SFStep(draft, lm_head, args.ttt, attention, 1e-4, 1000, device)
    ctx.lm_head, ctx.draft_ids = lm_head, draft_ids

    def one(b, i):
        step(b.input_ids, b.aux, b.final, b.loss_mask.long())

    return one, config, ctx


class Worker:
    """One side's trials and their record, written after every phase."""

    def __init__(self, args) -> None:
        self.args = args
        self.t0 = time.time()
        self.deadline = self.t0 + args.worker_budget_s
        self.rec: dict[str, Any] = {
            "side": args.side,
            "options": OPTION_SETS.get(args.side, "SpecForge 0.2.0 recipe"),
            "shard_tokens": getattr(args, "shard_tokens", 0) or None,
            "pid": os.getpid(),
            "phases": {},
            "trials": [],
        }
        self.work = Path(args.work)
        if getattr(args, "spawned_at", None):  # python, torch and transformers imported
            self.rec["phases"]["start_s"] = round(self.t0 - args.spawned_at, 1)

    def phase(self, name: str) -> None:
        self.rec["phase"] = name
        self.rec["phase_at_s"] = round(time.time() - self.t0, 1)
        self.save()

    def done_phase(self, name: str, t: float) -> None:
        self.rec["phases"][name] = round(time.perf_counter() - t, 1)

    def save(self) -> None:
        out = self.work / f"{self.args.worker}.json"
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.rec, indent=1, default=str))
        os.replace(tmp, out)

    # -- the run -------------------------------------------------------------------------

    def run(self) -> dict:
        args = self.args
        self.phase("import")
        t = time.perf_counter()
        import bench_train  # noqa: F401  (torch, transformers and the repository imported)
        import torch

        self.done_phase("import_s", t)
        if args.device == "cuda":
            self.rec["gpu_total_gib"] = round(
                torch.cuda.get_device_properties(0).total_memory / 2**30, 2
            )
        self.phase("build")
        t = time.perf_counter()
        self.one, self.config, self.ctx = make_side(args.side, args, args.device)
        self.done_phase("build_s", t)
        self.ladder(args.seqs, args.timed)
        if args.go_file:
            self.phase("waiting for go")
            t = time.perf_counter()
            go = Path(args.go_file)
            while not go.exists() and time.time() < self.deadline:
                time.sleep(0.2)
            self.done_phase("waited_s", t)
            if not go.exists() or go.read_text().strip() == "stop":
                self.rec["stopped"] = "no go (budget)" if not go.exists() else "told to stop"
                self.phase("done")
                return self.rec
            self.deadline = time.time() + float(go.read_text().strip() or args.worker_budget_s)
            self.ladder(args.then_seqs or [], args.then_timed)
        if args.search:
            self.search()
        self.phase("done")
        return self.rec

    def oom_once(self) -> bool:
        """Rehearsal of the rerun after an OOM beside others: the first child of the side named
        by BENCH_LC_OOM_ONCE fails (a marker in the work directory makes it once)."""
        if os.environ.get("BENCH_LC_OOM_ONCE") != self.args.side:
            return False
        marker = self.work / f"oom-once-{self.args.side}"
        if marker.exists():
            return False
        marker.write_text("1")
        return True

    def failed(self) -> bool:
        return any(t.get("ok") is False for t in self.rec["trials"])

    def ladder(self, seqs: list[int], timed: int) -> None:
        for seq in seqs:  # a failure ends the rungs at or past its length only
            if any(t.get("ok") is False and t["seq"] <= seq for t in self.rec["trials"]):
                continue
            if time.time() > self.deadline:
                self.rec["trials"].append({"seq": seq, "skipped": "worker time budget"})
                return
            self.trial(seq, timed if seq <= self.args.timed_max_seq else 0)

    def search(self) -> None:
        """Probes from the memory fit until the first failure (then fresh processes bisect)."""
        while not self.failed() and time.time() < self.deadline:
            nxt = next_probe(self.rec["trials"], self.args.step, self.rec.get("gpu_total_gib"))
            if nxt is not None and self.args.max_probe and nxt > self.args.max_probe:
                done = [t["seq"] for t in self.rec["trials"] if "ok" in t]
                nxt = self.args.max_probe if self.args.max_probe not in done else None
                if nxt is not None and nxt <= max(done, default=0):
                    nxt = None
            if nxt is None:
                return
            self.trial(nxt, 0)

    def trial(self, seq: int, timed: int) -> None:
        import bench_train
        import torch

        args, dev = self.args, self.args.device
        rec: dict[str, Any] = {"seq": seq}
        self.rec["trials"].append(rec)
        t0 = time.perf_counter()
        b = None
        try:
            self.phase(f"seq {seq}: batch")
            if args.tiny and (seq > TINY_OOM.get(args.side, 1 << 30) or self.oom_once()):
                raise torch.OutOfMemoryError(
                    f"CUDA out of memory (tiny rehearsal: emulated at {seq})"
                )
            from remote_agent.eagle3.drafter.train.step import teacher_head

            head = teacher_head(self.ctx)
            b = device_batch(self.config, seq, dev, head, self.ctx.draft_ids, seed=seq)
            del head
            bench_train.attach_embeds(b, self.ctx, dev)  # the host embedding's rows (defaults)
            if dev == "cuda":
                torch.cuda.reset_peak_memory_stats()
            for w in range(args.warmup):
                self.phase(f"seq {seq}: warmup step {w}" + (" (compiles)" if w == 0 else ""))
                t = time.perf_counter()
                if w == 0:
                    self.one(b, w)
                else:  # later warmups with the GPU to itself too: no one else's kernels
                    with exclusive(self.work, rec):
                        self.one(b, w)
                bench_train.sync(dev)
                rec[f"warmup{w}_s"] = round(time.perf_counter() - t, 2)
            if dev == "cuda":
                rec["peak_mem_gb_warmup"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
                torch.cuda.reset_peak_memory_stats()
            times = []
            if timed:
                self.phase(f"seq {seq}: timed")
                with exclusive(self.work, rec):
                    for s in range(timed):
                        t = time.perf_counter()
                        self.one(b, args.warmup + s)
                        bench_train.sync(dev)
                        times.append(time.perf_counter() - t)
            rec["ok"] = True
            if times:
                step_s = sorted(times)[len(times) // 2]
                opts = OPTION_SETS.get(args.side, {})
                shard = getattr(args, "shard_tokens", 0) or opts.get("shard_tokens") or 0
                fl = bench_train.model_flops(
                    self.config, [seq], args.ttt, bool(opts.get("embed_once")), int(shard)
                )
                flops = fl["train_total"]
                rec.update(
                    step_s=round(step_s, 4),
                    step_s_all=[round(x, 4) for x in times],
                    tokens_per_s=round(seq / step_s, 1),
                    model_tflops_per_s=round(flops / step_s / 1e12, 2),
                    mfu=round(flops / step_s / H200_PEAK, 4),
                    mfu_executed=round(fl["train_executed"] / step_s / H200_PEAK, 4),
                )
            if dev == "cuda":
                timed_peak = torch.cuda.max_memory_allocated() / 2**30 if times else 0.0
                rec["peak_mem_gb"] = round(max(timed_peak, rec["peak_mem_gb_warmup"]), 2)
                if times:
                    rec["peak_mem_gb_timed"] = round(timed_peak, 2)
        except Exception as exc:  # OOM or any other failure: what, where, how much was free
            msg = str(exc).strip().splitlines()
            oom = isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()
            rec.update(
                ok=False,
                kind="oom" if oom else "error",
                error=f"{type(exc).__name__}: {msg[0][:300] if msg else ''}",
                where=where_failed(exc),
            )
            if dev == "cuda":
                free, total = torch.cuda.mem_get_info()
                rec["free_gib_at_failure"] = round(free / 2**30, 2)
                rec["allocated_gib_at_failure"] = round(torch.cuda.memory_allocated() / 2**30, 2)
        finally:
            rec["seconds"] = round(time.perf_counter() - t0, 1)
            b = None
            gc.collect()
            if dev == "cuda":
                torch.cuda.empty_cache()
            self.save()


def next_probe(trials: list[dict], step: int, total_gib: float | None) -> int | None:
    """The next length to try from the successes' memory (None after a failure): peak = a + b x
    length through the last two, the longest predicted to fit in 96 % of the GPU, rounded down
    to `step`; at least one step past the longest success, at most double it. Without memory
    figures (CPU) or with one success: double."""
    if any(t.get("ok") is False for t in trials):
        return None
    ok = sorted((t for t in trials if t.get("ok")), key=lambda t: t["seq"])
    if not ok:
        return None
    last = ok[-1]["seq"]
    guess = 2 * last
    peaks = [(t["seq"], t.get("peak_mem_gb") or 0.0) for t in ok[-2:]]
    if total_gib and len(peaks) == 2 and all(p > 0 for _, p in peaks):
        (l1, p1), (l2, p2) = peaks
        slope = (p2 - p1) / (l2 - l1) if l2 > l1 else 0
        if slope > 0:
            guess = int((0.96 * total_gib - (p2 - slope * l2)) / slope)
    guess = guess // step * step
    return max(last + step, min(guess, 2 * last))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--side", help=argparse.SUPPRESS)
    p.add_argument("--seqs", type=_ints, default=[], help=argparse.SUPPRESS)
    p.add_argument("--then-seqs", type=_ints, default=[], help=argparse.SUPPRESS)
    p.add_argument("--go-file", help=argparse.SUPPRESS)
    p.add_argument("--search", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--step", type=int, default=4096, help=argparse.SUPPRESS)
    p.add_argument("--max-probe", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--timed", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--then-timed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--worker-budget-s", type=float, default=600, help=argparse.SUPPRESS)
    p.add_argument("--timed-max-seq", type=int, default=32 * 1024, help=argparse.SUPPRESS)
    p.add_argument("--shard-tokens", type=int, default=0, help=argparse.SUPPRESS)


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]
