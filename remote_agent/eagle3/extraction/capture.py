"""Capturing EAGLE-3 states from a Hugging Face causal LM, the same convention as SGLang:

- aux: the residual stream *entering* decoder layers `ids` (HF `hidden_states[i]`), taken by
  forward pre-hooks on those layers (no `output_hidden_states`, so no L+1 tensors kept);
- final: the base model's `last_hidden_state`, i.e. after the final norm (the lm_head input);
  the lm_head itself is never run.

Batches are right-padded with an attention mask; with causal attention a real token never
attends to a pad, positions of real tokens are the same as alone, and MoE routing is per token,
so padding does not change real tokens' states (the tests check it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def default_layer_ids(num_layers: int) -> list[int]:
    return [2, num_layers // 2, num_layers - 3]


def resolve_layer_ids(num_layers: int, ids: Sequence[int] | None = None) -> list[int]:
    """Input-of-layer ids, resolved like SGLang: default [2, L//2, L-3]; a list starting with 1
    is the output-of-layer convention and gets +1 on every id."""
    if not ids:
        resolved = default_layer_ids(num_layers)
    elif ids[0] == 1:
        resolved = [int(i) + 1 for i in ids]
    else:
        resolved = [int(i) for i in ids]
    if len(set(resolved)) != len(resolved) or not all(0 < i < num_layers for i in resolved):
        raise ValueError(
            f"capture ids {resolved} must be distinct and inside (0, {num_layers}) "
            "(the final layer's output is the `final` state, not an aux layer)"
        )
    return sorted(resolved)


def text_config(config: Any) -> Any:
    """The language model's config (Kimi-style wrappers keep it in text_config)."""
    return getattr(config, "text_config", None) or config


def decoder_of(model: Any) -> tuple[Any, Any]:
    """(base decoder model returning last_hidden_state, its list of decoder layers)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is None or not hasattr(decoder, "layers"):
        decoder = getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: cannot find the decoder layers (model.layers)")
    return decoder, layers


class AuxCapture:
    """Forward pre-hooks that keep the hidden states entering the chosen layers."""

    def __init__(self, layers: Any, ids: Sequence[int]) -> None:
        self.layers, self.ids = layers, list(ids)
        self.states: dict[int, Any] = {}
        self._handles: list[Any] = []

    def _hook(self, layer_id: int):
        def pre_hook(module, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            self.states[layer_id] = h
            return None

        return pre_hook

    def __enter__(self) -> AuxCapture:
        for i in self.ids:
            handle = self.layers[i].register_forward_pre_hook(self._hook(i), with_kwargs=True)
            self._handles.append(handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.states.clear()


def plan_batches(
    lengths: Sequence[tuple[str, int]], token_budget: int, max_batch: int = 1 << 30
) -> list[list[str]]:
    """Longest first; a batch holds samples while batch_size x longest <= token_budget (the
    padded size). A sample longer than the budget gets a batch of its own."""
    order = sorted(lengths, key=lambda x: (-x[1], x[0]))
    batches: list[list[str]] = []
    cur: list[str] = []
    longest = 0
    for sid, n in order:
        if cur and (max(longest, n) * (len(cur) + 1) > token_budget or len(cur) >= max_batch):
            batches.append(cur)
            cur, longest = [], 0
        cur.append(sid)
        longest = max(longest, n)
    if cur:
        batches.append(cur)
    return batches


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, device: Any = "cpu"):
    """Right-padded input_ids [B, S] (long) and attention_mask [B, S] on `device` (copied from
    pinned memory without blocking on CUDA)."""
    import torch

    longest = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), longest), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(seqs), longest), dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[row, : len(s)] = 1
    return _to_device(ids, device), _to_device(mask, device)


def _to_device(t, device):
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def real_rows(lengths: Sequence[int], width: int, device: Any = "cpu"):
    """Flat row indexes of the real tokens of a right-padded [B, width] batch, built on the host
    (a boolean-mask gather would synchronise the device to learn the output size)."""
    import torch

    idx = torch.cat([torch.arange(n) + b * width for b, n in enumerate(lengths)])
    return _to_device(idx, device)


def capture_batch(
    decoder: Any, capture: AuxCapture, input_ids, attention_mask, dtype=None, lengths=None
):
    """One forward; returns (ids [N], aux [N, K*H], final [N, H]) of the real tokens only,
    sample after sample in batch order, on the model's device (cast to `dtype` if given)."""
    import torch

    if lengths is None:
        lengths = attention_mask.sum(dim=1).tolist()
    capture.states.clear()
    out = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    missing = [i for i in capture.ids if i not in capture.states]
    if missing:
        raise RuntimeError(f"decoder layers {missing} did not run; cannot capture them")
    idx = real_rows(lengths, input_ids.shape[1], input_ids.device)

    def take(t):
        t = t.reshape(-1, t.shape[-1]).index_select(0, idx)
        return t if dtype is None else t.to(dtype)

    aux = torch.cat([take(capture.states[i]) for i in capture.ids], dim=-1)
    final = take(out.last_hidden_state)
    capture.states.clear()
    return input_ids.reshape(-1).index_select(0, idx), aux, final


class HostCopier:
    """Device-to-host copies that overlap the next forward: on CUDA they go into pinned buffers
    on a side stream, ordered after the compute that produced them; `finish` waits for one."""

    def __init__(self, device: Any) -> None:
        import torch

        self.cuda = torch.device(device).type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None

    def start(self, *tensors):
        import torch

        if not self.cuda:
            return None, tuple(t.cpu() for t in tensors), ()
        assert self.stream is not None  # made with self.cuda
        produced = torch.cuda.Event()
        produced.record()  # on the compute stream
        self.stream.wait_event(produced)
        outs = []
        with torch.cuda.stream(self.stream):
            for t in tensors:
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host.copy_(t, non_blocking=True)
                outs.append(host)
            done = torch.cuda.Event()
            done.record(self.stream)
        return done, tuple(outs), tensors  # the device tensors stay referenced until finish

    @staticmethod
    def finish(handle):
        done, outs, _ = handle
        if done is not None:
            done.synchronize()
        return outs
