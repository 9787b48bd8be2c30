"""The two-box pipeline on CPU (network namespaces, one OpenSSH sshd each; needs root and
iproute2): extraction on one box vs sharded over two, verify-dumps over the union, the drafter
trained by torchrun across both boxes vs one host with two ranks.

    sudo .venv/bin/python bench/bench_multibox.py [--samples 40] [--out bench/results/multibox.json]

Both boxes share this machine's CPUs, so wall_s_2host against wall_s_1host measures the
engine's fan-out and sharding overheads, not a speed-up (that needs two real boxes or GPUs;
`bench/bench_scale.py` measures 1 -> N ranks on one GPU box).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine_info import describe, save_result  # noqa: E402  (bench/ is sys.path[0] as a script)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.multibox.twobox import (  # noqa: E402
    TwoBoxes,
    final_state,
    max_abs_diff,
    runbook,
    train_config,
)

TOLERANCE = 1e-5


def _step_wall(state: dict, step: str) -> float:
    rec = state["steps"][step]
    return round(rec["ended_at"] - rec["started_at"], 2)


def _verify(dumps: Path, data: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "remote_agent.eagle3", "verify-dumps", str(dumps), "--dataset",
         data, "--json", "--no-values"],
        capture_output=True, text=True, cwd=REPO,
    ).stdout  # fmt: skip
    return json.loads(out[out.index("{") : out.rindex("}") + 1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "multibox.json")
    args = ap.parse_args()
    import torch

    from remote_agent.eagle3.drafter.eval.synthetic import build_inputs
    from remote_agent.eagle3.tiny.cache import ensure_tiny

    root = Path(tempfile.mkdtemp(prefix="bench-multibox-"))
    target = ensure_tiny("ci")
    torch.manual_seed(0)
    inputs = {
        **build_inputs(target, root / "inputs", n_samples=args.samples, prompt_tokens=24,
                       new_tokens=24, draft_vocab=128),
        "target": str(target),
    }  # fmt: skip
    boxes = TwoBoxes.start(root / "lab", str(os.getpid() % 100000))
    result: dict = {"hosts": 2, "samples": args.samples}
    try:
        walls = {}
        for n, fan in ((1, "[box0]"), (2, "[box0, box1]")):
            tmp = root / f"{n}host"
            work = tmp / "work"
            work.mkdir(parents=True)
            config = train_config(tmp / "train.json", inputs, work / "drafter-run")
            cli = boxes.cli(tmp)
            rb = cli.runbook(runbook(boxes, work, inputs, config, fan))
            t0 = time.monotonic()
            out = cli("run", str(rb), "--auto", timeout=900)
            walls[n] = {"exit": out.returncode, "run_s": round(time.monotonic() - t0, 2)}
            if out.returncode != 0:
                raise SystemExit(f"{n}-host run failed:\n{out.stdout[-4000:]}")
            state = cli.state_json()
            walls[n] |= {
                "extract_s": _step_wall(state, "extract"),
                "train_s": _step_wall(state, "train"),
            }
            walls[n]["work"] = work
            cli.cleanup()
        report = _verify(walls[2]["work"] / "hidden-states", inputs["data"])
        # the same training on one host with two ranks, on the 2-host run's dump
        ref = root / "ref-run"
        t0 = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
             "2", "-m", "remote_agent.eagle3", "train", "--config",
             str(root / "2host" / "train.json"), "--set",
             f"data.dump={walls[2]['work'] / 'hidden-states'}", "--out", str(ref)],
            check=True, capture_output=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        ref_s = round(time.monotonic() - t0, 2)
        a, b = final_state(walls[2]["work"] / "drafter-run"), final_state(ref)
        diff = max_abs_diff(a["model"], b["model"])
        result["extraction"] = {
            "samples_missing": report["missing"],
            "samples_duplicated": report["duplicates"],
            "samples_dumped": report["samples"],
            "verify_ok": report["ok"],
            "wall_s_1host": walls[1]["extract_s"],
            "wall_s_2host": walls[2]["extract_s"],
        }
        result["training"] = {
            "equal_to_single_host": diff <= TOLERANCE,
            "max_abs_diff": diff,
            "tolerance": TOLERANCE,
            "steps": a["global_step"],
            "wall_s_2host_torchrun": walls[2]["train_s"],
            "wall_s_1host_2ranks": ref_s,
        }
        result["runbook_wall_s"] = {"1host": walls[1]["run_s"], "2host": walls[2]["run_s"]}
    finally:
        boxes.close()
    result["machine"] = describe(
        note="both boxes are namespaces of this machine: same CPUs, same filesystem"
    )
    save_result(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
