"""The dtype SGLang will run a model in, and the refusal when target and drafter disagree.

SGLang resolves `--dtype` once and builds both the target and the EAGLE3 draft worker from it
(`ModelConfig._get_and_verify_dtype`, the same in 0.5.14 and 0.5.23): with `auto`, a config's
`dtype` (transformers 5) or `torch_dtype` is used, except that float32 becomes float16 (bfloat16
for Gemma). A float32 target next to a bfloat16 drafter therefore runs the target in float16 and
the drafter in bfloat16: the target's aux hidden states (float16) meet the drafter's `fc`
(bfloat16) and the first draft forward raises. Restated here (no sglang import) and checked
against the wheel's real function in tests/eagle3/serving/test_serve_dtype.py.
"""

from __future__ import annotations

from typing import Any

# SGLang's _STR_DTYPE_TO_TORCH_DTYPE, as names
_NAMES = {
    "half": "float16",
    "float16": "float16",
    "float": "float32",
    "float32": "float32",
    "bfloat16": "bfloat16",
}


def config_dtype(config: dict[str, Any]) -> str:
    """The dtype a config declares, SGLang's way (`dtype` first, then `torch_dtype`; float32)."""
    raw = config.get("dtype") or config.get("torch_dtype")
    return _NAMES.get(str(raw), "float32") if raw else "float32"


def served_dtype(config: dict[str, Any], flag: str = "auto") -> str:
    """What SGLang runs a model with this config in, given `--dtype flag`."""
    flag = flag.lower()
    if flag != "auto":
        return _NAMES.get(flag, flag)
    declared = config_dtype(config)
    if declared == "float32":
        return "bfloat16" if str(config.get("model_type", "")).startswith("gemma") else "float16"
    return declared


def dtype_flag(extra_args: list[str]) -> str:
    """The `--dtype` value among launch_server arguments (`auto` when absent)."""
    for i, a in enumerate(extra_args):
        if a.startswith("--dtype="):
            return a.split("=", 1)[1]
        if a == "--dtype" and i + 1 < len(extra_args):
            return extra_args[i + 1]
    return "auto"


def dtype_mismatch(
    target_config: dict[str, Any], drafter_config: dict[str, Any], extra_args: list[str]
) -> str | None:
    """Why target and drafter would run in different dtypes under these arguments, or None."""
    from remote_agent.eagle3.drafter.model.context import text_config

    flag = dtype_flag(extra_args)
    text = text_config(target_config)
    if not (text.get("dtype") or text.get("torch_dtype")):
        # a wrapper (Kimi-K2.5) may declare its dtype only at the top: SGLang hands it to the
        # text config it reads (get_hf_text_config; transformers itself does not)
        text = {**text, "dtype": target_config.get("dtype") or target_config.get("torch_dtype")}
    target = served_dtype(text, flag)
    drafter = served_dtype(drafter_config, flag)
    if target == drafter:
        return None
    return (
        f"SGLang would run the target in {target} (config dtype "
        f"{config_dtype(text)}, --dtype {flag}) and the drafter in "
        f"{drafter} (config dtype {config_dtype(drafter_config)}): the target's hidden states "
        f"would meet the drafter's weights in another dtype and the first draft forward fails; "
        f"pass --arg=--dtype --arg={drafter} (SGLang's --dtype applies to both models)"
    )
