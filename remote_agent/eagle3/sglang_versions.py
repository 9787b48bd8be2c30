"""What each supported SGLang release can do, as read from its wheel (tests pin these facts):
the one place the client side (launch flags, the server_info check) differs per release.

- 0.5.23 captures aux hidden states without a drafter (`--enable-return-aux-hidden-states
  --speculative-algorithm EAGLE3`, layers from `--return-aux-hidden-state-layer-ids`).
- 0.5.14 (pinned to torch 2.11, and by SpecForge 0.2.0) has no capture-only flags: the target
  captures only when a real EAGLE3 drafter is loaded (`--speculative-algorithm EAGLE3
  --speculative-draft-model-path D`), with the layer ids of D's `eagle_config` (else the default
  [2, L//2, L-3]; model_runner.py + deepseek_v2.set_eagle3_layers_to_capture). Any drafter made
  for the target works for extraction (an untrained one too): the hook dumps only the target's
  own prefill (ForwardMode.EXTEND in DeepseekV2ForCausalLM.forward); verify forwards are
  TARGET_VERIFY and the drafter is another model class, so neither reaches the hook.
- Both resolve the prefill CUDA-graph backend the same way (server_args
  `_resolve_cuda_graph_config`): defaults < --disable-cuda-graph < --disable-prefill-cuda-graph
  < --cuda-graph-backend-prefill < --cuda-graph-config JSON; `/server_info` reports the resolved
  `cuda_graph_config`. The hook cannot run inside a graph replay, so extraction needs
  "disabled" as the effective value, not just the flag.

Standard library only (sglang itself is never imported).
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

from remote_agent.eagle3.errors import BadInput

CAPTURE_ONLY_FLAGS = ("--enable-return-aux-hidden-states", "--return-aux-hidden-state-layer-ids")
WITHOUT_CAPTURE_ONLY = frozenset({"0.5.14"})
# the cheapest EAGLE3 operating point for extraction on 0.5.14: one draft step, chain of one
# (topk 1 forces draft tokens = steps + 1 there); the drafter's proposals are never used
EXTRACT_SPEC = (1, 1, 2)


def installed_version() -> str | None:
    """The installed sglang's version from its dist-info (sglang itself is never imported)."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def needs_drafter(version: str | None) -> bool:
    return version in WITHOUT_CAPTURE_ONLY


def check_extract_supported(version: str | None, draft: Path | None = None) -> None:
    if not needs_drafter(version):
        return
    if draft is None:
        raise BadInput(
            f"sglang {version} has no {' / '.join(CAPTURE_ONLY_FLAGS)}: it captures aux hidden "
            "states only with an EAGLE3 drafter loaded; pass --draft-model DIR (any drafter "
            "exported for this target; an untrained one: `eagle3 export --init --config C "
            "--target MODEL --vocab V --out DIR`), or use sglang 0.5.23"
        )
    if not (Path(draft) / "config.json").is_file():
        raise BadInput(f"--draft-model {draft}: no config.json (an `eagle3 export` directory)")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path}: cannot read ({exc})") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a JSON object")
    return data


def drafter_capture_ids(draft: Path, num_layers: int) -> list[int]:
    """The layers 0.5.14 captures with this drafter loaded (its eagle_config, SGLang's +1 rule)."""
    from remote_agent.eagle3.drafter.model.contract import resolve_capture_ids

    cfg = _read_json(Path(draft) / "config.json")
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return resolve_capture_ids(list(ids) if ids else None, num_layers)


def model_num_layers(model: Path) -> int | None:
    path = Path(model) / "config.json"
    if not path.is_file():
        return None
    cfg = _read_json(path)
    cfg = cfg.get("text_config") or cfg
    n = cfg.get("num_hidden_layers")
    return int(n) if n else None


def capture_flags(version: str | None, layers: list[int] | None, draft: Path | None) -> list[str]:
    """The launch flags that turn aux hidden-state capture on for `version`."""
    if needs_drafter(version):
        steps, topk, tokens = EXTRACT_SPEC
        return [
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            str(draft),
            "--speculative-num-steps",
            str(steps),
            "--speculative-eagle-topk",
            str(topk),
            "--speculative-num-draft-tokens",
            str(tokens),
        ]
    flags = ["--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3"]
    if layers:
        flags += ["--return-aux-hidden-state-layer-ids", *map(str, layers)]
    return flags


