"""`eagle3 export --init`: an untrained drafter for a target, made without any dump.

SGLang 0.5.14 captures the target's aux hidden states only with an EAGLE3 drafter loaded
(sglang_versions.py), so extracting through it needs a drafter before there is anything to
train on. Its weights do not matter (only the target's prefill states are dumped), its shapes
and capture layers do: this builds one exactly as training would (build_drafter: the training
config's drafter section, the target's config and embedding, the draft vocabulary), saves it as a
step-0 checkpoint and hands that to the normal export, so the loader contract and the context
length check are the same as for a trained drafter.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from remote_agent.eagle3.errors import BadInput


def target_meta(target: Path, layers: list[int] | None) -> SimpleNamespace:
    """What build_drafter reads from a dump's meta, from the target's config.json instead."""
    path = Path(target) / "config.json"
    if not path.is_file():
        raise BadInput(f"{target}: no config.json (--target must be the model directory)")
    cfg = json.loads(path.read_text())
    cfg = cfg.get("text_config") or cfg
    n, h = int(cfg["num_hidden_layers"]), int(cfg["hidden_size"])
    ids = list(layers) if layers else [2, n // 2, n - 3]
    return SimpleNamespace(hidden_size=h, num_layers=n, aux_layer_ids=ids, num_aux=len(ids))


def init_export(
    config: Path, target: Path, vocab: Path | None, out: Path, force: bool, seed: int = 0
) -> dict[str, Any]:
    import torch

    from remote_agent.eagle3.drafter.export.export import export_checkpoint
    from remote_agent.eagle3.drafter.model.context import target_context_length
    from remote_agent.eagle3.drafter.model.loss import load_target_tensor
    from remote_agent.eagle3.drafter.train import checkpoint as ckpt
    from remote_agent.eagle3.drafter.train import config as config_mod
    from remote_agent.eagle3.drafter.train.data import load_vocab
    from remote_agent.eagle3.drafter.train.loop import build_drafter

    cfg = config_mod.load(Path(config), [f"target.path={json.dumps(str(target))}"])
    meta = target_meta(Path(target), cfg.drafter.aux_layer_ids)
    lm_head = load_target_tensor(Path(target), cfg.target.lm_head_key, dtype=torch.float32)
    embed = load_target_tensor(Path(target), cfg.target.embed_key, dtype=torch.float32)
    if lm_head.shape[1] != meta.hidden_size:
        raise BadInput(
            f"{target}: lm_head is {tuple(lm_head.shape)}, hidden size {meta.hidden_size}"
        )
    d2t, t2d, _ = load_vocab(Path(vocab) if vocab else None, lm_head.shape[0])
    drafter = build_drafter(cfg, meta, lm_head.shape[0], d2t, t2d, embed, lm_head, seed)
    frozen = {n for n, p in drafter.named_parameters() if not p.requires_grad}
    state = {
        "model": {k: v.detach().cpu() for k, v in drafter.state_dict().items() if k not in frozen},
        "model_config": drafter.config,
        "capture_layer_ids": drafter.capture_layer_ids,
        "num_target_layers": meta.num_layers,
        "target_context_length": target_context_length(Path(target)),
        "vocab": {"d2t": drafter.d2t.cpu(), "t2d": drafter.t2d.cpu()},
        "global_step": 0,
        "untrained": True,
    }
    with tempfile.TemporaryDirectory(prefix="eagle3-init-") as tmp:
        step = ckpt.save(Path(tmp), 0, state, {"step": 0, "untrained": True})
        result = export_checkpoint(step, Path(out), force=force, target=Path(target))
    result["untrained"] = True
    return result
