"""The training loop: read it top to bottom.

setup (distributed, device, data plan, target lm_head + embedding, vocab mapping, drafter,
optimizer, schedule, resume) -> for each packed batch: `forward_backward` (step.py: teacher
from the stored final hidden states, TTT unroll, weighted soft CE per step, backward), clip,
AdamW step -> metrics and progress lines, atomic checkpoints. Runs alone or under torchrun
(DDP; FSDP2 with `train.parallel: fsdp`; parallel/data_parallel.py; or every rank a share of the
same long batch with `train.sequence_parallel`: seq_parallel_step.py). Resume and checkpoint
state: state.py; the metric window: metrics.py.
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, cast

import torch

from remote_agent.eagle3.atomic import write_bytes_atomic
from remote_agent.eagle3.distributed import Dist
from remote_agent.eagle3.drafter.model.context import target_context_length
from remote_agent.eagle3.drafter.model.loss import load_target_tensor
from remote_agent.eagle3.drafter.model.memory import HostWeight
from remote_agent.eagle3.drafter.model.model import Eagle3Drafter, build_config
from remote_agent.eagle3.drafter.model.ttt_attention import pick_backend
from remote_agent.eagle3.drafter.parallel.data_parallel import load_optimizer, trainable_count, wrap
from remote_agent.eagle3.drafter.parallel.multinode import check_shared_out
from remote_agent.eagle3.drafter.train import checkpoint as ckpt
from remote_agent.eagle3.drafter.train import state as train_state
from remote_agent.eagle3.drafter.train.config import Config
from remote_agent.eagle3.drafter.train.data import Loader, Plan, load_vocab
from remote_agent.eagle3.drafter.train.finite import FiniteWatch
from remote_agent.eagle3.drafter.train.metrics import Window
from remote_agent.eagle3.drafter.train.seq_parallel_step import (
    all_reduce_grads,
    sp_forward_backward,
)
from remote_agent.eagle3.drafter.train.simulate import chain_depth
from remote_agent.eagle3.drafter.train.step import (  # noqa: F401  (re-exported for benches)
    RowPlan,
    StepContext,
    StepOut,
    TTTStep,
    forward_backward,
)
from remote_agent.eagle3.errors import BadInput
from remote_agent.eagle3.extraction.identity import check_identity
from remote_agent.eagle3.progress import Progress

_Window = Window  # the old private name (tests)


def train(cfg: Config) -> dict[str, Any]:
    tc = cfg.train
    d, bf16, backend = _devices(tc)
    device = d.device
    cast_once, compiled = resolved_options(tc, d.world, device.type)
    sp = tc.sequence_parallel and d.world > 1  # every rank the same batch, its share of positions
    if sp and tc.parallel == "fsdp":
        raise BadInput("train.sequence_parallel does not combine with train.parallel: fsdp")
    out_dir = Path(tc.out_dir)
    ckpt_dir = out_dir / "checkpoints"
    plan = _plan(cfg, d, 1 if sp else d.world)
    steps_per_epoch = plan.steps_per_epoch(0)
    total_steps = tc.max_steps or tc.epochs * steps_per_epoch
    # with max_steps, allow one more epoch: packing varies a little from epoch to epoch
    epochs = max(tc.epochs, math.ceil(total_steps / steps_per_epoch) + (1 if tc.max_steps else 0))
    host_embed = _embed_on_host(cfg, d.world)
    drafter, lm_head, vocab_n, embed = _target_and_drafter(cfg, plan, device, bf16, host_embed)
    draft_ids = drafter.draft_ids()

    # multi-node: every rank must see rank 0's train.out and pick the same checkpoint
    check_shared_out(d, out_dir, ckpt.latest(ckpt_dir) if tc.resume == "auto" else None)
    res = train_state.resume(cfg, ckpt_dir, drafter, d)  # weights now, optimizer after wrapping
    global_step = res.global_step
    step_module = TTTStep.for_training(drafter, tc, cast_once, compiled)
    if compiled:
        compile_layer(drafter, tc.checkpoint_ttt_steps)
    model = step_module if sp else wrap(step_module, d, tc.parallel, bf16)
    params = [p for p in model.parameters() if p.requires_grad]
    opt, sched = _optimizer(params, tc, total_steps, device)
    if res.state is not None:
        load_optimizer(model, opt, res.state["optimizer"])
        sched.load_state_dict(res.state["scheduler"])
        ckpt.set_rng_state(res.state["rng"])
    if d.main:
        n_trainable = trainable_count(model, step_module, drafter)
        resumed = f"; resumed from {res.path.name} at step {global_step}" if res.path else ""
        _announce(cfg, out_dir, drafter, plan, d, (steps_per_epoch, total_steps), backend, bf16)
        print(f"  {n_trainable / 1e6:.1f} M trainable params; vocab {vocab_n}{resumed}", flush=True)

    steps_k = tc.ttt_steps
    step_w = [tc.step_weight**k for k in range(steps_k)]
    depth = min(chain_depth(tc.sim_steps, tc.sim_topk, tc.sim_draft_tokens), steps_k)
    scale = drafter.midlayer.self_attn.scale
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    )  # fmt: skip
    host_head = None
    if _lm_head_on_host(tc, device.type, sp):  # the teacher's lm_head between teachers
        host_head, lm_head = HostWeight(lm_head, device), None
    step_ctx = StepContext(
        model, lm_head, draft_ids, drafter.t2d, steps_k, step_w, scale, backend, autocast, bf16, d, tc,
        embed, host_head,
    )  # fmt: skip
    pin = cfg.data.pin_memory and device.type == "cuda"
    rank = 0 if sp else d.rank  # sequence parallel: every rank loads rank 0's batches
    # online/source.py: its loader takes the OnlinePlan that _plan made (a Plan to the checker)
    loader_cls = cast("type[Loader]", _online().OnlineLoader if cfg.online.server else Loader)
    host = {} if embed is None else {"embed": embed, "embed_pad": steps_k}  # Batch.embeds
    loader = loader_cls(
        plan, rank, res.epoch, res.step, epochs, prefetch=cfg.data.prefetch, pin=pin, **host
    )
    window = Window(step_w, depth)
    progress = Progress("train", total_steps, "step", start=global_step) if d.main else None
    last_rec: dict[str, Any] = {}
    finite = FiniteWatch(device, tc.max_nonfinite_steps)
    stopped, t_window, wait_mark, epoch, tokens_seen = False, time.perf_counter(), 0.0, res.epoch, 0
    save_due = False
    try:
        for epoch, step_in_epoch, host_batch in loader:
            if global_step >= total_steps:
                break
            b = host_batch.to(device)
            if sp:
                out = sp_forward_backward(step_ctx, b, global_step)
                all_reduce_grads(params)
            else:
                out = forward_backward(step_ctx, b, global_step)
            grad_norm = (
                torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
                if tc.grad_clip > 0
                else _grad_norm(params)
            )
            lr_now = sched.get_last_lr()[0]
            finite.step(opt, grad_norm, global_step + 1)  # no update where the norm is NaN/inf
            sched.step()
            opt.zero_grad(set_to_none=True)
            global_step += 1
            # every rank's batch is packed the same way (sequence parallel: the same batch)
            tokens_seen += b.tokens * (1 if sp else d.world)
            with torch.no_grad():
                own_tokens = (b.tokens if d.main else 0) if sp else b.tokens
                window.add(out, b, draft_ids, grad_norm, lr_now, own_tokens)
            if global_step % tc.log_every == 0 or global_step == total_steps:
                finite.check(global_step, _latest(ckpt_dir))
                now = time.perf_counter()
                last_rec = window.emit(
                    d, global_step, epoch, now - t_window, loader.wait_s - wait_mark
                )
                t_window, wait_mark = now, loader.wait_s
                if d.main:
                    with open(out_dir / "metrics.jsonl", "a") as f:
                        f.write(json.dumps(last_rec) + "\n")
            if progress is not None:
                progress.advance(1, tokens=tokens_seen, epoch=epoch)
            position = train_state.next_position(epoch, step_in_epoch, plan, plan.world)
            stop_here = tc.stop_after_step is not None and global_step == tc.stop_after_step
            save_due |= bool(tc.save_every and global_step % tc.save_every == 0)
            if save_due or stop_here:
                finite.check(global_step, _latest(ckpt_dir))
                if stop_here or not finite.last_skipped():  # else after the next finite step
                    train_state.save(
                        model, drafter, opt, sched, d, ckpt_dir, global_step, position, cfg
                    )
                    save_due = False
            if stop_here:
                stopped = True
                break
    finally:
        loader.close()
    if progress is not None:
        progress.finish(tokens=tokens_seen, epoch=epoch)
    if not stopped and global_step > 0 and not (ckpt_dir / f"step-{global_step:08d}").exists():
        finite.check(global_step, _latest(ckpt_dir))
        position = {"epoch": epoch + 1, "step": 0}
        train_state.save(model, drafter, opt, sched, d, ckpt_dir, global_step, position, cfg)
    d.close()
    latest = ckpt.latest(ckpt_dir)
    return {
        "steps": global_step,
        "stopped_early": stopped,
        "loss": last_rec.get("loss"),
        "checkpoint": str(latest) if latest else None,
        "out_dir": str(out_dir),
        "world": d.world,
        "sim_accept_len": last_rec.get("sim_accept_len"),
        "tokens_per_s": last_rec.get("tokens_per_s"),
    }


# -------------------------------------------------------------------------------------------
# its pieces, in the order train() calls them (each followed by those it calls)


def _devices(tc) -> tuple[Dist, bool, str]:
    want = tc.device if tc.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if want == "cuda" and not torch.cuda.is_available():
        raise BadInput("train.device is cuda but no CUDA device is visible")
    d = Dist.from_env(want)  # under torchrun: cuda:LOCAL_RANK (made current) and the group
    if d.device.type == "cpu":
        cpu_threads()
    if d.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    bf16 = tc.precision == "bf16" or (tc.precision == "auto" and d.device.type == "cuda")
    return d, bf16, pick_backend(tc.attention, d.device)


def cpu_threads() -> None:
    """CPU runs are tiny models (tests, demo): one thread per process unless OMP_NUM_THREADS is
    set; oversubscribed threads on a shared 2-core box are slower by an order of magnitude."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)