def capture_problems(info: dict[str, Any]) -> list[str]:
    """What is wrong with `/server_info` for aux capture, per the release it comes from."""
    if "enable_return_aux_hidden_states" in info:  # 0.5.23
        problems = []
        if info["enable_return_aux_hidden_states"] is not True:
            problems.append(
                "enable_return_aux_hidden_states = "
                f"{info['enable_return_aux_hidden_states']!r}; start SGLang with "
                "--enable-return-aux-hidden-states --speculative-algorithm EAGLE3"
            )
        capture = info.get("aux_hidden_state_capture")
        if capture not in (None, "EAGLE3", "eagle3"):
            problems.append(
                f"aux_hidden_state_capture = {capture!r}; use --speculative-algorithm EAGLE3"
            )
        return problems
    algo = info.get("speculative_algorithm")
    if "speculative_algorithm" not in info:
        return [
            "server_info has neither enable_return_aux_hidden_states nor speculative_algorithm "
            "(not SGLang 0.5.14 / 0.5.23?)"
        ]
    if str(algo).upper() != "EAGLE3" or not info.get("speculative_draft_model_path"):
        return [
            f"speculative_algorithm = {algo!r}, draft = "
            f"{info.get('speculative_draft_model_path')!r}: this release (no "
            "--enable-return-aux-hidden-states) captures only with an EAGLE3 drafter; start it "
            "with `eagle3 sglang-launch extract --draft-model DIR`"
        ]
    return []


def served_capture_ids(info: dict[str, Any], num_layers: int | None) -> list[int] | None:
    """The layer ids a 0.5.14 server captures, from its drafter's config when readable here."""
    if "enable_return_aux_hidden_states" in info or not num_layers:
        return None
    draft = info.get("speculative_draft_model_path")
    if not draft or not (Path(draft) / "config.json").is_file():
        return None
    return drafter_capture_ids(Path(draft), num_layers)


# ---- the effective prefill CUDA-graph backend ----


def prefill_backend_from_info(info: dict[str, Any]) -> str | None:
    """The backend the server really uses for prefill graphs (None: not reported)."""
    cfg = info.get("cuda_graph_config")
    prefill = cfg.get("prefill") if isinstance(cfg, dict) else None
    if isinstance(prefill, dict) and prefill.get("backend") is not None:
        return str(prefill["backend"])  # resolved by the server: authoritative
    return _resolve(
        info.get("disable_cuda_graph") is True,
        info.get("disable_prefill_cuda_graph") is True,
        info.get("cuda_graph_backend_prefill"),
        None,
    )


def prefill_backend_from_args(args: list[str]) -> str | None:
    """The prefill backend a launch with these arguments resolves to (None: SGLang's default)."""
    values: dict[str, str | None] = {}
    flags = {"--disable-cuda-graph", "--disable-prefill-cuda-graph"}
    i = 0
    while i < len(args):
        a = args[i]
        name, eq, val = a.partition("=")
        if name in flags:
            values[name] = "1"
        elif name in ("--cuda-graph-backend-prefill", "--cuda-graph-config"):
            if not eq:
                i += 1
                val = args[i] if i < len(args) else ""
            values[name] = val
        i += 1
    explicit = None
    raw = values.get("--cuda-graph-config")
    if raw:
        try:
            cfg = json.loads(raw)
        except ValueError:
            raise BadInput(f"--cuda-graph-config {raw!r}: not JSON") from None
        prefill = cfg.get("prefill") if isinstance(cfg, dict) else None
        if isinstance(prefill, dict) and prefill.get("backend") is not None:
            explicit = str(prefill["backend"])
    return _resolve(
        "--disable-cuda-graph" in values,
        "--disable-prefill-cuda-graph" in values,
        values.get("--cuda-graph-backend-prefill"),
        explicit,
    )


def _resolve(
    disable_all: bool, disable_prefill: bool, backend: str | None, explicit: str | None
) -> str | None:
    """server_args precedence, lowest first: the global off, the prefill off, the per-phase
    backend, the explicit JSON config."""
    value = None
    if disable_all:
        value = "disabled"
    if disable_prefill:
        value = "disabled"
    if backend is not None:
        value = str(backend)
    if explicit is not None:
        value = explicit
    return value


def prefill_graph_problem(backend: str | None, where: str) -> str | None:
    if backend == "disabled":
        return None
    return (
        f"{where}: the effective prefill CUDA-graph backend is {backend or 'the default'!r}, "
        "not 'disabled' (a later --cuda-graph-backend-prefill / --cuda-graph-config overrides "
        "--disable-prefill-cuda-graph); the dump hook cannot run inside a graph replay"
    )
