"""Teacher distribution and the soft cross-entropy, both chunked.

Teacher: the target's next-token distribution at position t is softmax(lm_head(final_t)), where
final_t is the stored post-norm final hidden state and lm_head the target's own matrix (read
from its safetensors by key). It is restricted to the draft vocabulary and renormalised; a
position whose full-vocabulary argmax is not in the draft vocabulary is dropped (the draft can
never propose that token). Full-vocabulary logits exist only `chunk` rows at a time.

Soft CE: loss_t = -sum_v p_t(v) log softmax(z_t)(v) with z = norm(h) @ W_draft^T, computed per
row chunk in fp32. Fused with the draft lm_head (Liger / Cut Cross-Entropy style): the forward
also computes each chunk's logit gradient ((softmax - p) * weight * scale, the scale in fp32),
the input gradient and the weight gradient (summed in fp32 over the TTT steps that share the
head: HeadGrad), so nothing of size [N, Vd] is kept, the teacher's p is not needed in backward
(the trainer frees it before backward), and backward only hands the kept gradients on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from remote_agent.eagle3.errors import BadInput


def find_tensor_file(model_dir: Path, key: str) -> Path:
    """The safetensors file of `model_dir` that holds `key` (index first, then headers)."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        if key in weight_map:
            return model_dir / weight_map[key]
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            names = set(h.keys())
        if key in names:
            return f
    near = []
    for f in files[:4]:
        with safe_open(str(f), framework="pt") as h:
            names = list(h.keys())
        near += [k for k in names if "lm_head" in k or "embed" in k]
    raise BadInput(
        f"{model_dir}: no tensor '{key}' in {len(files)} safetensors file(s)"
        + (f"; candidates: {', '.join(sorted(near)[:6])}" if near else "")
        + " (set target.lm_head_key / target.embed_key)"
    )


def load_target_tensor(model_dir: Path, key: str, device="cpu", dtype=None) -> torch.Tensor:
    from safetensors import safe_open

    path = find_tensor_file(model_dir, key)
    with safe_open(str(path), framework="pt", device=str(device)) as h:
        t = h.get_tensor(key)
    return t.to(dtype) if dtype is not None else t


@dataclass
class Teacher:
    # [N, Vd] fp32 target distribution over the draft vocabulary (renormalised); None once the
    # loss forward is done (the fused soft CE needs it in forward only)
    p: torch.Tensor | None
    argmax: torch.Tensor  # [N] long, full-vocabulary argmax (target ids)
    in_draft: torch.Tensor  # [N] bool, argmax is in the draft vocabulary


@torch.no_grad()
def teacher(
    final: torch.Tensor,
    lm_head: torch.Tensor,
    draft_ids: torch.Tensor,
    t2d: torch.Tensor,
    chunk: int = 1024,
    fp32: bool = False,
    keep_p: bool = True,
) -> Teacher:
    """final [N, H], lm_head [V, H] (target), draft_ids [Vd] target ids of the draft vocab.
    keep_p False: the argmax and in_draft only (p None; a caller that needs p for some rows
    makes it with teacher_probs: long sequences in shards, shards.py)."""
    n = final.shape[0]
    p = (
        torch.empty(n, draft_ids.numel(), dtype=torch.float32, device=final.device)
        if keep_p
        else None
    )
    arg = torch.empty(n, dtype=torch.long, device=final.device)
    w = lm_head.float() if fp32 else lm_head
    for lo in range(0, n, chunk):
        f = final[lo : lo + chunk].to(w.dtype)
        logits = f @ w.T  # [chunk, V]; never the whole batch at once
        arg[lo : lo + chunk] = logits.argmax(-1)
        if p is not None:
            p[lo : lo + chunk] = torch.softmax(logits.index_select(1, draft_ids).float(), dim=-1)
        del logits
    return Teacher(p, arg, t2d[arg])