def resolved_options(tc, world: int, device_type: str) -> tuple[bool, bool]:
    """(cast_weights_once, compiled) as this run applies them: cast_weights_once null = on unless
    FSDP shards the layer across ranks (its own mixed-precision casts; true there is an error);
    compiled = the layer, norm, merge and soft CE compiled (CUDA and train.compile)."""
    sharded = tc.parallel == "fsdp" and world > 1
    if tc.cast_weights_once and sharded:
        raise BadInput("train.cast_weights_once does not combine with train.parallel: fsdp")
    cast_once = not sharded if tc.cast_weights_once is None else bool(tc.cast_weights_once)
    return cast_once, device_type == "cuda" and tc.compile


def _plan(cfg: Config, d: Dist, world: int) -> Plan:
    """The data plan (shard headers + dataset index only) for `world` data-parallel ranks."""
    if cfg.online.server:  # hidden states streamed from a producer (online/source.py)
        return _online().OnlinePlan(cfg, world, d.rank)
    for name in ("dump", "dataset"):
        if not getattr(cfg.data, name):
            raise BadInput(f"data.{name} is required")
    if not cfg.target.path:
        raise BadInput("target.path is required (its lm_head is the teacher)")
    check_identity(Path(cfg.data.dump), Path(cfg.target.path), "train")  # same model as dumped
    plan = Plan(
        Path(cfg.data.dump),
        Path(cfg.data.dataset),
        cfg.data.max_tokens,
        cfg.data.max_len,
        seed=cfg.train.seed,
        world=world,
        pack_window=cfg.data.pack_window,
        holdout_fraction=cfg.data.holdout_fraction,
        long_samples=cfg.data.long_samples,
    )
    if plan.steps_per_epoch(0) == 0:
        raise BadInput(
            f"{len(plan.samples)} samples make fewer packed batches than ranks ({world}); "
            "lower data.max_tokens or add data"
        )
    return plan


