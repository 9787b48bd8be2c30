"""`eagle3 <command>`: one entry point, each command in its own module, imported only when run.

A command module defines `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`.
Heavy imports (torch, transformers) happen inside `run`, so `eagle3 --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from remote_agent.eagle3.errors import EXIT_BAD_INPUT, Eagle3Error

# command -> module; kept in one table so `--help` lists everything without importing anything.
COMMANDS: dict[str, str] = {
    # data (issue: tokenize, merge, verify, vocab, regenerate)
    "tokenize": "remote_agent.eagle3.data.tokenize_cmd",
    "merge": "remote_agent.eagle3.data.merge_cmd",
    "verify": "remote_agent.eagle3.data.verify_cmd",
    "vocab": "remote_agent.eagle3.data.vocab_cmd",
    "regenerate": "remote_agent.eagle3.data.regenerate_cmd",
    # hidden states (patch, extraction, verification of dumps)
    "patch": "remote_agent.eagle3.patching.patch_cmd",
    "extract": "remote_agent.eagle3.extraction.extract_cmd",
    "verify-dumps": "remote_agent.eagle3.extraction.verify_dumps_cmd",
    "plan": "remote_agent.eagle3.plan",
    # drafter (training, export, evaluation)
    "train": "remote_agent.eagle3.drafter.train.train_cmd",
    "stream-reference": "remote_agent.eagle3.online.producer",
    "online-check": "remote_agent.eagle3.online.placement",
    "export": "remote_agent.eagle3.drafter.export.export_cmd",
    "eval": "remote_agent.eagle3.drafter.eval.eval_cmd",
    # serving checks against a live SGLang server
    "sglang-launch": "remote_agent.eagle3.serving.sglang_launch_cmd",
    "serve-check": "remote_agent.eagle3.serving.serve_check_cmd",
    "accept": "remote_agent.eagle3.serving.accept_cmd",
    # tiny targets for the demo and GPU runs
    "build-tiny": "remote_agent.eagle3.tiny.build_tiny_cmd",
}

_HELP: dict[str, str] = {
    "tokenize": "conversations -> input_ids + exact assistant loss masks (chat template)",
    "merge": "deterministic merge + shuffle of tokenized sources, with a manifest",
    "verify": "check a merged JSONL against its manifest (exit 0 only when it matches)",
    "vocab": "draft-vocabulary mapping (d2t/t2d) with a coverage report",
    "regenerate": "rewrite assistant turns through an OpenAI-compatible endpoint (resumable)",
    "patch": "status|apply|revert the SGLang deepseek_v2.py hidden-state dump patch",
    "extract": "dump aux + final hidden states (SGLang server or the HF reference backend)",
    "verify-dumps": "check a dump directory against the dataset",
    "plan": "dump size, extraction/training time, disk bandwidth a run needs (before renting)",
    "train": "train the EAGLE-3 drafter (training-time test; torchrun data parallel)",
    "stream-reference": "serve the HF reference extractor as an online-training stream producer",
    "online-check": "one-box online placement: SGLang memory fraction + trainer budget fit",
    "export": "write an SGLang-loadable drafter checkpoint, checked against the loader contract",
    "eval": "acceptance length of a drafter with a torch reference speculative decoder",
    "sglang-launch": "start SGLang in extraction mode or serving the drafter (the required flags)",
    "serve-check": "check that a live SGLang server runs EAGLE3 with the expected drafter",
    "accept": "acceptance length of a live SGLang EAGLE-3 server (MT-Bench-style prompts)",
    "build-tiny": "build a tiny tokenizer + DeepseekV3 target (demo, tests, GPU runs)",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eagle3", description="EAGLE-3 drafter pipeline commands (run on the GPU box)."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        p = sub.add_parser(name, help=_HELP[name], description=_HELP[name])
        if name == command:
            importlib.import_module(COMMANDS[name]).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Job logs are read by people and parsed by the engine: no carriage-return progress bars.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in COMMANDS:
        command = None
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    module = importlib.import_module(COMMANDS[args.command])
    try:
        return int(module.run(args) or 0)
    except Eagle3Error as exc:
        print(f"eagle3 {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"eagle3 {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