@torch.no_grad()
def teacher_probs(
    final: torch.Tensor, draft_rows: torch.Tensor, chunk: int = 1024, fp32: bool = False
) -> torch.Tensor:
    """[N, Vd] fp32: teacher's p of `final` rows from the draft vocabulary's rows of the target
    lm_head alone (draft_rows = lm_head[draft_ids]): the draft columns of the full logits, as
    matmul results of the same rows and vectors (a kernel may sum in another order: rounding)."""
    w = draft_rows.float() if fp32 else draft_rows
    p = torch.empty(final.shape[0], w.shape[0], dtype=torch.float32, device=final.device)
    for lo in range(0, final.shape[0], chunk):
        p[lo : lo + chunk] = torch.softmax((final[lo : lo + chunk].to(w.dtype) @ w.T).float(), -1)
    return p


def _chunk_forward(zl: torch.Tensor, pc: torch.Tensor, rw: torch.Tensor, scale: torch.Tensor):
    """One chunk's (weighted CE sum, argmax, scale x d loss / d z in zl's dtype); zl: the
    chunk's logits as the matmul gave them (compute dtype), widened to fp32 here. The scale
    (the step's loss weight / valid count) multiplies in fp32 before the one rounding."""
    acc = torch.promote_types(zl.dtype, torch.float32)  # fp32 (fp64 in gradient checks)
    z, pc, rw = zl.to(acc), pc.to(acc), rw.to(acc)
    lse = torch.logsumexp(z, dim=-1)
    # -sum p log softmax(z) = lse - sum p z   (p sums to 1)
    loss = ((lse - (pc * z).sum(-1)) * rw).sum()
    grad = (_grad_logits(z, lse, pc, rw) * scale.to(acc)).to(zl.dtype)
    return loss, z.argmax(-1), grad


_COMPILED: dict[str, object] = {}


def _chunk_math(compiled: bool):
    """The chunk's fp32 math: eager, or (train.compile_loss) one fused compiled kernel set
    instead of a dozen passes over [chunk, Vd] fp32 tensors. A compile failure (not an OOM)
    falls back to eager once, with a warning."""
    if not compiled or "failed" in _COMPILED:
        return _chunk_forward
    if "fn" not in _COMPILED:
        _COMPILED["fn"] = torch.compile(_chunk_forward, dynamic=True)
    fn = _COMPILED["fn"]

    def guarded(*args):
        try:
            return fn(*args)  # type: ignore[operator]
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 (any compile failure: eager is the same math)
            import warnings

            _COMPILED["failed"] = f"{type(exc).__name__}: {exc}"[:300]
            warnings.warn(
                f"compile_loss: soft CE not compiled, eager from now: {exc}", stacklevel=2
            )
            return _chunk_forward(*args)

    return guarded


_ADDMM_FP32: dict[str, bool] = {}