def _online():
    from remote_agent.eagle3.online import source

    return source


def _embed_on_host(cfg: Config, world: int) -> bool:
    """train.embed_on_host as this run applies it (null: on where it can be; true where it
    cannot is an error). Only a frozen embedding can stay on the host: frozen = the drafter's
    hidden size is the target's (checked once the dump's is known: _target_and_drafter)."""
    tc = cfg.train
    # online takes it too: one input path for both modes (on the H100 of 12-07 online with the
    # embedding on the device and offline with it on the host, same bytes in, ended 3.4e-3 apart)
    why = "parallel: fsdp shards the drafter" if tc.parallel == "fsdp" and world > 1 else None
    if tc.embed_on_host and why:
        raise BadInput(f"train.embed_on_host: not with {why}")
    return why is None if tc.embed_on_host is None else bool(tc.embed_on_host)


def _target_and_drafter(cfg: Config, plan: Plan, device, bf16: bool, host_embed: bool = False):
    """Target lm_head (the teacher, on device), vocab mapping, the initialised drafter and,
    with `host_embed` and a frozen embedding, that embedding on the host (the drafter's own is
    then empty: the loader gathers each batch's rows; else None)."""
    tdtype = torch.bfloat16 if bf16 else torch.float32
    lm_head = load_target_tensor(Path(cfg.target.path), cfg.target.lm_head_key, dtype=tdtype)
    embed = load_target_tensor(Path(cfg.target.path), cfg.target.embed_key, dtype=tdtype)
    vocab_size = lm_head.shape[0]
    if lm_head.shape[1] != plan.meta.hidden_size:
        raise BadInput(
            f"target lm_head is [{vocab_size}, {lm_head.shape[1]}] but the dump's hidden size is "
            f"{plan.meta.hidden_size}"
        )
    d2t, t2d, _ = load_vocab(Path(cfg.data.vocab) if cfg.data.vocab else None, vocab_size)
    drafter = build_drafter(cfg, plan.meta, vocab_size, d2t, t2d, embed, lm_head, cfg.train.seed)
    drafter.num_target_layers = plan.meta.num_layers
    host = None
    if not drafter.embed_tokens.weight.requires_grad:
        drafter.embed_tokens.to(tdtype)  # frozen: keep it in the compute dtype
        if host_embed:
            host = drafter.embed_tokens.weight.detach().clone()
            drafter.embed_tokens.weight = torch.nn.Parameter(  # a lookup would fail loudly
                host.new_empty(0, host.shape[1]), requires_grad=False
            )
    elif cfg.train.embed_on_host:
        raise BadInput(
            "train.embed_on_host: the embedding is trained (drafter hidden size differs)"
        )
    drafter.to(device)
    return drafter, lm_head.to(device), f"{d2t.numel()}/{vocab_size}", host


