"""`eagle3 eval`: acceptance length of an exported drafter with the torch reference decoder."""

from __future__ import annotations

import argparse

HELP = "acceptance length of a drafter with a torch reference speculative decoder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="target model directory (HF safetensors)")
    parser.add_argument(
        "--drafter", required=True, help="exported drafter directory (eagle3 export)"
    )
    parser.add_argument(
        "--data", required=True, help="tokenized JSONL; prompts = tokens before the answer"
    )
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3, help="speculative-num-steps")
    parser.add_argument("--topk", type=int, default=1, help="speculative-eagle-topk (chain: 1)")
    parser.add_argument("--draft-tokens", type=int, default=4, help="speculative-num-draft-tokens")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument(
        "--dtype", default="fp32", choices=("fp32", "bf16"), help="target and drafter"
    )
    parser.add_argument("--split", default="all", choices=("all", "holdout", "train"))
    parser.add_argument(
        "--holdout-fraction",
        type=float,
        default=None,
        help="as data.holdout_fraction (default: the value the drafter was trained with, from "
        "its eagle3_export.json)",
    )
    parser.add_argument(
        "--compare-untrained",
        action="store_true",
        help="also measure a freshly initialised drafter of the same config (before/after)",
    )
    parser.add_argument(
        "--reference",
        default="forward",
        choices=("forward", "full"),
        help="losslessness: one teacher-forced forward (default) or token-by-token greedy too",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=16,
        help="prompts decoded together (one target forward per round for all; same tokens)",
    )
    parser.add_argument("--min-accept-length", type=float, help="fail (exit 1) below this")
    parser.add_argument("--out", help="write the report JSON here")


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    import torch

    from remote_agent.eagle3.drafter.eval.evaluate import run_eval
    from remote_agent.eagle3.errors import Failed
    from remote_agent.eagle3.progress import emit

    device = (
        args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    if device == "cpu":
        from remote_agent.eagle3.drafter.train.loop import cpu_threads

        cpu_threads()
    holdout = args.holdout_fraction
    export_info = Path(args.drafter) / "eagle3_export.json"
    if holdout is None and export_info.exists():
        holdout = json.loads(export_info.read_text()).get("holdout_fraction")
    if args.split != "all" and not holdout:
        from remote_agent.eagle3.errors import BadInput

        raise BadInput(
            f"--split {args.split} needs the training holdout fraction: the drafter's "
            "eagle3_export.json does not record one; pass --holdout-fraction"
        )
    report = run_eval(
        Path(args.target),
        Path(args.drafter),
        Path(args.data),
        num_prompts=args.num_prompts,
        max_new_tokens=args.max_new_tokens,
        steps=args.steps,
        topk=args.topk,
        draft_tokens=args.draft_tokens,
        device=device,
        dtype=args.dtype,
        split=args.split,
        holdout_fraction=holdout or 0.0,
        compare_untrained=args.compare_untrained,
        reference=args.reference,
        batch=args.batch,
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    for name in ("trained", "untrained"):
        if name in report:
            r = report[name]
            print(
                f"eagle3 eval [{name}]: accept length {r['accept_length']} "
                f"({r['completion_tokens']} tokens / {r['verify_steps']} verify steps), "
                f"per position {r['accepted_at_position']}, lossless {r['lossless']}; "
                f"teacher-forced on the same tokens {r['teacher_forced']['sim_accept_length']}"
            )
    summary = {
        "accept_length": report["trained"]["accept_length"],
        "lossless": report["trained"]["lossless"],
        "prompts": report["prompts"],
        "sim_accept_length": report["trained"]["teacher_forced"]["sim_accept_length"],
    }
    if "untrained" in report:
        summary["untrained_accept_length"] = report["untrained"]["accept_length"]
    emit("result", command="eval", **summary)
    lossy = [n for n in ("trained", "untrained") if n in report and not report[n]["lossless"]]
    if lossy:
        raise Failed(
            f"speculative output differs from greedy decoding ({', '.join(lossy)}): "
            f"{report[lossy[0]]['mismatches'][:3]}"
        )
    if (
        args.min_accept_length is not None
        and (report["trained"]["accept_length"] or 0) < args.min_accept_length
    ):
        raise Failed(
            f"accept length {report['trained']['accept_length']} < --min-accept-length {args.min_accept_length}"
        )
    return 0