def mm_into(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """total += a @ b with total fp32 and a, b in the compute dtype, accumulated in fp32 by the
    matmul itself where the device can (CUDA cuBLAS with an fp32 output, beta = 1: Megatron's
    gradient-accumulation fusion; no [Vd, H] bf16 product, no rounding of it); on the CPU the
    inputs widened (the same products); a CUDA torch without it: the product in the compute
    dtype, added in place (memory.add_into)."""
    if a.dtype == total.dtype:
        total.addmm_(a, b)
        return
    if not total.is_cuda:  # CPU (tests, demo): the same fp32 products, widened first
        total.addmm_(a.to(total.dtype), b.to(total.dtype))
    elif _addmm_fp32_works(total.device):
        torch.addmm(total, a, b, out_dtype=total.dtype, out=total)
    else:
        from remote_agent.eagle3.drafter.model.memory import add_into

        add_into(total, a @ b)


def _addmm_fp32_works(device) -> bool:
    """Once per process: torch's addmm with an fp32 output from bf16 inputs exists here and
    accumulates (1 + a @ b on a small case), else the fallback."""
    if "ok" not in _ADDMM_FP32:
        try:
            g = torch.Generator(device=device).manual_seed(0)
            a = torch.randn(64, 32, device=device, generator=g).to(torch.bfloat16)
            b = torch.randn(32, 48, device=device, generator=g).to(torch.bfloat16)
            c = torch.ones(64, 48, device=device)
            torch.addmm(c, a, b, out_dtype=torch.float32, out=c)
            ref = 1 + a.double() @ b.double()
            _ADDMM_FP32["ok"] = bool(torch.allclose(c.double(), ref, rtol=1e-5, atol=1e-4))
        except (RuntimeError, TypeError):
            _ADDMM_FP32["ok"] = False
    return _ADDMM_FP32["ok"]


class HeadGrad:
    """The draft lm_head for one unroll of `uses` soft CEs: its copy in the compute dtype, made
    once and shared (no copy per TTT step), and the fp32 sum of its gradient over the uses,
    accumulated chunk by chunk in the forward (mm_into) and handed to the master by the last
    use's backward (its AccumulateGrad: DDP/FSDP hooks fire as usual), like the layer
    matrices' memory.GradSum. One bf16 rounding per chunk product at most, none per step."""

    def __init__(self, master: torch.Tensor, dtype: torch.dtype, uses: int) -> None:
        with torch.no_grad():
            self.low: torch.Tensor | None = master.detach().to(dtype)
        self.master_dtype, self.uses, self.seen, self.forwards = master.dtype, uses, 0, 0
        acc = torch.promote_types(dtype, torch.float32)
        self.total = torch.zeros(master.shape, dtype=acc, device=master.device)

    def accumulate(self, g: torch.Tensor, h: torch.Tensor) -> None:
        if self.total is None:
            raise RuntimeError("shared lm_head: used after its gradient was handed over")
        mm_into(self.total, g.T, h)

    def weight(self) -> torch.Tensor:
        if self.low is None:
            raise RuntimeError("shared lm_head: more forward calls than uses")
        return self.low

    def forward_done(self) -> None:
        """After a use's forward: the last one drops the compute-dtype copy (backward only hands
        the fp32 sum on), so it is not held through backward (0.43 GiB at the Kimi shape)."""
        self.forwards += 1
        if self.forwards >= self.uses:
            self.low = None

    def hand_over(self, grad_out: torch.Tensor) -> torch.Tensor | None:
        """The master's gradient at the last use's backward (None before it). The sum was made
        for an upstream gradient of one (the loss terms are summed into the objective); with
        one use any upstream gradient scales it."""
        if self.uses == 1:  # kept: a retained graph may run backward again
            assert self.total is not None
            return (self.total * grad_out.to(self.total.dtype)).to(self.master_dtype)
        # the sum assumes one from every use: checked on the device, without a host sync
        torch._assert_async(grad_out == 1, "shared lm_head: upstream gradient must be 1")  # pyright: ignore[reportPrivateImportUsage]
        self.seen += 1
        if self.seen < self.uses:
            return None
        total, self.total = self.total, None
        if total is None:
            raise RuntimeError("shared lm_head: more backward calls than uses")
        return total.to(self.master_dtype)

    def unfinished(self) -> bool:
        return 0 < self.seen < self.uses


class _SoftCE(torch.autograd.Function):
    """Fused draft lm_head + soft CE (Liger / Cut Cross-Entropy style): the forward computes,
    chunk by chunk, the logits, the loss, the argmax, the logit gradient (scaled in fp32), the
    input gradient (one matmul) and the weight gradient into the fp32 sum (one matmul), so
    nothing of size [N, Vd] outlives its chunk, p is not needed in backward, and the FLOPs
    are those of forward + backward (three matmuls per chunk). Backward returns the kept input
    gradient (times the upstream gradient: exactly one in training) and the weight sum."""

    @staticmethod
    def forward(ctx, h, weight, p, row_weight, scale, head: HeadGrad, chunk: int, compiled: bool):
        with torch.autocast(h.device.type, enabled=False):  # every dtype here is explicit
            w = head.weight()
            n = h.shape[0]
            acc = torch.promote_types(h.dtype, torch.float32)
            grad_h = torch.empty_like(h)
            total = torch.zeros((), dtype=acc, device=h.device)
            arg = torch.empty(n, dtype=torch.long, device=h.device)
            math = _chunk_math(compiled)
            for lo in range(0, n, chunk):
                hc = h[lo : lo + chunk]
                zl = hc @ w.T
                loss, arg_c, g = math(zl, p[lo : lo + chunk], row_weight[lo : lo + chunk], scale)
                total += loss
                arg[lo : lo + chunk] = arg_c
                grad_h[lo : lo + chunk] = g @ w
                head.accumulate(g, hc)
            del w
            head.forward_done()
        ctx.save_for_backward(grad_h)
        ctx.head = head
        ctx.mark_non_differentiable(arg)
        return total * scale.to(acc), total, arg

    @staticmethod
    def backward(ctx, grad_scaled, _grad_total, _grad_arg):
        (grad_h,) = ctx.saved_tensors
        # times the fp32 upstream gradient (one in training: unchanged), rounded once
        g_h = grad_h * grad_scaled
        return g_h, ctx.head.hand_over(grad_scaled), None, None, None, None, None, None


def _grad_logits(z, lse, p, rw):
    """d loss / d z for one chunk: (softmax(z) - p) * row weight."""
    return (torch.exp(z - lse.unsqueeze(-1)) - p) * rw.unsqueeze(-1)


@torch.no_grad()
def _soft_ce_values(h, w, p, row_weight, chunk: int, compiled: bool):
    """The loss and argmax alone (no gradient wanted)."""
    acc = torch.promote_types(h.dtype, torch.float32)
    w = w.to(h.dtype)
    total = torch.zeros((), dtype=acc, device=h.device)
    arg = torch.empty(h.shape[0], dtype=torch.long, device=h.device)
    one = torch.ones((), dtype=acc, device=h.device)
    math = _chunk_math(compiled)
    for lo in range(0, h.shape[0], chunk):
        loss, arg_c, _ = math(h[lo : lo + chunk] @ w.T, p[lo : lo + chunk],
                              row_weight[lo : lo + chunk], one)  # fmt: skip
        total += loss
        arg[lo : lo + chunk] = arg_c
    return total, arg


def soft_ce_scaled(
    h, weight, p, row_weight, scale, head: HeadGrad | None = None, chunk: int = 2048,
    compiled: bool = False,
):  # fmt: skip
    """(scale x loss, loss, draft argmax per row), loss = sum_t row_weight_t * CE(p_t,
    softmax(h_t W^T)); the gradient of scale x loss computed in the forward (_SoftCE).

    scale: a 0-d tensor (fp32), the step's weight over its valid count: it multiplies the
    logit gradient in fp32 before its one rounding. head: the unroll's shared lm_head
    (HeadGrad made for all its uses); None = a head of this call alone.
    """
    acc = torch.promote_types(h.dtype, torch.float32)
    scale = torch.as_tensor(scale, dtype=acc, device=h.device)
    if not (torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)):
        loss, arg = _soft_ce_values(h, weight, p, row_weight, chunk, compiled)
        return loss * scale, loss, arg
    head = head or HeadGrad(weight, h.dtype, 1)
    return _SoftCE.apply(h, weight, p, row_weight, scale, head, chunk, compiled)


def soft_ce(h, weight, p, row_weight, chunk: int = 2048, compiled: bool = False):
    """(sum_t row_weight_t * CE(p_t, softmax(h_t W^T)), draft argmax per row): the fused soft
    CE of one call (scale one; any upstream gradient).

    h [N, H] (normed hidden), weight [Vd, H] (lm_head), p [N, Vd] fp32, row_weight [N].
    compiled: each chunk's fp32 math (log-sum-exp, CE, argmax, logit gradient) runs as
    torch.compile'd fused kernels (train.compile_loss).
    """
    scaled, _, arg = soft_ce_scaled(h, weight, p, row_weight, 1.0, None, chunk, compiled)
    return scaled, arg


def soft_ce_reference(h, weight, p, row_weight):
    """The direct formula (materialises all logits); for tests."""
    acc = torch.promote_types(h.dtype, torch.float32)
    logp = torch.log_softmax((h.to(acc) @ weight.to(acc).T), dim=-1)
    return -((p.to(acc) * logp).sum(-1) * row_weight.to(acc)).sum()
