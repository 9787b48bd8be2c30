"""Per-release extraction facts (remote_agent/eagle3/sglang_versions.py) against the real wheels:
0.5.14 extracts through an EAGLE3 drafter, both releases resolve the prefill CUDA-graph backend
with the same precedence, and the server_info check reads each release's shape."""

from __future__ import annotations

import ast
import json
import re
import zipfile
from pathlib import Path

import pytest
from test_sglang_launch import flags_of, launch

from remote_agent.eagle3 import sglang_versions as sv
from remote_agent.eagle3.errors import BadInput
from remote_agent.eagle3.extraction import server as srv


def _src(wheel: Path, rel: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        return z.read(rel).decode()


def _func(tree: ast.AST, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


@pytest.fixture
def target_and_drafter(tmp_path):
    def make(ids, layers: int = 8):
        model, draft = tmp_path / "target", tmp_path / "drafter"
        for d in (model, draft):
            d.mkdir(exist_ok=True)
        (model / "config.json").write_text(json.dumps({"num_hidden_layers": layers}))
        cfg = {"architectures": ["LlamaForCausalLMEagle3"]}
        if ids is not None:
            cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
        (draft / "config.json").write_text(json.dumps(cfg))
        return model, draft

    return make


def _env(line: str, key: str) -> str:
    m = re.search(rf"{key}=(\S+)", line)
    assert m, line
    return m.group(1)


# ---- 0.5.14: extraction through a drafter ----


def test_extract_launch_flags_per_release(tmp_path, sglang_release, target_and_drafter):
    version, wheel = sglang_release
    model, draft = target_and_drafter([2, 4, 5])
    out = launch(
        "extract", "--model", str(model), "--dump-dir", str(tmp_path / "d"),
        "--sglang-version", version, "--draft-model", str(draft), "--tp", "1",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    used = set(re.findall(r" (--[a-z0-9-]+)", line))
    assert used <= flags_of(wheel), (
        f"flags sglang {version} does not know: {used - flags_of(wheel)}"
    )
    assert "--speculative-algorithm EAGLE3" in line and "--disable-prefill-cuda-graph" in line
    assert "--chunked-prefill-size -1" in line and "--disable-radix-cache" in line
    if version == "0.5.14":
        assert f"--speculative-draft-model-path {draft}" in line
        assert (
            "--speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 2"
            in line
        )
        assert "--enable-return-aux-hidden-states" not in line
        assert _env(line, "EAGLE3_DUMP_LAYER_IDS") == "2,4,5"
    else:  # the drafter is not needed there (and not passed)
        assert "--enable-return-aux-hidden-states" in line and str(draft) not in line


@pytest.mark.parametrize(
    ("ids", "expected"),
    [([2, 4, 5], "2,4,5"), ([1, 3, 4], "2,4,5"), (None, "2,6,9"), ([3, 6, 9], "3,6,9")],
)
def test_0_5_14_hook_expects_the_layers_the_drafter_makes_sglang_capture(
    tmp_path, target_and_drafter, ids, expected
):
    """eagle_config ids with SGLang's +1 rule; no ids: the default [2, L//2, L-3]."""
    model, draft = target_and_drafter(ids, layers=12)
    out = launch(
        "extract", "--model", str(model), "--dump-dir", str(tmp_path / "d"),
        "--sglang-version", "0.5.14", "--draft-model", str(draft),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert _env(out.stdout, "EAGLE3_DUMP_LAYER_IDS") == expected


def test_0_5_14_refusals(tmp_path, target_and_drafter):
    model, draft = target_and_drafter([2, 4, 5])
    base = ["extract", "--model", str(model), "--dump-dir", str(tmp_path / "d")]
    base += ["--sglang-version", "0.5.14"]
    out = launch(*base)
    assert out.returncode == 2 and "--draft-model" in out.stderr and out.stdout == ""
    out = launch(*base, "--draft-model", str(tmp_path))  # a directory without config.json
    assert out.returncode == 2 and "no config.json" in out.stderr
    out = launch(*base, "--draft-model", str(draft), "--layers", "2,3,5")
    assert out.returncode == 2 and "[2, 4, 5]" in out.stderr and "--layers" in out.stderr


# ---- the effective prefill CUDA-graph backend ----


@pytest.mark.parametrize(
    "extra",
    [
        ["--arg=--cuda-graph-backend-prefill=breakable"],
        ["--arg=--cuda-graph-backend-prefill", "--arg=tc_piecewise"],
        ["--arg=--cuda-graph-config", '--arg={"prefill": {"backend": "breakable"}}'],
    ],
)
def test_extract_refuses_a_prefill_graph_that_overrides_the_off_switch(
    tmp_path, sglang_release, target_and_drafter, extra
):
    version, _ = sglang_release
    model, draft = target_and_drafter([2, 4, 5])
    out = launch(
        "extract", "--model", str(model), "--dump-dir", str(tmp_path / "d"),
        "--sglang-version", version, "--draft-model", str(draft), *extra,
    )  # fmt: skip
    assert out.returncode == 2, out.stdout
    assert "effective prefill CUDA-graph backend" in out.stderr and out.stdout == ""


def test_prefill_backend_resolution():
    r = sv.prefill_backend_from_args
    assert r(["--disable-prefill-cuda-graph"]) == "disabled"
    assert r(["--disable-prefill-cuda-graph", "--cuda-graph-backend-prefill", "full"]) == "full"
    assert r(["--cuda-graph-backend-prefill=breakable", "--disable-prefill-cuda-graph"]) == (
        "breakable"  # precedence, not order: the backend flag wins over the off switch
    )
    cfg = json.dumps({"prefill": {"backend": "disabled"}})
    assert r(["--cuda-graph-backend-prefill=full", "--cuda-graph-config", cfg]) == "disabled"
    assert r([]) is None
    with pytest.raises(BadInput, match="not JSON"):
        r(["--cuda-graph-config", "{"])
    info = sv.prefill_backend_from_info
    # the resolved config the server reports is authoritative over the flags
    assert info({"disable_prefill_cuda_graph": True, "cuda_graph_config": {"prefill": {"backend": "full"}}}) == "full"  # fmt: skip
    assert info({"disable_prefill_cuda_graph": True}) == "disabled"
    assert (
        info({"disable_prefill_cuda_graph": True, "cuda_graph_backend_prefill": "full"}) == "full"
    )
    assert info({"disable_cuda_graph": True}) == "disabled"


def test_the_precedence_is_the_one_in_each_release(sglang_release):
    """defaults < --disable-cuda-graph < --disable-prefill-cuda-graph < --cuda-graph-backend-
    prefill < --cuda-graph-config, read off the resolver in the real wheel."""
    version, wheel = sglang_release
    if version == "0.5.14":
        fn = _func(ast.parse(_src(wheel, "sglang/srt/server_args.py")), "_parse_cuda_graph_config")
    else:
        tree = ast.parse(_src(wheel, "sglang/srt/arg_groups/cuda_graph_hook.py"))
        fn = _func(tree, "parse_cuda_graph_config")
    keys = (
        "disable_cuda_graph",
        "disable_prefill_cuda_graph",
        "cuda_graph_backend_prefill is not None",
        "explicit_input.items()",
    )
    order = []
    for node in fn.body:
        if isinstance(node, ast.If):
            head = ast.unparse(node.test)
        elif isinstance(node, ast.For):
            head = ast.unparse(node.iter)
        else:
            continue
        order += [k for k in keys if head.endswith(k)]
    assert order == [
        "disable_cuda_graph",
        "disable_prefill_cuda_graph",
        "cuda_graph_backend_prefill is not None",
        "explicit_input.items()",
    ]


# ---- the server_info check per release ----

_COMMON = {
    "disable_radix_cache": True,
    "chunked_prefill_size": -1,
    "cuda_graph_config": {"prefill": {"backend": "disabled"}},
    "tp_size": 1,
    "pp_size": 1,
}


def test_check_flags_reads_a_0_5_14_server():
    ok = {**_COMMON, "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/d"}
    assert srv.check_flags(ok) == []
    (problem,) = srv.check_flags({**ok, "speculative_algorithm": None})
    assert "--draft-model" in problem
    (problem,) = srv.check_flags({**ok, "speculative_draft_model_path": None})
    assert "captures only with an EAGLE3 drafter" in problem
    graph = {**ok, "disable_prefill_cuda_graph": True}
    graph["cuda_graph_config"] = {"prefill": {"backend": "breakable"}}
    (problem,) = srv.check_flags(graph)
    assert "'breakable'" in problem and "--disable-prefill-cuda-graph" in problem


def test_check_flags_reads_a_0_5_23_server():
    ok = {**_COMMON, "enable_return_aux_hidden_states": True}
    assert srv.check_flags(ok) == []
    (problem,) = srv.check_flags({**ok, "enable_return_aux_hidden_states": False})
    assert "--enable-return-aux-hidden-states" in problem
    assert srv.check_flags({k: v for k, v in _COMMON.items()})  # neither shape: refused


@pytest.fixture(scope="module")
def wheel_0_5_14() -> Path:
    from tests.conftest import download_sglang_wheel

    return download_sglang_wheel("0.5.14")


def test_0_5_14_server_info_keys_exist_in_its_server_args(wheel_0_5_14):
    """The keys capture_problems / prefill_backend_from_info read are ServerArgs fields (0.5.23's
    are pinned in test_patch_wheel.py)."""
    wheel = wheel_0_5_14
    text = _src(wheel, "sglang/srt/server_args.py")
    fields = set(re.findall(r"^    ([a-z][a-z0-9_]*): ", text, re.M))
    assert {
        "speculative_algorithm",
        "speculative_draft_model_path",
        "cuda_graph_config",
        "disable_prefill_cuda_graph",
        "cuda_graph_backend_prefill",
        "disable_radix_cache",
        "chunked_prefill_size",
        "enable_return_hidden_states",
    } <= fields
    assert "enable_return_aux_hidden_states" not in fields


def test_0_5_14_captures_through_the_drafter_and_dumps_only_the_target_prefill(wheel_0_5_14):
    """What the 0.5.14 extraction path relies on, read from the real files."""
    wheel = wheel_0_5_14
    runner = _src(wheel, "sglang/srt/model_executor/model_runner.py")
    assert 'eagle_config["eagle_aux_hidden_state_layer_ids"]' in re.sub(r"\s", "", runner)
    # the target's prefill forward runs with full capture; its later forwards are verifies
    worker = _func(
        ast.parse(_src(wheel, "sglang/srt/speculative/eagle_worker_v2.py")),
        "forward_batch_generation",
    )
    text = ast.unparse(worker)
    assert "CaptureHiddenMode.FULL" in text and "target_worker.forward_batch_generation" in text
    # no EAGLE3 drafter class reaches the patched DeepseekV2ForCausalLM.forward
    for rel in ("sglang/srt/models/kimi_k25_eagle3.py", "sglang/srt/models/llama_eagle3.py"):
        tree = ast.parse(_src(wheel, rel))
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            bases = {ast.unparse(b) for b in cls.bases}
            assert not bases & {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"}, (rel, cls.name)
    # DeepseekV3 defaults the draft path to the target (MTP) and needs all three spec numbers
    hook = ast.unparse(
        _func(ast.parse(_src(wheel, "sglang/srt/arg_groups/speculative_hook.py")), "_handle_eagle_family")
    )  # fmt: skip
    assert "speculative_draft_model_path = server_args.model_path" in hook
    assert "server_args.speculative_eagle_topk is None" in hook
    # the aux states reach the hook as a list the logits processor concatenates (compat.py)
    lp = _src(wheel, "sglang/srt/layers/logits_processor.py")
    assert "aux_hidden_states = torch.cat(aux_hidden_states, dim=-1)" in lp
