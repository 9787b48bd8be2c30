"""A stand-in training job for the TUI tests: numbered lines, eagle3 progress and metrics lines,
and an optional gate (it waits at line K until a file exists) so tests can act mid-job."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--lines", type=int, default=40)
    p.add_argument("--gate-at", type=int, default=0)
    p.add_argument("--gate-file", default="")
    p.add_argument("--interval", type=float, default=0.0)
    p.add_argument("--exit", type=int, default=0)
    a = p.parse_args()
    for i in range(1, a.lines + 1):
        if a.gate_at and i == a.gate_at and a.gate_file:
            print(f"waiting for {a.gate_file}", flush=True)
            while not os.path.exists(a.gate_file):
                time.sleep(0.05)
        print(f"train line {i:05d} of {a.lines}", flush=True)
        if i % 5 == 0:
            rec = {
                "kind": "metrics",
                "step": i,
                "loss": round(4.0 / (1 + i / 10), 4),
                "acc_k": [round(min(0.95, 0.3 + i / (100 + 20 * k)), 4) for k in range(3)],
                "sim_accept_len": round(1.0 + min(2.0, i / 25), 3),
            }
            print("@@eagle3 " + json.dumps(rec, separators=(",", ":")), file=sys.stderr, flush=True)
            prog = {
                "kind": "progress",
                "stage": "train",
                "done": i,
                "total": a.lines,
                "unit": "steps",
                "rate": 50.0,
                "eta_s": (a.lines - i) / 50.0,
            }
            print(
                "@@eagle3 " + json.dumps(prog, separators=(",", ":")), file=sys.stderr, flush=True
            )
        if a.interval:
            time.sleep(a.interval)
    print(
        "@@eagle3 " + json.dumps({"kind": "result", "steps": a.lines}), file=sys.stderr, flush=True
    )
    return a.exit


if __name__ == "__main__":
    sys.exit(main())
