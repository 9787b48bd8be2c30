"""Attack: launch arguments that switch the prefill CUDA graph back on behind
`--disable-prefill-cuda-graph` (the dump hook never runs inside a graph replay, so extraction
would silently dump nothing). The oracle is SGLang's own resolver, compiled from each release's
wheel (0.5.14: ServerArgs._parse_cuda_graph_config; 0.5.23: arg_groups/cuda_graph_hook.py's
parse_cuda_graph_config) over its cuda_graph_config.py, on randomized flag sets and orders;
`sglang_versions.prefill_backend_from_args` must agree with it on every trial, and
`sglang-launch extract` must refuse exactly when the real backend is not "disabled"."""

from __future__ import annotations

import ast
import json
import random
import subprocess
import sys
import textwrap
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest

from remote_agent.eagle3 import sglang_versions as sv
from tests.conftest import SGLANG_VERSIONS, download_sglang_wheel

REPO = Path(__file__).resolve().parents[2]
BACKENDS = ("full", "breakable", "tc_piecewise", "disabled")


class _Args(types.SimpleNamespace):
    def __getattr__(self, name: str) -> Any:  # every other server arg at its "unset" value
        if name.startswith("__"):
            raise AttributeError(name)
        return None


def real_resolver(version: str):
    """f(flags) -> the prefill backend that release resolves (on a CUDA machine)."""
    with zipfile.ZipFile(download_sglang_wheel(version)) as z:
        cg = z.read("sglang/srt/model_executor/cuda_graph_config.py").decode()
        if version == "0.5.14":
            src, name = z.read("sglang/srt/server_args.py").decode(), "_parse_cuda_graph_config"
        else:
            src = z.read("sglang/srt/arg_groups/cuda_graph_hook.py").decode()
            name = "parse_cuda_graph_config"
    cg = cg.replace("from sglang.srt.runtime_context import get_exec", "get_exec = None")
    module = types.ModuleType(f"sglang_{version.replace('.', '_')}_cuda_graph_config")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    ns: dict[str, Any] = module.__dict__
    exec(compile(cg, "cuda_graph_config.py", "exec"), ns)
    ns["default_prefill_backend"] = lambda: ns["Backend"].BREAKABLE  # what is_cuda() picks
    fn = next(
        n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name == name
    )
    ns.update(
        Any=Any,
        resolving_view=lambda sa: sa,
        declare_resolution=lambda sa, _n, cuda_graph_config: setattr(sa, "cuda_graph_config", cuda_graph_config),
    )  # fmt: skip
    exec(compile(textwrap.dedent(ast.unparse(fn)), "resolver", "exec"), ns)
    resolve = ns[name]

    def run(flags: dict[str, Any]) -> str:
        sa = _Args(**flags)
        resolve(sa)
        return sa.cuda_graph_config.prefill.backend

    return run, run({})


def random_launch(rng: random.Random) -> tuple[list[str], dict[str, Any]]:
    """Extra launch arguments in a random order, and the parsed server args they mean."""
    pieces, flags = [], {}
    if rng.random() < 0.5:
        pieces.append(["--disable-cuda-graph"])
        flags["disable_cuda_graph"] = True
    if rng.random() < 0.7:
        pieces.append(["--disable-prefill-cuda-graph"])
        flags["disable_prefill_cuda_graph"] = True
    if rng.random() < 0.5:
        b = rng.choice(BACKENDS[1:])
        pieces.append(
            [f"--cuda-graph-backend-prefill={b}"]
            if rng.random() < 0.5
            else ["--cuda-graph-backend-prefill", b]
        )
        flags["cuda_graph_backend_prefill"] = b
    if rng.random() < 0.4:
        cfg = {"decode": {"backend": "full"}}
        if rng.random() < 0.7:
            cfg["prefill"] = {"backend": rng.choice(BACKENDS), "max_bs": 8}
        pieces.append(["--cuda-graph-config", json.dumps(cfg)])
        flags["cuda_graph_config"] = cfg
    rng.shuffle(pieces)
    return [a for p in pieces for a in p], flags


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_effective_prefill_backend_matches_sglangs_resolver(version, tally):
    resolve, default = real_resolver(version)
    rng = random.Random(f"prefill-{version}")
    seen = set()
    for _ in range(200):
        args, flags = random_launch(rng)
        ours = sv.prefill_backend_from_args(args)
        real = resolve(flags)
        seen.add(real)
        held = (ours if ours is not None else default) == real
        tally.trial(f"effective prefill CUDA graph ({version} resolver)", held)
        assert held, (args, ours, real)
    assert seen == set(BACKENDS)  # the trials reach every outcome, not one by luck


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_sglang_launch_refuses_exactly_the_graphs_the_release_would_run(version, tmp_path, tally):
    resolve, _ = real_resolver(version)
    model, draft = tmp_path / "m", tmp_path / "d"
    for d, cfg in ((model, {"num_hidden_layers": 8}), (draft, {})):
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
    rng = random.Random(f"launch-{version}")
    outcomes = set()
    for _ in range(10):
        extra, _flags = random_launch(rng)
        # what the launch really passes: its own off switch first, then the user's arguments
        _, flags = ["--disable-prefill-cuda-graph"], {"disable_prefill_cuda_graph": True, **_flags}
        proc = subprocess.run(
            [sys.executable, "-m", "remote_agent.eagle3", "sglang-launch", "extract", "--model", str(model),
             "--dump-dir", str(tmp_path / "x"), "--draft-model", str(draft), "--sglang-version", version,
             *[f"--arg={a}" for a in extra], "--print"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        runs_graph = resolve(flags) != "disabled"
        outcomes.add(runs_graph)
        held = (proc.returncode == 2) == runs_graph
        tally.trial(
            "sglang-launch extract refuses a prefill CUDA graph the release would run", held
        )
        assert held, (extra, proc.returncode, proc.stderr)
    assert outcomes == {True, False}  # refused and launched both happened
