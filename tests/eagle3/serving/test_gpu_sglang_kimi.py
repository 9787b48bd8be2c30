"""The Kimi-K2.5 wrapper check on CPU (issue 26): runbooks/gpu-sglang-check-kimi.yaml is valid,
its extraction and both serving launches are accepted by the real 0.5.14 wheel's flags for a
Kimi-shaped target, the report has every key the issue asks for, bench/gpu_sglang_kimi.sh is
sound, and the headless summary names the steps an --only run left pending."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys

import pytest
from test_sglang_launch import flags_of

from tests.support.paths import REPO

RUNBOOK = REPO / "runbooks" / "gpu-sglang-check-kimi.yaml"


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location(
        "gpu_sglang_check", REPO / "bench" / "gpu_sglang_check.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_runbook_launches_are_accepted_by_0_5_14(tmp_path):
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
    wrapper = {"model_type": "kimi_k25", "dtype": "bfloat16",
               "text_config": {"num_hidden_layers": 8, "dtype": "bfloat16",
                               "max_position_embeddings": 262144}}  # fmt: skip
    drafter = {"dtype": "bfloat16", "max_position_embeddings": 262144}
    for d, cfg in (("target/model", wrapper), ("init-drafter", drafter)):
        (work / d).mkdir(parents=True)
        (work / d / "config.json").write_text(json.dumps(cfg))
    for f in ("llama", "mla"):
        (work / f"drafter-{f}").mkdir()
        (work / f"drafter-{f}" / "config.json").write_text(json.dumps(drafter))
    known = flags_of(download_sglang_wheel("0.5.14"))
    steps = {s.id: s for s in rb.steps}
    for sid in ("extraction-server", "serve-drafter-llama", "serve-drafter-mla"):
        cmd = steps[sid].run.replace("python -m", f"{sys.executable} -m", 1) + " --print"
        out = subprocess.run(cmd, shell=True, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, (sid, out.stderr)
        used = set(re.findall(r" (--[a-z0-9-]+)", out.stdout))
        assert used <= known, (sid, used - known)
        # the vision tower would pick fa3, whose kernel is not staged
        assert "--mm-attention-backend triton_attn" in out.stdout
        if sid == "extraction-server":
            assert "--disable-cuda-graph" in out.stdout and "--trust-remote-code" in out.stdout
        else:
            assert "--speculative-algorithm EAGLE3" in out.stdout
    assert "--trust-remote-code" in steps["tokenize"].run
    assert "--model" in steps["verify-dumps"].run  # the final-state check against the data
    # the MLA flavour serves first, and each server stops before the next starts (one port)
    order = [s.id for s in rb.steps]
    assert order.index("stop-serving-mla") < order.index("serve-drafter-llama")
    assert (
        "tiny-kimi-gpu-mla" in steps["train-mla"].run
        and "kimi-k25-gpu" in steps["build-target"].run
    )


def test_kimi_report_has_every_key_issue_26_asks_for(check, tmp_path):
    w = tmp_path / "w"
    (w / "target" / "model").mkdir(parents=True)
    (w / "target" / "model" / "config.json").write_text(
        json.dumps({"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25"})
    )
    (w / "target" / "model" / "tiktoken.model").write_text("")
    (w / "target" / "model" / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "TikTokenTokenizer",
                    "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}})
    )  # fmt: skip
    canary = w / "sglang-dumps" / "canary"
    canary.mkdir(parents=True)
    (canary / "vs-sglang.json").write_text(
        json.dumps({"bit_exact": True, "samples": 4,
                    "final_state_check": {"prompts": 4, "argmax_matches": 4, "exact_matches": 4}})
    )  # fmt: skip
    for f, acc in (("llama", 1.8), ("mla", 1.7)):
        stats = {"accept_length": acc, "accept_length_ci95": [acc - 0.2, acc + 0.2]}
        (w / f"accept-{f}.json").write_text(json.dumps(stats))
        (w / f"reference-accept-{f}.json").write_text(json.dumps(stats))
        (w / f"serve-check-{f}.txt").write_text(f"serving EAGLE3 with drafter-{f}\n")
        (w / f"drafter-{f}").mkdir()
        (w / f"drafter-{f}" / "config.json").write_text(json.dumps({"architectures": [f]}))
    run = w / "drafter-run-llama"  # the trainer's metrics say whether a drafter learned at all
    run.mkdir()
    recs = [
        {"step": s, "loss": 9.0 - s, "sim_accept_len": 1.0 + s / 10, "lr": 1e-3} for s in (1, 2)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + "{torn")
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"steps": {}}))
    base = check.report(w, state, {"revert_byte_identical": True, "calls": 2})
    assert check.kimi_report(w, base, ["llama"])["online"]["status"] == "not run"
    side = {"tokens_per_s": 9.0, "disk_bytes_written": 0, "accept_length": 1.2}
    (w / "online.json").write_text(json.dumps({
        "online": side, "offline": {**side, "disk_bytes_written": 5},
        "equal_to_offline": True, "max_abs_diff_final_weights": 0.0,
        "sglang_version": "0.5.14"}))  # fmt: skip
    r = check.kimi_report(w, base, ["llama", "mla"])
    assert r["online"]["equal_to_offline"] is True and r["online"]["sglang_version"] == "0.5.14"
    assert r["online"]["offline"]["disk_bytes_written"] == 5
    assert r["target_architecture"] == "KimiK25ForConditionalGeneration"
    assert r["tokenizer"] == {"kind": "tiktoken", "class": "TikTokenTokenizer",
                              "remote_code": "tokenization_kimi.TikTokenTokenizer"}  # fmt: skip
    assert r["final_state_check"]["prompts"] == r["final_state_check"]["argmax_matches"] == 4
    assert r["dumps_vs_sglang_hidden_states"]["bit_exact"] is True
    for f in ("llama", "mla"):
        d = r["drafters"][f]
        assert {"accept_length", "reference_accept_length", "ci95", "serve_check"} <= set(d)
        assert d["agree"] is True and d["serve_check"].startswith("serving EAGLE3")
    assert r["drafters"]["llama"]["training"] == {"step": 2, "loss": 7.0, "sim_accept_len": 1.2}
    assert r["drafters"]["mla"]["training"] is None  # no run: said, not invented
    assert r["revert_byte_identical"] is True and r["calls"] == 2
    for key in ("sglang_version", "dumps_vs_reference", "w4a16"):
        assert key in r


def test_online_bench_rides_the_extraction_server():
    """Issue 30's GPU bench costs no second server start: the extraction server runs in mode
    both, streams where online-bench listens, and is stopped only after it; its result comes
    back beside the report (not inside bundle.tgz)."""
    from runbook.loader import load_runbook

    rb = load_runbook(RUNBOOK, {"work": "/w"}).runbook
    steps = {s.id: s for s in rb.steps}
    order = [s.id for s in rb.steps]
    server = steps["extraction-server"]
    assert server.env["EAGLE3_DUMP_MODE"] == "both"
    stream = server.env["EAGLE3_STREAM_ADDR"]
    bench = steps["online-bench"]
    assert f"--stream {stream}" in bench.run and "--server http://127.0.0.1:30000" in bench.run
    assert "--dump /w/sglang-dumps" in bench.run and bench.uses == ["extraction-server"]
    assert order.index("verify-dumps") < order.index("online-bench")  # checked dump first
    assert order.index("online-bench") < order.index("stop-extraction-server")
    # a bench killed mid-run (budget cut) cannot move its samples out: clean-dump does, after
    # the server stopped and before either drafter trains on the dump
    assert "--sweep-only --dump /w/sglang-dumps" in steps["clean-dump"].run
    assert steps["clean-dump"].requires == ["stop-extraction-server"]
    for f in ("mla", "llama"):
        assert "clean-dump" in steps[f"train-{f}"].requires
    assert sum(1 for s in rb.steps if s.service is not None and "extract" in (s.run or "")) == 1
    assert bench.timeout is not None
    kimi = (REPO / "bench" / "gpu_sglang_kimi.sh").read_text()
    assert 'KEEP_FILES="${KEEP_FILES:-online.json}"' in kimi
    assert "KEEP_FILES" in (REPO / "bench" / "gpu_sglang.sh").read_text()


def test_kimi_script_shell_is_sound():
    script = REPO / "bench" / "gpu_sglang_kimi.sh"
    for sh in (script, REPO / "bench" / "rehearse_kimi_cpu.sh",
               REPO / "bench" / "gpu_online_sglang.sh"):  # fmt: skip
        assert subprocess.run(["bash", "-n", str(sh)]).returncode == 0, sh
    text = script.read_text()
    assert "RUNBOOK=runbooks/gpu-sglang-check-kimi.yaml" in text
    assert "REPORT=sglang-kimi-k25.json" in text and "REPORT_FLAVOURS=llama,mla" in text
    shared = (REPO / "bench" / "gpu_sglang.sh").read_text()
    assert "$STATE/calls" in shared and '"calls": int(calls)' in shared  # RESUME=1 adds a call
    assert "tiktoken" in (REPO / "bench" / "stage_sglang.sh").read_text()


def test_headless_summary_counts_what_an_only_run_left_pending(tmp_path):
    rb = tmp_path / "two.yaml"
    rb.write_text(
        "name: two\ndescription: two steps\nsteps:\n"
        '  - {id: a, title: A, run: "true"}\n  - {id: b, title: B, run: "true"}\n'
    )
    cmd = [sys.executable, "-m", "eagle_tui.cli", "run", str(rb), "--auto", "--yes",
           "--state-dir", str(tmp_path / "st")]  # fmt: skip
    only = subprocess.run([*cmd, "--only", "a"], capture_output=True, text=True, timeout=120)
    assert only.returncode == 0, only.stdout + only.stderr
    assert "exit 0: selected steps done; 1 pending" in only.stdout
    rest = subprocess.run([*cmd, "--run", "latest"], capture_output=True, text=True, timeout=120)
    assert "exit 0: all steps done" in rest.stdout, rest.stdout + rest.stderr
