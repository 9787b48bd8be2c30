"""Training checkpoint -> SGLang drafter directory (config.json + model.safetensors), checked.

Names follow SGLang's checkpoint layout: fc, midlayer.* (or layers.0.*), norm, lm_head [draft
vocab, H], d2t, t2d. The frozen target embedding is not written (SGLang uses the target's).
Nothing is written unless the contract check passes; the directory appears atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from remote_agent.eagle3.drafter.model import contract
from remote_agent.eagle3.drafter.model.context import target_context_length
from remote_agent.eagle3.errors import BadInput, Failed
from remote_agent.wire.atomic_write import atomic_path

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def export_tensors(
    model_state: dict[str, torch.Tensor],
    config: dict[str, Any],
    d2t: torch.Tensor,
    t2d: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16,
    layer_prefix: str = "midlayer",
) -> dict[str, torch.Tensor]:
    """Our parameter names -> SGLang checkpoint names (floating tensors cast to `dtype`)."""
    if layer_prefix not in ("midlayer", "layers.0"):
        raise BadInput(f"--layer-prefix must be midlayer or layers.0, got {layer_prefix!r}")
    share_embed = config["hidden_size"] == config["target_hidden_size"]
    out: dict[str, torch.Tensor] = {}
    for name, t in model_state.items():
        if name in ("d2t", "t2d"):
            continue
        if name == "embed_tokens.weight" and share_embed:
            continue  # SGLang replaces it with the target's embedding
        if name.startswith("midlayer."):
            name = layer_prefix + name[len("midlayer") :]
        out[name] = t.detach().to("cpu", dtype).contiguous()
    out["d2t"] = d2t.to("cpu", torch.long).contiguous()
    out["t2d"] = t2d.to("cpu", torch.bool).contiguous()
    return out


def export_checkpoint(
    ckpt_dir: Path,
    out: Path,
    dtype: str = "bf16",
    layer_prefix: str = "midlayer",
    force: bool = False,
    target: Path | None = None,
) -> dict[str, Any]:
    """`target` (its config.json) overrides the context length recorded at training."""
    from safetensors.torch import save_file

    from remote_agent.eagle3.drafter.train.checkpoint import load

    ckpt_dir, out = Path(ckpt_dir), Path(out)
    if (ckpt_dir / "checkpoints").is_dir():  # a run directory: take its newest checkpoint
        from remote_agent.eagle3.drafter.train.checkpoint import latest

        found = latest(ckpt_dir / "checkpoints")
        if found is None:
            raise BadInput(f"{ckpt_dir}: no complete checkpoint under checkpoints/")
        ckpt_dir = found
    if not (ckpt_dir / "state.pt").exists():
        raise BadInput(f"{ckpt_dir}: not a training checkpoint (no state.pt)")
    if dtype not in DTYPES:
        raise BadInput(f"--dtype must be one of {', '.join(DTYPES)}")
    if out.exists() and not force:
        raise BadInput(f"{out}: exists; choose a new directory or pass --force to replace it")
    state = load(ckpt_dir)
    config = dict(state["model_config"])
    tensors = export_tensors(
        state["model"],
        config,
        state["vocab"]["d2t"],
        state["vocab"]["t2d"],
        DTYPES[dtype],
        layer_prefix,
    )
    config["torch_dtype"] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[dtype]
    report = contract.check(
        {k: tuple(v.shape) for k, v in tensors.items()},
        config,
        intended_capture=state.get("capture_layer_ids"),
        num_target_layers=state.get("num_target_layers"),
        target_context_length=(
            target_context_length(target) if target else state.get("target_context_length")
        ),
    )
    if not report.ok:
        raise Failed(
            f"{ckpt_dir}: the drafter fails SGLang's loader contract; nothing written:\n  "
            + "\n  ".join(report.problems)
        )
    with atomic_path(out) as tmp:  # fsyncs every file; replaces an older export whole
        tmp.mkdir()
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        sha = hashlib.sha256((tmp / "model.safetensors").read_bytes()).hexdigest()
        info = {
            "checkpoint": str(ckpt_dir),
            "step": state["global_step"],
            "capture_layer_ids": state.get("capture_layer_ids"),
            "model_sha256": sha,
            "tensors": len(tensors),
            "serve_flags": serve_flags(out),
            # what the drafter was trained on, so `eagle3 eval --split holdout` needs no flags
            "dataset": (state.get("data_key") or {}).get("dataset"),
            "holdout_fraction": (state.get("data_key") or {}).get("holdout_fraction"),
        }
        (tmp / "eagle3_export.json").write_text(json.dumps(info, indent=2) + "\n")
        for f in tmp.iterdir():
            os.chmod(f, 0o644)  # safetensors writes 0600; the server may run as another user
        os.chmod(tmp, 0o755)
    return {"out": str(out), **info, "checks": len(report.routes)}


def serve_flags(path: Path, steps: int = 3, topk: int = 1, draft_tokens: int = 4) -> str:
    return (
        f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {path} "
        f"--speculative-num-steps {steps} --speculative-eagle-topk {topk} "
        f"--speculative-num-draft-tokens {draft_tokens}"
    )


def load_export(path: Path, device="cpu", dtype=torch.float32):
    """An exported directory -> (Eagle3Drafter without embedding weights set, config)."""
    from safetensors.torch import load_file

    from remote_agent.eagle3.drafter.model.model import Eagle3Drafter

    path = Path(path)
    if not (path / "config.json").exists():
        raise BadInput(f"{path}: no config.json (export a checkpoint with `eagle3 export`)")
    config = json.loads((path / "config.json").read_text())
    tensors = load_file(str(path / "model.safetensors"))
    model = Eagle3Drafter(config)
    state = {}
    for name, t in tensors.items():
        if name.startswith("layers.0."):
            name = "midlayer." + name[len("layers.0.") :]
        state[name] = t
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if m != "embed_tokens.weight"]
    if missing or unexpected:
        raise Failed(f"{path}: missing {missing}, unexpected {unexpected}")
    return model.to(device, dtype), config
