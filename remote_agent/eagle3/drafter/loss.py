"""Teacher distribution and the soft cross-entropy, both chunked.

Teacher: the target's next-token distribution at position t is softmax(lm_head(final_t)), where
final_t is the stored post-norm final hidden state and lm_head the target's own matrix (read
from its safetensors by key). It is restricted to the draft vocabulary and renormalised; a
position whose full-vocabulary argmax is not in the draft vocabulary is dropped (the draft can
never propose that token). Full-vocabulary logits exist only `chunk` rows at a time.

Soft CE: loss_t = -sum_v p_t(v) log softmax(z_t)(v) with z = norm(h) @ W_draft^T, computed per
row chunk in fp32. The forward also computes the gradient w.r.t. the logits ((softmax - p) *
weight) and keeps it (compute dtype), so the draft logits are never stored and backward is two
matmuls per chunk. With `recompute` (long sequences) not even that gradient is kept: backward
redoes each chunk's logits, so the loss holds nothing of size [N, Vd] but the teacher's p.
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
    p: torch.Tensor  # [N, Vd] fp32 target distribution over the draft vocabulary (renormalised)
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
) -> Teacher:
    """final [N, H], lm_head [V, H] (target), draft_ids [Vd] target ids of the draft vocab."""
    n = final.shape[0]
    p = torch.empty(n, draft_ids.numel(), dtype=torch.float32, device=final.device)
    arg = torch.empty(n, dtype=torch.long, device=final.device)
    w = lm_head.float() if fp32 else lm_head
    for lo in range(0, n, chunk):
        f = final[lo : lo + chunk].to(w.dtype)
        logits = f @ w.T  # [chunk, V]; never the whole batch at once
        arg[lo : lo + chunk] = logits.argmax(-1)
        p[lo : lo + chunk] = torch.softmax(logits.index_select(1, draft_ids).float(), dim=-1)
        del logits
    return Teacher(p, arg, t2d[arg])


def _chunk_forward(zl: torch.Tensor, pc: torch.Tensor, rw: torch.Tensor, want_grad: bool):
    """One chunk's (weighted CE sum, argmax, d loss / d z in zl's dtype or None); zl: the
    chunk's logits as the matmul gave them (compute dtype), widened to fp32 here."""
    acc = torch.promote_types(zl.dtype, torch.float32)  # fp32 (fp64 in gradient checks)
    z, pc, rw = zl.to(acc), pc.to(acc), rw.to(acc)
    lse = torch.logsumexp(z, dim=-1)
    # -sum p log softmax(z) = lse - sum p z   (p sums to 1)
    loss = ((lse - (pc * z).sum(-1)) * rw).sum()
    grad = _grad_logits(z, lse, pc, rw).to(zl.dtype) if want_grad else None
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


class _SoftCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, p, row_weight, chunk, recompute=False, compiled=False):
        w = weight.to(h.dtype)
        n = h.shape[0]
        acc = torch.promote_types(h.dtype, torch.float32)  # fp32 (fp64 in gradient checks)
        # recompute: keep nothing of size [N, Vd] beyond p; backward redoes the chunk matmul
        grad_z = None if recompute else torch.empty(n, w.shape[0], dtype=h.dtype, device=h.device)
        total = torch.zeros((), dtype=acc, device=h.device)
        arg = torch.empty(n, dtype=torch.long, device=h.device)
        math = _chunk_math(compiled)
        for lo in range(0, n, chunk):
            zl = h[lo : lo + chunk] @ w.T
            pc, rw = p[lo : lo + chunk], row_weight[lo : lo + chunk]
            loss, arg_c, grad = math(zl, pc, rw, grad_z is not None)
            total += loss
            arg[lo : lo + chunk] = arg_c
            if grad_z is not None:
                grad_z[lo : lo + chunk] = grad
        if recompute:
            ctx.save_for_backward(h, w, p, row_weight)
        else:
            ctx.save_for_backward(h, w, grad_z)
        ctx.recompute, ctx.chunk = recompute, chunk
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(arg)
        return total, arg

    @staticmethod
    def backward(ctx, grad_total, _grad_arg):
        if not ctx.recompute:
            h, w, grad_z = ctx.saved_tensors
            g = grad_z * grad_total.to(grad_z.dtype)
            return g @ w, (g.T @ h).to(ctx.weight_dtype), None, None, None, None, None
        h, w, p, row_weight = ctx.saved_tensors
        acc = torch.promote_types(h.dtype, torch.float32)
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros(w.shape, dtype=acc, device=w.device)
        for lo in range(0, h.shape[0], ctx.chunk):
            hc = h[lo : lo + ctx.chunk]
            z = (hc @ w.T).to(acc)
            lse = torch.logsumexp(z, dim=-1)
            pc, rw = p[lo : lo + ctx.chunk].to(acc), row_weight[lo : lo + ctx.chunk].to(acc)
            g = (_grad_logits(z, lse, pc, rw) * grad_total.to(acc)).to(h.dtype)
            grad_h[lo : lo + ctx.chunk] = g @ w
            grad_w += g.T @ hc
        return grad_h, grad_w.to(ctx.weight_dtype), None, None, None, None, None


def _grad_logits(z, lse, p, rw):
    """d loss / d z for one chunk: (softmax(z) - p) * row weight."""
    return (torch.exp(z - lse.unsqueeze(-1)) - p) * rw.unsqueeze(-1)


def soft_ce(
    h, weight, p, row_weight, chunk: int = 2048, recompute: bool = False, compiled: bool = False
):
    """(sum_t row_weight_t * CE(p_t, softmax(h_t W^T)), draft argmax per row).

    h [N, H] (normed hidden), weight [Vd, H] (lm_head), p [N, Vd] fp32, row_weight [N].
    recompute: backward recomputes the logits chunk by chunk instead of keeping the [N, Vd]
    logit gradient from the forward (one more matmul per chunk; for long sequences).
    compiled: each chunk's fp32 math (log-sum-exp, CE, argmax, logit gradient) runs as
    torch.compile'd fused kernels (train.compile_loss).
    """
    return _SoftCE.apply(h, weight, p, row_weight, chunk, recompute, compiled)


def soft_ce_reference(h, weight, p, row_weight):
    """The direct formula (materialises all logits); for tests."""
    acc = torch.promote_types(h.dtype, torch.float32)
    logp = torch.log_softmax((h.to(acc) @ weight.to(acc).T), dim=-1)
    return -((p.to(acc) * logp).sum(-1) * row_weight.to(acc)).sum()
