"""`eagle3 export CKPT --out DIR`: write an SGLang-loadable drafter, checked against the loader."""

from __future__ import annotations

import argparse

HELP = "write an SGLang-loadable drafter checkpoint, checked against the loader contract"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint",
        nargs="?",
        help="checkpoint directory (step-N) or a run directory (newest); not with --init",
    )
    parser.add_argument(
        "--out", required=True, help="output directory (config.json + model.safetensors)"
    )
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument(
        "--layer-prefix",
        default="midlayer",
        choices=("midlayer", "layers.0"),
        help="name of the decoder layer in the checkpoint (SGLang accepts both)",
    )
    parser.add_argument(
        "--target",
        help="target model directory: check the drafter's context length against its config.json "
        "(default: the length recorded at training)",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing output directory")
    init = parser.add_argument_group(
        "--init: an untrained drafter for --target, no dump needed (SGLang 0.5.14 captures "
        "hidden states for extraction only with a drafter loaded)"
    )
    init.add_argument("--init", action="store_true", help="export an untrained drafter")
    init.add_argument(
        "--config", help="--init: the training config (drafter section, e.g. tiny-gpu)"
    )
    init.add_argument("--vocab", help="--init: the draft-vocabulary mapping (eagle3 vocab)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from remote_agent.eagle3.drafter.export.export import export_checkpoint
    from remote_agent.eagle3.progress import emit

    if args.init:
        from remote_agent.eagle3.drafter.export.untrained import init_export
        from remote_agent.eagle3.errors import BadInput

        if args.checkpoint or not (args.config and args.target):
            raise BadInput("--init takes --config and --target (and --vocab), not a checkpoint")
        result = init_export(
            Path(args.config), Path(args.target), args.vocab, Path(args.out), args.force
        )
        print(
            f"eagle3 export: {result['out']} (untrained, {result['tensors']} tensors, contract ok)"
        )
        emit("result", command="export", **result)
        return 0
    if not args.checkpoint:
        from remote_agent.eagle3.errors import BadInput

        raise BadInput("give a checkpoint (or a run directory), or --init")
    result = export_checkpoint(
        Path(args.checkpoint),
        Path(args.out),
        args.dtype,
        args.layer_prefix,
        args.force,
        Path(args.target) if args.target else None,
    )
    print(f"eagle3 export: {result['out']} ({result['tensors']} tensors, contract ok)")
    print(f"serve with: {result['serve_flags']}")
    emit("result", command="export", **result)
    return 0
