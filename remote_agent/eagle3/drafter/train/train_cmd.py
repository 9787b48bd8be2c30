"""`eagle3 train --config FILE`: train the EAGLE-3 drafter (run alone or under torchrun)."""

from __future__ import annotations

import argparse

HELP = "train the EAGLE-3 drafter (training-time test; torchrun data parallel)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="training config (JSON or YAML); see --explain")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config field (JSON value), e.g. --set train.lr=5e-5; repeatable",
    )
    parser.add_argument("--out", help="= --set train.out_dir=OUT")
    parser.add_argument("--max-steps", type=int, help="= --set train.max_steps=N")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), help="= --set train.device=")
    parser.add_argument("--resume", help="auto | never | CHECKPOINT_DIR (= train.resume)")
    parser.add_argument(
        "--stop-after-step",
        type=int,
        help="checkpoint after step N and exit as if killed (resume tests)",
    )
    parser.add_argument(
        "--online",
        metavar="URL",
        help="train online: request samples from this producer (patched SGLang with "
        "EAGLE3_DUMP_MODE=stream, or `eagle3 stream-reference`) = --set online.server=URL",
    )
    parser.add_argument(
        "--stream", metavar="ADDR", help="with --online: listen here (unix:PATH | tcp:HOST:PORT)"
    )
    parser.add_argument("--explain", action="store_true", help="print every config field and exit")


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from remote_agent.eagle3.drafter.train import config as config_mod
    from remote_agent.eagle3.errors import BadInput
    from remote_agent.eagle3.progress import emit

    if args.explain:
        print(config_mod.explain())
        return 0
    if not args.config:
        raise BadInput("--config FILE is required (see `eagle3 train --explain`)")
    overrides = list(args.set)
    for flag, key in (
        ("out", "train.out_dir"),
        ("max_steps", "train.max_steps"),
        ("device", "train.device"),
        ("resume", "train.resume"),
        ("stop_after_step", "train.stop_after_step"),
        ("online", "online.server"),
        ("stream", "online.listen"),
    ):
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={json.dumps(value)}")
    cfg = config_mod.load(Path(args.config), overrides)

    from remote_agent.eagle3.drafter.train.loop import train

    result = train(cfg)
    import os

    if int(os.environ.get("RANK", "0")) == 0:
        emit("result", command="train", **result)
    return 0
