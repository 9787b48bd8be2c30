"""The training loop: read it top to bottom.

setup (distributed, device, data plan, target lm_head + embedding, vocab mapping, drafter,
optimizer, schedule, resume) -> for each packed batch: teacher from the stored final hidden
states, TTT unroll, weighted soft CE per step, backward, clip, AdamW step -> metrics lines and
atomic checkpoints. Runs alone or under torchrun (DDP; FSDP2 with `train.parallel: fsdp`).
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from remote_agent.eagle3.distributed import Dist
from remote_agent.eagle3.drafter import checkpoint as ckpt
from remote_agent.eagle3.drafter.config import Config
from remote_agent.eagle3.drafter.context import target_context_length
from remote_agent.eagle3.drafter.data import Loader, Plan, load_vocab, step_targets
from remote_agent.eagle3.drafter.loss import load_target_tensor, soft_ce, teacher
from remote_agent.eagle3.drafter.metrics_breakdown import Breakdown
from remote_agent.eagle3.drafter.model import Eagle3Drafter, build_config
from remote_agent.eagle3.drafter.simulate import chain_acceptance, chain_depth
from remote_agent.eagle3.drafter.ttt_attention import TTTAttention, pick_backend
from remote_agent.eagle3.errors import BadInput, Failed
from remote_agent.eagle3.extraction.identity import check_identity
from remote_agent.eagle3.progress import emit


def cpu_threads() -> None:
    """CPU runs are tiny models (tests, demo): one thread per process unless OMP_NUM_THREADS is
    set; oversubscribed threads on a shared 2-core box are slower by an order of magnitude."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)


