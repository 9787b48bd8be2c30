"""`eagle3 sglang-launch extract|serve`: start SGLang with exactly the flags each mode needs.

The runbook runs this as a service step (the job *is* the server: `exec`, so cancelling the job
stops SGLang's whole process group). Keeping the flags here, in tested code, means the runbook,
`eagle3 extract --launch` and the docs cannot drift apart.

- extract: aux hidden-state capture (0.5.23: `--enable-return-aux-hidden-states
  --speculative-algorithm EAGLE3`; 0.5.14: an EAGLE3 drafter, `--draft-model DIR`; see
  eagle3/sglang_versions.py), radix cache off, chunked prefill off (`-1`: a large chunk size is not
  enough), prefill CUDA graph off (the effective backend, extra `--arg`s included); the dump
  patch's environment (EAGLE3_DUMP_*).
- serve: the drafter with `--speculative-algorithm EAGLE3` (never EAGLE: that silently accepts
  nothing) and the chain-drafting operating point (3 steps, topk 1, 4 draft tokens by default).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
from pathlib import Path

from remote_agent.eagle3.errors import BadInput

HELP = "start SGLang in extraction mode or serving the drafter, with the required flags"


def _ids(text: str) -> list[int]:
    return [int(x) for x in text.replace(" ", "").split(",") if x]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("mode", choices=("extract", "serve"))
    p.add_argument("--model", type=Path, required=True, help="the target model directory")
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--dump-dir", type=Path, help="extract: where the patched server writes dumps")
    p.add_argument("--rid-prefix", default="dump-")
    p.add_argument("--layers", type=_ids, help="extract: capture ids (default [2, L//2, L-3])")
    p.add_argument("--aux-dtype", choices=("bf16", "fp8_e4m3"), default="bf16")
    p.add_argument(
        "--draft",
        "--draft-model",
        dest="draft",
        type=Path,
        help="serve: the exported drafter; extract on sglang 0.5.14: the drafter that turns "
        "capture on (any drafter exported for this target)",
    )
    p.add_argument("--steps", type=int, default=3, help="serve: speculative-num-steps")
    p.add_argument("--topk", type=int, default=1, help="serve: speculative-eagle-topk")
    p.add_argument(
        "--draft-tokens", type=int, default=4, help="serve: speculative-num-draft-tokens"
    )
    p.add_argument(
        "--arg", action="append", default=[], help="extra launch_server argument (repeat)"
    )
    p.add_argument(
        "--print", action="store_true", help="print the command and environment; start nothing"
    )
    p.add_argument(
        "--sglang-version", help="the sglang release to launch for (default: the installed one)"
    )


def command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    if args.mode == "extract":
        return extract_command(args)
    if args.draft is None or not (args.draft / "config.json").exists():
        raise BadInput(
            f"serve mode needs --draft DIR with an exported drafter (config.json); got {args.draft}"
        )
    refuse_short_drafter(args)
    refuse_dtype_mismatch(args)
    cmd = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(args.model),
        "--host",
        "127.0.0.1",
        "--port",
        str(args.port),
        "--tp-size",
        str(args.tp),
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(args.draft),
        "--speculative-num-steps",
        str(args.steps),
        "--speculative-eagle-topk",
        str(args.topk),
        "--speculative-num-draft-tokens",
        str(args.draft_tokens),
        "--trust-remote-code",
        *args.arg,
    ]
    return cmd, {}


def extract_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    from remote_agent.eagle3 import sglang_versions as sv
    from remote_agent.eagle3.extraction.server import dump_env, launch_command, sglang_layer_ids

    version = getattr(args, "sglang_version", None) or sv.installed_version()
    sv.check_extract_supported(version, args.draft)
    if args.dump_dir is None:
        raise BadInput(
            "extract mode needs --dump-dir (where the patched server writes hidden states)"
        )
    layers = args.layers
    if sv.needs_drafter(version):
        # the drafter's eagle_config decides what 0.5.14 captures: the hook must expect exactly it
        n = sv.model_num_layers(args.model)
        if n is None:
            raise BadInput(f"{args.model}: no config.json with num_hidden_layers")
        served = sv.drafter_capture_ids(args.draft, n)
        if layers and sorted(sglang_layer_ids(layers)) != sorted(served):
            raise BadInput(
                f"--layers {layers} but the drafter {args.draft} makes sglang {version} capture "
                f"{served} (its eagle_config); drop --layers or export a drafter for {layers}"
            )
        layers = served
    if args.draft is not None:
        refuse_dtype_mismatch(args)
    cmd = launch_command(
        args.model,
        args.port,
        args.tp,
        layers,
        ["--trust-remote-code", *args.arg],
        capture=sv.capture_flags(version, layers, args.draft),
    )
    why = sv.prefill_graph_problem(sv.prefill_backend_from_args(cmd[3:]), "sglang-launch extract")
    if why:
        raise BadInput(why)
    return cmd, dump_env(args.dump_dir, args.rid_prefix, layers, args.aux_dtype)


def refuse_short_drafter(args: argparse.Namespace) -> None:
    """SGLang raises at startup when the drafter's context is shorter than the target's: say so
    before launching, naming both values (`--arg --context-length=N` lowers the target's)."""
    from remote_agent.eagle3.drafter.model.context import (
        mismatch,
        read_config,
        target_context_length,
    )

    target_len = target_context_length(args.model)
    extra = list(args.arg)
    for i, a in enumerate(extra):
        value = a.split("=", 1)[1] if a.startswith("--context-length=") else None
        if a == "--context-length" and i + 1 < len(extra):
            value = extra[i + 1]
        if value is not None and value.isdigit():
            target_len = int(value)
    why = mismatch(read_config(args.draft), target_len)
    if why:
        raise BadInput(f"{args.draft / 'config.json'} vs {args.model / 'config.json'}: {why}")


def refuse_dtype_mismatch(args: argparse.Namespace) -> None:
    """SGLang runs target and drafter at one `--dtype`; `auto` can split them (float32 target)."""
    from remote_agent.eagle3.drafter.export.serve_dtype import dtype_mismatch
    from remote_agent.eagle3.drafter.model.context import read_config

    why = dtype_mismatch(read_config(args.model), read_config(args.draft), list(args.arg))
    if why:
        raise BadInput(f"{args.draft / 'config.json'} vs {args.model / 'config.json'}: {why}")


def run(args: argparse.Namespace) -> int:
    cmd, env = command(args)
    shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    print(f"launching: {shown + ' ' if shown else ''}{shlex.join(cmd)}", flush=True)
    if args.print:
        return 0
    if importlib.util.find_spec("sglang") is None:  # found without importing it (no CUDA init)
        raise BadInput(
            f"sglang is not installed for {sys.executable}; set the host's `python:` to the "
            "SGLang environment's interpreter"
        )
    if args.mode == "extract":
        args.dump_dir.mkdir(parents=True, exist_ok=True)
    os.execvpe(cmd[0], cmd, {**os.environ, **env})
    return 0  # not reached