def build_drafter(cfg: Config, meta, vocab_size: int, d2t, t2d, embed, lm_head, seed: int):
    aux_ids = cfg.drafter.aux_layer_ids or list(meta.aux_layer_ids)
    if len(aux_ids) != meta.num_aux:
        raise BadInput(
            f"drafter.aux_layer_ids has {len(aux_ids)} ids but the dump holds {meta.num_aux} aux layers"
        )
    try:
        mcfg = build_config(
            cfg.drafter,
            target_hidden=meta.hidden_size,
            vocab_size=vocab_size,
            draft_vocab_size=d2t.numel(),
            aux_layer_ids=aux_ids,
            target_context=target_context_length(Path(cfg.target.path)),
        )
    except ValueError as exc:
        raise BadInput(f"drafter config / dump capture ids: {exc}") from None
    model = Eagle3Drafter(mcfg)
    g = torch.Generator().manual_seed(seed)
    model.init_weights(cfg.drafter.init_std, g)
    model.set_vocab(d2t, t2d)
    with torch.no_grad():
        if mcfg["hidden_size"] == meta.hidden_size:
            model.embed_tokens.weight.copy_(embed.float())
            if cfg.drafter.init_lm_head_from_target:
                model.lm_head.weight.copy_(lm_head.float()[model.draft_ids()])
    model.capture_layer_ids = list(aux_ids)
    return model


