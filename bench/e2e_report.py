"""Summarise a finished pipeline run (the demo runbook, or its GPU-sized run) into one JSON:
wall time per stage from the audit log, throughput per stage from the jobs' result/metrics lines,
storage per token, and acceptance length before and after training.

    python3 bench/e2e_report.py --state-dir DIR [--run RUN_ID] --out bench/results/gpu-e2e.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from machine_info import describe, save_result  # noqa: E402

from remote_agent.eagle3.progress import parse  # noqa: E402
from runbook.audit import Head, read_records, verify  # noqa: E402
from runbook.state import list_runs  # noqa: E402


def records_of(log: Path, kind: str) -> list[dict]:
    if not log or not Path(log).exists():
        return []
    out = []
    for line in Path(log).read_text(errors="replace").splitlines():
        rec = parse(line)
        if rec and rec.get("kind") == kind:
            out.append(rec)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--state-dir", type=Path, required=True)
    ap.add_argument("--run")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    runs = list_runs(args.state_dir)
    run = next(r for r in reversed(runs) if args.run in (None, r.run_id))
    audit = args.state_dir / "runs" / run.run_id / "audit.jsonl"
    recs = read_records(audit)
    stages: dict[str, dict] = {}
    for r in recs:
        if r.get("event") == "step.state" and r.get("status") in ("succeeded", "failed", "lost"):
            stages[r["step"]] = {
                "status": r["status"],
                "wall_s": r.get("duration_s"),
                "reason": r.get("reason"),
            }
    for sid, rec in run.steps.items():
        results = records_of(rec.log_file, "result")
        if results:
            stages.setdefault(sid, {})["result"] = results[-1]
        metrics = records_of(rec.log_file, "metrics")
        if metrics:
            stages[sid]["last_metrics"] = metrics[-1]
    work = Path(run.vars["work"])
    report = {
        "run_id": run.run_id,
        "vars": run.vars,
        "machine": describe(),
        "audit_verifies": verify(audit, Head(run.audit_seq, run.audit_head)).ok,
        "stages": stages,
    }
    for name in ("eval.json", "target/tiny.json"):
        p = work / name
        if p.exists():
            report[name.split("/")[-1].removesuffix(".json")] = json.loads(p.read_text())
    ev = report.get("eval", {})
    ex = stages.get("extract", {}).get("result", {})
    tr = stages.get("train", {}).get("last_metrics", {})
    report["headline"] = {
        "accept_length_untrained": (ev.get("untrained") or {}).get("accept_length"),
        "accept_length_trained": (ev.get("trained") or {}).get("accept_length"),
        "lossless": (ev.get("trained") or {}).get("lossless"),
        "extract_tokens_per_s": ex.get("tokens_per_s"),
        "bytes_per_token": ex.get("bytes_per_token"),
        "train_tokens_per_s": tr.get("tokens_per_s"),
        "train_sim_accept_len": tr.get("sim_accept_len"),
        "target_train_tokens_per_s": (report.get("tiny", {}).get("train") or {}).get(
            "tokens_per_s"
        ),
        "wall_s": {k: v.get("wall_s") for k, v in stages.items()},
    }
    save_result(args.out, report)
    print(json.dumps(report["headline"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
