"""The real-SGLang GPU check on CPU: its python parts (bench/gpu_sglang_check.py), its runbook
(runbooks/gpu-sglang-check.yaml: valid, and its 0.5.14 launch line accepted by the release) and
the script's shell (bench/gpu_sglang.sh). The GPU run itself is the integrator's."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_sglang_launch import flags_of

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "bench" / "gpu_sglang.sh"
RUNBOOK = REPO / "runbooks" / "gpu-sglang-check.yaml"


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location(
        "gpu_sglang_check", REPO / "bench" / "gpu_sglang_check.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sglang_keys_are_added_once(check, tmp_path):
    cfg = {"num_hidden_layers": 8, "rope_scaling": None,
           "rope_parameters": {"rope_type": "yarn", "factor": 64.0, "rope_theta": 10000.0}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    added = check.sglang_keys(tmp_path)
    assert added["moe_layer_freq"] == 1 and added["topk_method"] == "noaux_tc"
    assert added["rope_scaling"] == {"rope_type": "yarn", "factor": 64.0}
    assert check.sglang_keys(tmp_path) == {}  # idempotent
    assert json.loads((tmp_path / "config.json").read_text())["num_hidden_layers"] == 8


def test_prompts_are_single_turn_and_read_by_accept(check, tmp_path):
    from remote_agent.eagle3.serving import load_prompts

    data = tmp_path / "d.jsonl"
    rows = [
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
                      {"role": "assistant", "content": "a"}]},
        {"conversations": [{"from": "human", "value": "u2"}, {"from": "gpt", "value": "a"}]},
        {"messages": [{"role": "assistant", "content": "no user turn"}]},
        {"messages": [{"role": "user", "content": "u3"}]},
    ]  # fmt: skip
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert check.write_prompts(data, tmp_path / "p.jsonl", limit=2) == 2
    got = load_prompts(tmp_path / "p.jsonl", None)
    assert got == [[{"role": "user", "content": "u1"}], [{"role": "user", "content": "u2"}]]


def _dump(root: Path, samples: dict, layers=(2, 4, 5), h: int = 4) -> Path:
    import torch

    from remote_agent.eagle3.dense import DumpMeta, ShardWriter

    meta = DumpMeta(model="m", hidden_size=h, num_layers=8, aux_layer_ids=list(layers))
    w = ShardWriter(root, meta)
    for sid, (ids, aux, final) in samples.items():
        w.add(
            sid,
            torch.tensor(ids, dtype=torch.int32),
            aux.to(torch.bfloat16),
            final.to(torch.bfloat16),
        )
    w.flush()
    return root


def test_compare_dumps_figures(check, tmp_path):
    import torch

    aux = torch.full((3, 12), 2.0)
    final = torch.full((3, 4), 4.0)
    ref = _dump(tmp_path / "ref", {"a": ([1, 2, 3], aux, final), "b": ([4, 5], aux[:2], final[:2])})
    off = final.clone()
    off[1, 2] = 5.0  # one value 1.0 away of a tensor whose max is 4.0: rel 0.25
    sgl = _dump(tmp_path / "sgl", {"a": ([1, 2, 3], aux, off), "b": ([4, 5], aux[:2], final[:2])})
    r = check.compare_dumps(ref, sgl)
    assert r["ids_identical"] and r["samples_compared"] == 2
    assert r["max_abs_err"] == {"aux": 0.0, "final": 1.0}
    assert r["max_rel_err"] == {"aux": 0.0, "final": 0.25}
    out = tmp_path / "r.json"
    assert check.main(["compare-dumps", str(ref), str(sgl), "--out", str(out)]) == 1  # 0.25 > 0.1
    assert check.main(["compare-dumps", str(ref), str(sgl), "--out", str(out), "--max-rel-err", "0.3"]) == 0  # fmt: skip
    bad = _dump(tmp_path / "bad", {"a": ([1, 2, 9], aux, final), "b": ([4, 5], aux[:2], final[:2])})
    r = check.compare_dumps(ref, bad)
    assert not r["ids_identical"] and r["ids_differ"] == ["a"]
    other = _dump(tmp_path / "other", {"a": ([1, 2, 3], aux, final)}, layers=(2, 3, 5))
    assert not check.compare_dumps(ref, other)["ids_identical"]


def test_accept_lengths_agree_within_either_interval(check):
    s = {"accept_length": 2.1, "accept_length_ci95": [1.9, 2.3]}
    r = {"accept_length": 2.2, "accept_length_ci95": [2.0, 2.4]}
    assert check.agree(s, r) == {"sglang": 2.1, "reference": 2.2,
                                 "ci95": {"sglang": [1.9, 2.3], "reference": [2.0, 2.4]}, "agree": True}  # fmt: skip
    assert (
        check.agree(s, {"accept_length": 3.0, "accept_length_ci95": [2.8, 3.2]})["agree"] is False
    )
    assert check.agree(None, r)["agree"] is None


def test_report_has_every_key_issue_16_asks_for(check, tmp_path):
    work = tmp_path / "work"
    (work / "sglang-dumps" / "canary").mkdir(parents=True)
    (work / "server-info-extract.json").write_text(json.dumps({"context_length": 262144}))
    (work / "sglang-dumps" / "canary" / "vs-sglang.json").write_text(
        json.dumps({"bit_exact": True, "samples": 2, "shared_forward": True, "per_sample": []})
    )
    (work / "dumps-vs-reference.json").write_text(
        json.dumps(
            {"ids_identical": True, "max_abs_err": {"aux": 0.01}, "max_rel_err": {"aux": 0.001}}
        )
    )
    (work / "accept.json").write_text(
        json.dumps({"accept_length": 2.0, "accept_length_ci95": [1.8, 2.2]})
    )
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"steps": {"canary": {"status": "succeeded", "started_at": 10.0,
                                 "ended_at": 12.5, "exit_code": 0, "command": "python -m x"}}}))  # fmt: skip
    r = check.report(work, state, {"revert_byte_identical": True})
    assert r["sglang_version"] == "0.5.14" and r["target_context_length"] == 262144
    assert {"ids_identical", "max_abs_err", "max_rel_err"} <= set(r["dumps_vs_reference"])
    assert r["dumps_vs_sglang_hidden_states"]["bit_exact"] is True
    assert r["dumps_vs_sglang_hidden_states"]["samples"] == 2
    assert set(r["accept_length"]) >= {"sglang", "reference", "ci95"}
    assert r["accept_length"]["reference"] is None  # its file is missing: said, not invented
    assert r["revert_byte_identical"] is True
    assert r["stages"]["canary"] == {
        "status": "succeeded",
        "seconds": 2.5,
        "exit_code": 0,
        "message": "",
    }
    assert r["commands"]["canary"] == "python -m x"


def test_runbook_is_valid_and_its_0_5_14_launch_is_accepted(tmp_path):
    """The extraction-server step's command, interpolated, run with --print: exit 0 and every
    flag known to the real 0.5.14 wheel."""
    from runbook.loader import load_runbook
    from tests.conftest import download_sglang_wheel

    proc = subprocess.run(
        [sys.executable, "-m", "eagle_tui.cli", "validate", str(RUNBOOK)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    work = tmp_path / "w"
    rb = load_runbook(RUNBOOK, {"work": str(work)}).runbook
    for d, cfg in (("target/model", {"num_hidden_layers": 8}), ("init-drafter", {})):
        (work / d).mkdir(parents=True)
        (work / d / "config.json").write_text(json.dumps(cfg))
    step = next(s for s in rb.steps if s.id == "extraction-server")
    cmd = step.run.replace("python -m", f"{sys.executable} -m", 1) + " --print"
    out = subprocess.run(cmd, shell=True, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    used = set(re.findall(r" (--[a-z0-9-]+)", out.stdout))
    known = flags_of(download_sglang_wheel("0.5.14"))
    assert used <= known, used - known
    assert f"--speculative-draft-model-path {work / 'init-drafter'}" in out.stdout
    assert "--enable-return-hidden-states" in out.stdout  # the canary's comparison needs it
    ids = {s.id for s in rb.steps}
    assert {
        "canary",
        "compare-dumps",
        "serve-check",
        "accept",
        "reference-accept",
        "revert-patch",
    } <= ids


def test_script_shell_is_sound():
    text = SCRIPT.read_text()
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    # --json output goes to its own file: stderr (warnings, @@eagle3 records) merged into it is
    # what made the last run's patch-apply.json unparseable
    for line in text.splitlines():
        if "--json" in line and ">" in line:
            assert "2>&1" not in line, line
    assert "runbooks/gpu-sglang-check.yaml" in text and "--auto --yes" in text
    assert "STAGE" in text and "rich" in text  # the engine's deps are listed for the integrator
