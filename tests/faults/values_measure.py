"""Measure the injection sweep (tests/faults/values_sweep.py) against the checkout on PYTHONPATH.

    PYTHONPATH=/path/to/checkout python tests/faults/values_measure.py [--seed 25] [--per-form 6]

For each trial the checkout's loader reads the runbook with `--set x=VALUE`; a refused one is
counted refused; an accepted one is executed as the agent would (`/bin/sh -c` on the executing
form with the step's env, or the argv) once under dash and once under bash run as `sh` (its
POSIX mode, as on a box whose /bin/sh is bash), and counted broken if its canary appeared. This
measures without the engine so that a checkout before typed values (which accepts most trials)
is quick to measure; tests/faults/test_values_sweep.py runs the same trials through the real
engine and agent. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("values_sweep", _HERE / "values_sweep.py")
assert _spec and _spec.loader
sweep = importlib.util.module_from_spec(_spec)
sys.modules["values_sweep"] = sweep  # its dataclasses look their module up
_spec.loader.exec_module(sweep)

SHELLS = {"dash": ["/usr/bin/dash"], "bash": ["/usr/bin/bash"]}


PLAIN = False  # --plain: every variable written `x: v1` (a checkout without declared types)


def runbook_text(form, var: str = "x", default: str = "v1") -> str:
    """The one-step runbook of a form (also used by the sweep test)."""
    plain = form.decl == "word" or PLAIN
    decl = default if plain else json.dumps({"type": "text", "value": default})
    step = {"id": "t", "title": "sweep trial", "run": form.run}
    if form.env:
        step["env"] = form.env
    return f"name: sweep\nvars:\n  {var}: {decl}\nsteps:\n  - {json.dumps(step)}\n"


def _execute(loaded, shell: str, cwd: Path) -> None:
    step = loaded.runbook.steps[0]
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd)}
    env |= dict(step.env) | dict(getattr(step, "run_env", {}) or {})
    if isinstance(step.run, list):
        argv, exe = list(step.run), None
    else:
        argv, exe = ["sh", "-c", getattr(step, "run_exec", None) or step.run], SHELLS[shell][0]
    try:
        subprocess.run(
            argv, executable=exe, env=env, cwd=cwd, capture_output=True, timeout=10,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (subprocess.TimeoutExpired, OSError):
        pass


def one(form, value_tpl: str, root: Path, k: int) -> dict:
    from runbook.loader import RunbookError, load_text

    d = root / f"t{k}"
    (d / "tmp").mkdir(parents=True)
    canary = d / "canary"
    sweep.prepare(str(d), str(canary))
    value = sweep.PREPARED.get(value_tpl, value_tpl).format(c=canary, d=d)
    text = runbook_text(form).replace("{o}", str(d / "out"))
    try:
        loaded = load_text(text, str(d / "sweep.yaml"), {"x": value})
    except RunbookError:
        return {"form": form, "refused": True, "broke": {}}
    broke = {}
    for shell in SHELLS:
        canary.unlink(missing_ok=True)
        _execute(loaded, shell, d)
        broke[shell] = canary.exists()
    return {"form": form, "refused": False, "broke": broke}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=25)
    ap.add_argument("--per-form", type=int, default=6)
    ap.add_argument("--plain", action="store_true", help="no declared types (a checkout before)")
    args = ap.parse_args()
    global PLAIN
    PLAIN = args.plain
    trials = sweep.trials(args.seed, args.per_form)
    with (
        tempfile.TemporaryDirectory(prefix="values-measure-") as tmp,
        ThreadPoolExecutor(max_workers=2) as pool,
    ):
        results = list(
            pool.map(lambda kv: one(kv[1][0], kv[1][1], Path(tmp), kv[0]), enumerate(trials))
        )
    out: dict = {"checkout": os.environ.get("PYTHONPATH", ""), "trials": len(results)}
    out["refused"] = sum(r["refused"] for r in results)
    for shell in SHELLS:
        bad = [r for r in results if r["broke"].get(shell)]
        out[f"broke_{shell}"] = len(bad)
        shapes = {(r["form"].kind, str(r["form"].run), str(r["form"].env)) for r in bad}
        out[f"shapes_broken_{shell}"] = len(shapes)  # a form under either declaration
        out[f"broken_shapes_{shell}"] = sorted(f"{k}: {run} {env}" for k, run, env in shapes)
        out[f"broke_{shell}_by_class"] = dict(Counter(r["form"].attack for r in bad))
    out["forms"] = len(sweep.forms())
    out["shapes"] = len({(f.kind, str(f.run), str(f.env)) for f in sweep.forms()})
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