def compile_layer(drafter: Eagle3Drafter, checkpointed: bool) -> None:
    """torch.compile the layer halves and the norm before the draft lm_head. Under per-step
    checkpointing the recompute must meet the graph the forward used: with one dynamic-shape
    graph from the start, a static graph (first shape) and a later dynamic one can never be
    picked differently (pytorch issue 166926). The norm meets a new row count at every TTT
    step (and is recomputed under recompute_elementwise): dynamic from the start as well. The
    TTT merge is compiled by the attention itself (merge._merge_fn)."""
    dynamic = True if checkpointed else None
    drafter.midlayer.pre = torch.compile(drafter.midlayer.pre, dynamic=dynamic)
    drafter.midlayer.pre_parts = torch.compile(drafter.midlayer.pre_parts, dynamic=dynamic)
    drafter.midlayer.post = torch.compile(drafter.midlayer.post, dynamic=dynamic)
    drafter.norm.forward = torch.compile(drafter.norm.forward, dynamic=True)


def _optimizer(params, tc, total_steps: int, device):
    opt = torch.optim.AdamW(
        params,
        lr=tc.lr,
        betas=tuple(tc.betas),
        eps=tc.adam_eps,
        weight_decay=tc.weight_decay,
        fused=device.type == "cuda",
    )
    warmup = tc.warmup_steps if tc.warmup_steps is not None else int(tc.warmup_ratio * total_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(total_steps, warmup, tc.min_lr_ratio))
    return opt, sched


def lr_lambda(total: int, warmup: int, min_ratio: float):
    """Linear warmup to 1, then cosine down to min_ratio at `total` steps."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def _announce(cfg, out_dir, drafter, plan, d, steps, backend, bf16):
    steps_per_epoch, total_steps = steps
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_json(out_dir / "config.json", cfg.to_dict())
    _write_json(out_dir / "model_config.json", drafter.config)
    print(
        f"eagle3 train: {len(plan.samples)} samples, {plan.total_tokens} tokens, "
        f"{steps_per_epoch} steps/epoch x {plan.world} rank(s), {total_steps} steps; "
        + (f"each split over {d.world} ranks (sequence parallel); " if plan.world < d.world else "")
        + f"attention {backend}; {'bf16' if bf16 else 'fp32'}"
        + (f"; {plan.not_dumped} dataset record(s) not in the dump" if plan.not_dumped else "")
        + (f"; {plan.long_count} long sample(s) trained alone" if plan.long_count else ""),
        flush=True,
    )


def _write_json(path: Path, obj: Any) -> None:
    write_bytes_atomic(path, (json.dumps(obj, indent=1, default=str) + "\n").encode())


def _lm_head_on_host(tc, device_type: str, sp: bool) -> bool:
    """train.lm_head_on_host as this run applies it: null = on with CUDA, off under sequence
    parallelism (every rank's teacher of its rows: kept on the device)."""
    if tc.lm_head_on_host is None:
        return device_type == "cuda" and not sp
    return bool(tc.lm_head_on_host)


def _latest(ckpt_dir: Path) -> str | None:
    latest = ckpt.latest(ckpt_dir)
    return str(latest) if latest else None


def _grad_norm(params) -> torch.Tensor:
    grads = [p.grad.detach().float().norm() for p in params if p.grad is not None]
    return torch.stack(grads).norm() if grads else torch.zeros(())
