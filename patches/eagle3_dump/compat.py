"""Everything the dump hook reads from SGLang that differs between the supported releases
(0.5.14 and 0.5.23, checked against their wheels by tests/eagle3/patching/test_patch_wheel.py).

- aux hidden states: 0.5.23's DeepseekV2Model returns them packed, one [T, K*H] tensor
  (AuxHiddenStatePacker); 0.5.14's returns the list its layers appended, K tensors [T, H] in
  ascending layer order, which its logits processor concatenates on the last dim. `packed_aux`
  does the same concatenation, so both releases dump the same layout.
- forward modes: a plain prefill is EXTEND; both releases fold TARGET_VERIFY, MIXED and
  SPLIT_PREFILL into `is_extend()`, 0.5.14 and 0.5.23 add DLLM_EXTEND / DRAFT_EXTEND_V2, which
  an older or newer release may lack (then they cannot occur).
- the writer rank: `runtime_context.get_parallel()` exists in both; 0.5.23 also knows the DP
  replica (`dp_rank`), 0.5.14 does not. The lookup fails closed: a field it cannot read is a
  DumpConfigError, never a guess of rank 0 (two ranks writing as 0 would mix their rows).
"""

from __future__ import annotations

from typing import Any

RANK_FIELDS = ("attn_tp_rank", "attn_cp_rank", "attn_dp_size", "attn_dp_rank")


class DumpConfigError(RuntimeError):
    """The server is not configured for extraction; raised into the forward on purpose."""


def packed_aux(aux: Any) -> Any:
    """One [T, K*H] tensor from either release's aux hidden states (None stays None)."""
    if aux is None or not isinstance(aux, (list, tuple)):
        return aux
    import torch

    if not aux or not all(torch.is_tensor(t) and t.dim() == 2 for t in aux):
        shapes = [tuple(t.shape) if torch.is_tensor(t) else type(t).__name__ for t in aux]
        raise DumpConfigError(f"aux hidden states are a list of {shapes}; expected K x [T, H]")
    return torch.cat(list(aux), dim=-1)


def plain_extend(mode: Any) -> bool:
    """The target's own prefill: not a verify, mixed, idle, split or draft forward."""
    if not mode.is_extend():
        return False
    if mode.is_target_verify() or mode.is_mixed() or mode.is_idle():
        return False
    for name in ("is_split_prefill", "is_dllm_extend", "is_draft_extend_v2"):
        check = getattr(mode, name, None)
        if check is not None and check():
            return False
    return True


def _parallel() -> Any:
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError as exc:
        raise DumpConfigError(
            f"cannot tell whether this rank writes ({exc}); the hook supports sglang 0.5.14 and "
            "0.5.23"
        ) from None
    return get_parallel()


def _read(p: Any, name: str) -> Any:
    try:
        value = getattr(p, name)
    except (AttributeError, RuntimeError, ValueError) as exc:
        raise DumpConfigError(
            f"cannot tell whether this rank writes: get_parallel().{name} is unreadable ({exc})"
        ) from None
    if value is None:
        raise DumpConfigError(
            f"cannot tell whether this rank writes: get_parallel().{name} is None"
        )
    return value


def _server_args() -> Any:
    """The server's arguments (0.5.23: runtime_context, 0.5.14: server_args); None: unknown."""
    try:  # 0.5.23
        from sglang.srt.runtime_context import get_server_args

        return get_server_args()
    except Exception:
        try:  # 0.5.14
            from sglang.srt.server_args import get_global_server_args

            return get_global_server_args()
        except Exception:
            return None


def served_model() -> dict[str, str]:
    """What the server was started with: model_path, tokenizer_path, served_model_name (the
    dump metadata names the model even where the model object does not: Kimi-K2.5's wrapper
    hands the hook a language model whose text config has no `_name_or_path`)."""
    args, out = _server_args(), {}
    for name in ("model_path", "tokenizer_path", "served_model_name"):
        value = getattr(args, name, None)
        if isinstance(value, str) and value:
            out[name] = value
    return out


def _replicas() -> int | None:
    """How many DP replicas (`--dp-size` without DP attention) the server runs; None: unknown."""
    args = _server_args()
    if args is None:
        return None
    dp = getattr(args, "dp_size", None)
    if dp is None:
        return None
    return 1 if getattr(args, "enable_dp_attention", False) else int(dp)


def _replica_rank(p: Any) -> int:
    try:
        value = p.dp_rank
    except (AttributeError, RuntimeError, ValueError):
        value = None  # 0.5.14 has no such field; 0.5.23 leaves it unset without replicas
    if value is not None:
        return int(value)
    replicas = _replicas()
    if replicas == 1:
        return 0
    raise DumpConfigError(
        f"cannot tell DP replicas apart (dp_size {replicas!r}, no dp_rank): two replicas would "
        "write as the same rank; extract with --dp-size 1 (one server per replica)"
    )


def writer_rank(model: Any) -> int | None:
    """This process's rank tag when it writes dumps, else None.

    Writers are attention-TP rank 0 (and CP rank 0) of each attention-DP group on the last
    pipeline stage; every such rank holds its group's full rows. The tag is unique across DP
    replicas and attention-DP groups. Never runs a collective (ranks take different branches).
    """
    pp_group = getattr(model, "pp_group", None)
    if pp_group is None or not hasattr(pp_group, "is_last_rank"):
        raise DumpConfigError(f"{type(model).__name__} has no pp_group: cannot tell the PP stage")
    if not pp_group.is_last_rank:
        return None
    p = _parallel()
    tp, cp, dp_size, dp_rank = (_read(p, name) for name in RANK_FIELDS)
    if int(tp) != 0 or int(cp) != 0:
        return None
    return _replica_rank(p) * int(dp_size) + int(dp_rank)


def parallel_summary() -> dict[str, Any]:
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError:
        return {}
    p, out = get_parallel(), {}
    for name in ("tp_size", "attn_tp_size", "attn_dp_size", "attn_cp_size", "pp_size", "dp_rank"):
        try:
            out[name] = getattr(p, name)
        except (AttributeError, RuntimeError, ValueError):
            pass
    return out
