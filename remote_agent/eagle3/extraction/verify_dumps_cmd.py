"""`eagle3 verify-dumps DIR --dataset OUT.jsonl`: every dataset sample present exactly once,
ids equal, shapes right, no NaN/Inf, no error markers; reports bytes per token. DIR may be a
sharded extraction's root (extraction/sharding.py): then the union of its shards is checked,
and each missing sample is reported with the shard that owes it.
With --model, also the final-state check (extraction/final_check.py): sampled supervised rows
`final` must predict the data's next token through the target's lm_head (rate at least
--min-final-agreement), and no sample may fall far below its own source's rate (named, with rows).
Exit codes: 0 the dump matches, 1 it does not, 2 bad input (no dump dir, no dataset)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from remote_agent.eagle3.errors import BadInput

HELP = "check a dump directory against the dataset"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dump", type=Path, help="dump directory (meta.json + shards/)")
    parser.add_argument(
        "--dataset", type=Path, required=True, help="the OUT.jsonl it was made from"
    )
    parser.add_argument(
        "--model",
        type=Path,
        help="the target model dir: refuse (exit 2, bad input) a dump of another model "
        "(its recorded identity, extraction/identity.py)",
    )
    parser.add_argument("--no-values", action="store_true", help="skip the NaN/Inf scan")
    parser.add_argument(
        "--final-samples", type=int, default=64, help="--model: samples the final check reads"
    )
    parser.add_argument(
        "--min-final-agreement",
        type=float,
        default=0.1,
        help="--model: the least fraction of sampled rows whose final predicts the next token "
        "(a corrupted or shifted final agrees at ~1/vocab; a trained target at its top-1 rate)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from remote_agent.eagle3.dense import DumpFormatError
    from remote_agent.eagle3.extraction.dataset import open_dataset
    from remote_agent.eagle3.extraction.shard_union import union_report
    from remote_agent.eagle3.extraction.sharding import parts_of
    from remote_agent.eagle3.extraction.verify import PROBLEMS, verify_dump
    from remote_agent.eagle3.progress import emit

    if not (args.dump / "meta.json").is_file() and not parts_of(args.dump):
        raise BadInput(f"{args.dump}: not a dump directory (no meta.json, no shard-I-of-N dumps)")
    dataset = open_dataset(args.dataset, require_manifest=False)
    if args.model is not None:
        from remote_agent.eagle3.extraction.identity import check_identity

        check_identity(args.dump, args.model, "verify-dumps")
    try:
        report = verify_dump(args.dump, dataset, check_values=not args.no_values)
    except DumpFormatError as exc:
        emit("result", ok=False, error=str(exc))
        print(f"verify-dumps: {exc}")
        return 1
    summary = report.to_json()
    final_ok = True
    if args.model is not None and (args.dump / "meta.json").is_file():
        final_ok = _final_state(args, dataset, summary)
    # a sharded extraction's root: which shard lacks what, and where each duplicate lies
    union = union_report(args.dump, dataset) if parts_of(args.dump) else []
    if union:
        summary["ok"], summary["shard_problems"] = False, union
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        verdict = "OK" if report.ok and not union else "FAILED"
        print(
            f"{verdict}: {report.samples} samples, {report.tokens} tokens, {report.shards} shards, "
            f"{summary['bytes_per_token']} B/token on disk (format {summary['meta_bytes_per_token']}"
            f", per-sample formats {summary['per_sample_format_bytes_per_token']})"
        )
        for key in PROBLEMS:
            if summary[key]:
                print(f"  {key}: {summary[key]} e.g. {summary[key + '_examples'][:5]}")
        for line in union:
            print(f"  {line}")
    emit("result", **summary)
    return 0 if report.ok and not union and final_ok else 1


def _final_state(args: argparse.Namespace, dataset, summary: dict) -> bool:
    from remote_agent.eagle3.dense import DumpReader
    from remote_agent.eagle3.extraction.final_check import check_against_data, load_lm_head

    reader = DumpReader(args.dump)
    try:
        check = check_against_data(reader, dataset, load_lm_head(args.model), args.final_samples)
    finally:
        reader.close()
    summary["final_state"] = check.to_json()
    problems = []
    if check.rows and check.rate < args.min_final_agreement:
        problems.append(
            f"the dumped final states predict the data's next token at {check.agree}/{check.rows} "
            f"sampled rows ({check.rate:.1%} < --min-final-agreement {args.min_final_agreement}): "
            f"they are not {args.model}'s states for these samples"
        )
    problems += check.low
    summary["final_state"]["problems"] = problems
    if problems:
        summary["ok"] = False
        if not args.json:
            print("final-state check FAILED:\n  " + "\n  ".join(problems[:10]))
    elif not args.json:
        print(f"final-state check: {check.agree}/{check.rows} sampled rows predict the next token")
    return not problems
