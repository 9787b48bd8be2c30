"""The drafter's context length, decided from the target's: what SGLang 0.5.23 will demand.

SGLang builds the draft worker with `context_length` = the target's context length and raises
in `ModelConfig._derive_context_length` when the draft config derives a smaller one (unless
SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1). Both lengths come from `get_context_length`
(sglang/srt/utils/hf_transformers/common.py), restated here and checked against the wheel's
real function in tests/eagle3/drafter/test_drafter_context.py.

RoPE: the drafter trains and serves with plain RoPE (`rope_theta`, `rope_scaling: null`), not
the target's YaRN. The training config is the exported config, so the two cannot disagree;
`bench/bench_accept_by_position.py` is where the cost of plain RoPE on long contexts shows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput

# SGLang's CONTEXT_LENGTH_KEYS, in its order of preference
CONTEXT_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config of a multimodal wrapper (Kimi-K2.5: `text_config`)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def context_length(config: dict[str, Any]) -> int:
    """SGLang's get_context_length on a (text) config dict."""
    c = text_config(config)
    scaling = c.get("rope_scaling") or None
    factor = 1
    if scaling:
        factor = scaling.get("factor", 1)
        if "original_max_position_embeddings" in scaling or scaling.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_KEYS:
        if c.get(key) is not None:
            return int(factor * c[key])
    return 2048


def read_config(model_dir: Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(
            f"{path}: no such file (the target model directory needs config.json)"
        ) from None
    except ValueError as exc:
        raise BadInput(f"{path}: not valid JSON ({exc})") from None


def target_context_length(model_dir: Path) -> int:
    return context_length(read_config(model_dir))


def mismatch(drafter_config: dict[str, Any], target_len: int) -> str | None:
    """Why SGLang would refuse this drafter next to a target of `target_len` tokens, or None."""
    draft_len = context_length(drafter_config)
    if draft_len >= target_len:
        return None
    return (
        f"the drafter's context length is {draft_len} (max_position_embeddings "
        f"{drafter_config.get('max_position_embeddings')!r}) but the target's is {target_len}: "
        "SGLang builds the draft worker at the target's length and refuses a shorter drafter; "
        "retrain with drafter.max_position_embeddings null (= the target's) or serve the "
        "target with --context-length <= the drafter's"
    )