def lr_lambda(total: int, warmup: int, min_ratio: float):
    """Linear warmup to 1, then cosine down to min_ratio at `total` steps."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


class TTTStep(nn.Module):
    """The wrapped module (DDP/FSDP): TTT unroll + per-step soft CE, all inside forward."""

    def __init__(self, drafter: Eagle3Drafter, steps: int, loss_chunk: int) -> None:
        super().__init__()
        self.drafter, self.steps, self.loss_chunk = drafter, steps, loss_chunk

    def forward(self, aux, ids, positions, attention, p, weights, plan: RowPlan):
        """Per TTT step: (weighted CE sum, draft argmax per position; -1 where not computed)."""
        d = self.drafter
        outs = d.ttt(aux, ids, positions, attention, self.steps, plan.rows)
        n = aux.shape[1]
        losses, args = [], []
        w = None
        for k, out in enumerate(outs):
            pos, idx, m = plan.loss_rows[k], plan.out_index[k], n - 1 - k
            # position t uses the teacher of t+1+k
            if pos is None:  # every position: plain slices, no copies
                h, pk, wk = d.norm(out[0, :m]), p[1 + k : 1 + k + m], weights[k]
            else:
                h = d.norm(out[0].index_select(0, idx))
                pk, wk = p.index_select(0, pos + 1 + k), weights[k][pos]
            if w is None:  # cast the fp32 master once per step, not once per TTT step
                w = d.lm_head.weight.to(h.dtype)
            loss_k, arg_k = soft_ce(h, w, pk, wk, self.loss_chunk)
            losses.append(loss_k)
            if pos is not None:
                arg_k = torch.full((m,), -1, device=arg_k.device).index_put((pos,), arg_k)
            args.append(arg_k)
        return losses, args


@dataclass
class RowPlan:
    """Which positions each TTT step computes (see ttt_attention: query rows).

    rows: positions steps >= 1 run on (None = all). loss_rows[k]: positions whose draft logits
    step k needs (loss weight > 0, or counted by the simulated acceptance; None = all of its
    n-1-k); out_index[k]: their rows in step k's output. Everything else has zero weight, so the
    loss, its gradients and the metrics equal those of the full computation.
    """

    rows: torch.Tensor | None
    loss_rows: list[torch.Tensor | None]
    out_index: list[torch.Tensor | None]

    MIN_SAVING = 0.1  # run steps >= 1 on a subset only when it drops at least this share

    @classmethod
    def build(
        cls, weights: list[torch.Tensor], sim_valid: torch.Tensor, depth: int, skip: bool
    ) -> RowPlan:
        n = sim_valid.numel()
        if not skip:
            return cls(None, [None] * len(weights), [None] * len(weights))
        need = [w > 0 for w in weights]
        for k in range(depth):
            need[k] |= sim_valid[: need[k].numel()]
        later = torch.zeros(n, dtype=torch.bool, device=sim_valid.device)
        for m in need[1:]:
            later[: m.numel()] |= m
        *counts, n_later = torch.stack([m.sum() for m in need] + [later.sum()]).tolist()  # 1 sync
        loss_rows = [
            None if c == m.numel() else m.nonzero().flatten()
            for c, m in zip(counts, need, strict=True)
        ]
        if n_later > (1 - cls.MIN_SAVING) * n:
            return cls(None, loss_rows, loss_rows)
        rows = later.nonzero().flatten()
        if rows.numel() == 0:
            rows = rows.new_zeros(1)  # keep one row: every parameter still gets a gradient
        # a step whose every position is needed has them first in `rows` (rows is sorted)
        out_index = [loss_rows[0]] + [
            None if r is None else torch.searchsorted(rows, r) for r in loss_rows[1:]
        ]
        return cls(rows, loss_rows, out_index)


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


@dataclass
class StepContext:
    """Everything one optimisation step needs besides the batch (shared with bench_train)."""

    model: nn.Module  # TTTStep, possibly DDP/FSDP-wrapped
    lm_head: torch.Tensor  # target lm_head [V, H]
    draft_ids: torch.Tensor  # target ids of the draft vocabulary
    t2d: torch.Tensor
    steps: int
    step_w: list[float]
    scale: float
    backend: str
    autocast: Any
    bf16: bool
    dist: Dist
    tc: Any  # TrainSection


@dataclass
class StepOut:
    losses: list[torch.Tensor]  # per TTT step: weighted CE sum (this rank)
    args: list[torch.Tensor]  # per TTT step: draft argmax (draft ids)
    weights: list[torch.Tensor]
    counts: torch.Tensor  # per TTT step: valid positions over all ranks
    targets: Any  # StepTargets
    teacher: Any  # Teacher
    sim_valid: torch.Tensor  # [L] bool: positions counted by the simulated acceptance
    plan: RowPlan


def forward_backward(c: StepContext, b, step: int) -> StepOut:
    """Teacher, TTT unroll, per-step soft CE normalised by valid tokens, backward."""
    tc, n = c.tc, b.input_ids.shape[1]
    st = step_targets(b, c.steps)
    tch = teacher(b.final[0], c.lm_head, c.draft_ids, c.t2d, tc.teacher_chunk, tc.teacher_fp32)
    # loss weight of step k at t: supervised, inside the document, teacher argmax drafted
    weights = []
    for k in range(c.steps):
        w = st.weight[k][0].clone()
        w[: n - 1 - k] &= tch.in_draft[1 + k :]
        weights.append(w[: n - 1 - k].float())
    counts = c.dist.all_reduce_sum(torch.stack([w.sum() for w in weights]))
    depth = min(chain_depth(tc.sim_steps, tc.sim_topk, tc.sim_draft_tokens), c.steps)
    sim_valid = torch.zeros(n, dtype=torch.bool, device=b.input_ids.device)
    if depth:  # chains of `depth` drafts inside the document, starting on a supervised token
        m = max(n - depth, 0)
        sim_valid[:m] = st.valid[depth - 1][0, :m] & b.loss_mask[0, 2 : 2 + m]
    plan = RowPlan.build(weights, sim_valid, depth, tc.skip_idle_rows)
    aux = b.aux if c.bf16 else b.aux.float()
    if tc.noise_std > 0:  # relative to each token's RMS; seeded by (seed, step, rank)
        g = torch.Generator(device=aux.device).manual_seed(
            tc.seed * 1_000_003 + step * 1009 + c.dist.rank
        )
        rms = aux.float().pow(2).mean(-1, keepdim=True).sqrt()
        noise = torch.randn(aux.shape, generator=g, device=aux.device) * rms * tc.noise_std
        aux = (aux.float() + noise).to(aux.dtype)
    attention = TTTAttention(b.doc, c.scale, c.backend, rows=plan.rows)
    with c.autocast:
        losses, args = c.model(aux, st.ids, b.positions, attention, tch.p, weights, plan)
    # normalised by the valid tokens of all ranks; DDP averages gradients over ranks
    world = c.dist.world
    total = sum(c.step_w[k] * losses[k] * world / counts[k].clamp(min=1) for k in range(c.steps))
    total.backward()
    return StepOut(losses, args, weights, counts, st, tch, sim_valid, plan)


def train(cfg: Config) -> dict[str, Any]:
    tc = cfg.train
    # ---- devices and ranks -----------------------------------------------------------------
    want = tc.device if tc.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if want == "cuda" and not torch.cuda.is_available():
        raise BadInput("train.device is cuda but no CUDA device is visible")
    d = Dist.from_env(want)  # under torchrun: cuda:LOCAL_RANK (made current) and the group
    device = d.device
    if device.type == "cpu":
        cpu_threads()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    bf16 = tc.precision == "bf16" or (tc.precision == "auto" and device.type == "cuda")
    backend = pick_backend(tc.attention, device)
    out_dir = Path(tc.out_dir)
    ckpt_dir = out_dir / "checkpoints"

    # ---- data plan (shard headers + dataset index only) -------------------------------------
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
        seed=tc.seed,
        world=d.world,
        pack_window=cfg.data.pack_window,
        holdout_fraction=cfg.data.holdout_fraction,
    )
    steps_per_epoch = plan.steps_per_epoch(0)
    if steps_per_epoch == 0:
        raise BadInput(
            f"{len(plan.samples)} samples make fewer packed batches than ranks ({d.world}); "
            "lower data.max_tokens or add data"
        )
    total_steps = tc.max_steps or tc.epochs * steps_per_epoch
    # with max_steps, allow one more epoch: packing varies a little from epoch to epoch
    epochs = max(tc.epochs, math.ceil(total_steps / steps_per_epoch) + (1 if tc.max_steps else 0))

    # ---- target tensors, vocab mapping, drafter ---------------------------------------------
    tdtype = torch.bfloat16 if bf16 else torch.float32
    lm_head = load_target_tensor(Path(cfg.target.path), cfg.target.lm_head_key, dtype=tdtype)
    embed = load_target_tensor(Path(cfg.target.path), cfg.target.embed_key, dtype=tdtype)
    vocab_size = lm_head.shape[0]
    if lm_head.shape[1] != plan.meta.hidden_size:
        raise BadInput(
            f"target lm_head is [{vocab_size}, {lm_head.shape[1]}] but the dump's hidden size is "
            f"{plan.meta.hidden_size}"
        )
    d2t, t2d, vocab_meta = load_vocab(Path(cfg.data.vocab) if cfg.data.vocab else None, vocab_size)
    drafter = build_drafter(cfg, plan.meta, vocab_size, d2t, t2d, embed, lm_head, tc.seed)
    drafter.num_target_layers = plan.meta.num_layers
    if not drafter.embed_tokens.weight.requires_grad:
        drafter.embed_tokens.to(tdtype)  # frozen: keep it in the compute dtype
    drafter.to(device)
    lm_head = lm_head.to(device)
    del embed
    draft_ids = drafter.draft_ids()
    t2d_dev = drafter.t2d

    # ---- resume: weights now, optimizer/scheduler after wrapping -----------------------------
    global_step, start_epoch, start_step = 0, 0, 0
    resume_from, state = None, None
    if tc.resume not in ("auto", "never"):
        resume_from = Path(tc.resume)
        if not (resume_from / "state.pt").exists():
            raise BadInput(f"train.resume: {resume_from} is not a checkpoint directory")
    elif tc.resume == "auto":
        resume_from = ckpt.latest(ckpt_dir)
    if resume_from is not None:
        state = ckpt.load(resume_from)
        if state["model_config"] != drafter.config:
            raise BadInput(f"{resume_from}: the checkpoint's drafter config differs from this one")
        saved = (state["world"], state.get("parallel"), state["data_key"])
        now = (d.world, tc.parallel, _data_key(cfg))
        if saved != now:
            raise BadInput(
                f"{resume_from}: saved with (world, parallel, data) {saved}; now {now} "
                "(resuming needs the same data, packing, ranks and parallelism)"
            )
        # the frozen shared embedding is the only thing a checkpoint leaves out
        missing, unexpected = drafter.load_state_dict(state["model"], strict=False)
        frozen = {n for n, p in drafter.named_parameters() if not p.requires_grad}
        if set(missing) != frozen or unexpected:
            raise Failed(
                f"{resume_from}: checkpoint tensors do not match the drafter: missing "
                f"{sorted(set(missing) - frozen)}, unexpected {sorted(unexpected)}"
            )
        global_step = state["global_step"]
        start_epoch, start_step = state["position"]["epoch"], state["position"]["step"]

    # ---- wrap for data parallel, then the optimizer over the wrapped parameters --------------
    step_module = TTTStep(drafter, tc.ttt_steps, tc.loss_chunk)
    if device.type == "cuda" and tc.compile:
        layer = drafter.midlayer
        layer.pre = torch.compile(layer.pre)
        layer.post = torch.compile(layer.post)
    model: nn.Module = step_module
    if d.world > 1 and tc.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(step_module, device_ids=[device.index] if device.type == "cuda" else None)
    elif d.world > 1 and tc.parallel == "fsdp":
        model = _fsdp(step_module, bf16)  # parameters become sharded DTensors
    params = [p for p in model.parameters() if p.requires_grad]
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
    if state is not None:
        _load_optimizer(model, opt, state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        ckpt.set_rng_state(state["rng"])
    n_trainable = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    if d.world > 1 and tc.parallel == "fsdp":
        n_trainable = sum(
            p.numel() for p in step_module.parameters() if p.requires_grad
        )  # global sizes (DTensor.numel is the full size)

    if d.main:
        out_dir.mkdir(parents=True, exist_ok=True)
        _write_json(out_dir / "config.json", cfg.to_dict())
        _write_json(out_dir / "model_config.json", drafter.config)
        print(
            f"eagle3 train: {len(plan.samples)} samples, {plan.total_tokens} tokens, "
            f"{steps_per_epoch} steps/epoch x {d.world} rank(s), {total_steps} steps; "
            f"{n_trainable / 1e6:.1f} M trainable params; attention {backend}; "
            f"{'bf16' if bf16 else 'fp32'}; vocab {d2t.numel()}/{vocab_size}"
            + (f"; {plan.not_dumped} dataset record(s) not in the dump" if plan.not_dumped else "")
            + (f"; resumed from {resume_from.name} at step {global_step}" if resume_from else ""),
            flush=True,
        )

    # ---- the loop ---------------------------------------------------------------------------
    steps_k = tc.ttt_steps
    step_w = [tc.step_weight**k for k in range(steps_k)]
    depth = min(chain_depth(tc.sim_steps, tc.sim_topk, tc.sim_draft_tokens), steps_k)
    scale = drafter.midlayer.self_attn.scale
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if bf16 and device.type == "cuda"
        else (torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext())
    )
    step_ctx = StepContext(
        model, lm_head, draft_ids, t2d_dev, steps_k, step_w, scale, backend, autocast, bf16, d, tc
    )
    loader = Loader(
        plan,
        d.rank,
        start_epoch,
        start_step,
        epochs,
        prefetch=cfg.data.prefetch,
        pin=cfg.data.pin_memory and device.type == "cuda",
    )
    window = _Window(step_w, depth)
    last_loss: float | None = None
    last_rec: dict[str, Any] = {}
    stopped = False
    t_window = time.perf_counter()
    wait_mark = 0.0
    epoch = start_epoch
    try:
        for epoch, step_in_epoch, host_batch in loader:
            if global_step >= total_steps:
                break
            b = host_batch.to(device)
            out = forward_backward(step_ctx, b, global_step)
            grad_norm = (
                torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
                if tc.grad_clip > 0
                else _grad_norm(params)
            )
            lr_now = sched.get_last_lr()[0]
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            global_step += 1

            with torch.no_grad():
                window.add(out, b, draft_ids, grad_norm, lr_now)
            if global_step % tc.log_every == 0 or global_step == total_steps:
                now = time.perf_counter()
                rec = window.emit(d, global_step, epoch, now - t_window, loader.wait_s - wait_mark)
                t_window, wait_mark = now, loader.wait_s
                last_loss, last_rec = rec["loss"], rec
                if d.main:
                    with open(out_dir / "metrics.jsonl", "a") as f:
                        f.write(json.dumps(rec) + "\n")
            position = _next_position(epoch, step_in_epoch, plan, d.world)
            stop_here = tc.stop_after_step is not None and global_step == tc.stop_after_step
            if (tc.save_every and global_step % tc.save_every == 0) or stop_here:
                _save(model, drafter, opt, sched, d, ckpt_dir, global_step, position, cfg, tc)
            if stop_here:
                stopped = True
                break
    finally:
        loader.close()
    if not stopped and global_step > 0:
        final_dir = ckpt_dir / f"step-{global_step:08d}"
        if not final_dir.exists():
            position = {"epoch": epoch + 1, "step": 0}
            _save(model, drafter, opt, sched, d, ckpt_dir, global_step, position, cfg, tc)
    d.close()
    result = {
        "steps": global_step,
        "stopped_early": stopped,
        "loss": last_loss,
        "checkpoint": str(ckpt.latest(ckpt_dir)) if ckpt.latest(ckpt_dir) else None,
        "out_dir": str(out_dir),
        "world": d.world,
        "sim_accept_len": last_rec.get("sim_accept_len"),
        "tokens_per_s": last_rec.get("tokens_per_s"),
    }
    return result


# -------------------------------------------------------------------------------------------
# helpers kept out of the loop's way


def _data_key(cfg: Config) -> dict[str, Any]:
    """What must not change across a resume for the data position to mean the same batches."""
    return {
        "dump": os.path.abspath(cfg.data.dump),
        "dataset": os.path.abspath(cfg.data.dataset),
        "max_tokens": cfg.data.max_tokens,
        "max_len": cfg.data.max_len,
        "pack_window": cfg.data.pack_window,
        "holdout_fraction": cfg.data.holdout_fraction,
        "seed": cfg.train.seed,
    }


def _next_position(epoch: int, step: int, plan: Plan, world: int) -> dict[str, int]:
    if step + 1 >= len(plan.epoch_batches(epoch)) // world:
        return {"epoch": epoch + 1, "step": 0}
    return {"epoch": epoch, "step": step + 1}


def _grad_norm(params) -> torch.Tensor:
    grads = [p.grad.detach().float().norm() for p in params if p.grad is not None]
    return torch.stack(grads).norm() if grads else torch.zeros(())


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def _fsdp(module: nn.Module, bf16: bool) -> nn.Module:
    """FSDP2 over the whole TTT module: parameters are gathered once per step (the layer runs
    7 times), while gradients, fp32 masters and AdamW states stay sharded across ranks."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kw = {}
    if bf16:
        kw["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    fully_shard(module, **kw)
    return module


def _full_state(model: nn.Module, drafter: Eagle3Drafter, opt) -> tuple[dict, dict]:
    """Full (unsharded) model and optimizer state on CPU, whatever the wrapping."""
    if _is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        msd, osd = get_state_dict(model, opt, options=opts)
        msd = {k.removeprefix("drafter."): v for k, v in msd.items()}
        return msd, osd
    return drafter.state_dict(), opt.state_dict()


def _is_sharded(model: nn.Module) -> bool:
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def _load_optimizer(model: nn.Module, opt, osd: dict) -> None:
    if _is_sharded(model):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        set_optimizer_state_dict(model, opt, osd, options=StateDictOptions(full_state_dict=True))
    else:
        opt.load_state_dict(osd)


def _save(
    model, drafter, opt, sched, d: Dist, root: Path, step: int, position, cfg: Config, tc
) -> None:
    msd, osd = _full_state(model, drafter, opt)
    if d.main:
        frozen = {n for n, p in drafter.named_parameters() if not p.requires_grad}
        state = {
            "model": {k: v.detach().cpu() for k, v in msd.items() if k not in frozen},
            "optimizer": osd,
            "scheduler": sched.state_dict(),
            "rng": ckpt.rng_state(),
            "position": position,
            "global_step": step,
            "world": d.world,
            "parallel": tc.parallel,
            "model_config": drafter.config,
            "capture_layer_ids": drafter.capture_layer_ids,
            "num_target_layers": drafter.num_target_layers,
            "target_context_length": target_context_length(Path(cfg.target.path)),
            "data_key": _data_key(cfg),
            "vocab": {"d2t": drafter.d2t.cpu(), "t2d": drafter.t2d.cpu()},
            "train_config": cfg.to_dict(),
        }
        meta = {"step": step, "position": position, "model_config": drafter.config}
        ckpt.save(root, step, state, meta)
        ckpt.prune(root, tc.keep_last, tc.keep_every)
    d.barrier()


class _Window:
    """Metric sums over a log window (kept on device; one sync per emitted line)."""

    def __init__(self, step_w: list[float], depth: int) -> None:
        self.step_w, self.steps, self.depth = step_w, len(step_w), depth
        self.reset()

    def reset(self) -> None:
        self.loss = [0.0] * self.steps
        self.count = [0.0] * self.steps
        self.correct = [0.0] * self.steps
        self.total = 0.0
        self.sim_sum = 0.0
        self.sim_n = 0
        self.tokens = 0
        self.n = 0
        self.grad_norm = 0.0
        self.lr = 0.0
        self._dev: list[torch.Tensor] = []
        self.breakdown = Breakdown(self.steps, self.depth)  # acc_k_all, sim per source

    def add(self, out: StepOut, b, draft_ids, grad_norm, lr) -> None:
        losses, args, weights, counts = out.losses, out.args, out.weights, out.counts
        tch = out.teacher
        n = b.input_ids.shape[1]
        # target ids; -1 (never a teacher argmax) where a row was not computed (zero weight)
        preds = [torch.where(a >= 0, draft_ids[a.clamp(min=0)], -1) for a in args]
        correct = []
        for k in range(self.steps):
            rows = n - 1 - k
            hit = (preds[k] == tch.argmax[1 + k : 1 + k + rows]).float()
            correct.append((hit * weights[k]).sum())
        self._dev.append(torch.stack([torch.stack(losses).detach(), torch.stack(correct)]))
        self.breakdown.add(out, b, preds, b.sources)
        self.count = [c + float(x) for c, x in zip(self.count, counts.tolist(), strict=True)]
        if self.depth:
            rows = n - self.depth
            match = [preds[k][:rows] == tch.argmax[1 + k : 1 + k + rows] for k in range(self.depth)]
            s, c, _ = chain_acceptance(match, out.sim_valid[:rows], self.depth)
            self.sim_sum += s
            self.sim_n += c
        self.tokens += b.tokens
        self.n += 1
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
            grad_norm = grad_norm.full_tensor()
        self.grad_norm = float(grad_norm)
        self.lr = lr

    def emit(self, d: Dist, step: int, epoch: int, elapsed: float, wait: float) -> dict[str, Any]:
        sums = torch.stack(self._dev).sum(0).cpu()  # [2, steps]
        red = torch.cat(
            [sums.flatten(), torch.tensor([self.sim_sum, self.sim_n, self.tokens, wait, elapsed])]
        ).double()
        red = d.all_reduce_sum(red.to(self._dev[0].device)).cpu()
        k = self.steps
        loss_sum, correct = red[:k], red[k : 2 * k]
        sim_sum, sim_n, tokens, wait_all, elapsed_all = red[2 * k :].tolist()
        count = torch.tensor(self.count, dtype=torch.float64)  # already global
        loss_k = (loss_sum / count.clamp(min=1)).tolist()
        acc_k = (correct / count.clamp(min=1)).tolist()
        rec = {
            "step": step,
            "epoch": epoch,
            "loss": sum(w * lk for w, lk in zip(self.step_w, loss_k, strict=True)),  # exact
            "loss_k": loss_k,
            "acc_k": [round(x, 5) for x in acc_k],
            "sim_accept_len": round(sim_sum / sim_n, 4) if sim_n else None,
            "tokens_per_s": round(tokens / max(elapsed_all / d.world, 1e-9), 1),
            "data_wait": round(wait_all / max(elapsed_all, 1e-9), 4),
            "lr": self.lr,
            "grad_norm": round(self.grad_norm, 5),
        }
        rec.update(self.breakdown.emit(d, correct))
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            rec["peak_mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if d.main:
            emit("metrics", **rec)
        self.reset()
        return rec
