"""bench/bench_fp8_aux.py, the fp8-aux A/B (issue 26): the dump comparison on real fp8 and bf16
dumps, the acceptance summary and its equal-within-CI verdict, and (slow) the whole bench at tiny
sizes end to end, so its recorded result can be re-made."""

from __future__ import annotations

import importlib.util
import json

import pytest

torch = pytest.importorskip("torch")

from remote_agent.eagle3.dense import DumpMeta, ShardWriter  # noqa: E402
from tests.support.paths import REPO  # noqa: E402


def load_bench():
    spec = importlib.util.spec_from_file_location(
        "bench_fp8_aux", REPO / "bench" / "bench_fp8_aux.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def write_dump(root, aux_dtype, samples):
    meta = DumpMeta(model="t", hidden_size=8, num_layers=6, aux_layer_ids=[1, 2, 3])
    meta = DumpMeta(**{**meta.__dict__, "aux_dtype": aux_dtype})
    with ShardWriter(root, meta) as w:
        for sid, (ids, aux, final) in samples.items():
            w.add(sid, ids, aux, final)


def test_compare_dumps_measures_the_fp8_error_and_the_bytes(tmp_path):
    bench = load_bench()
    g = torch.Generator().manual_seed(0)
    samples = {
        f"s{i}": (
            torch.arange(5 + i, dtype=torch.int32),
            (torch.randn(5 + i, 24, generator=g) * 3).bfloat16(),
            torch.randn(5 + i, 8, generator=g).bfloat16(),
        )
        for i in range(3)
    }
    write_dump(tmp_path / "dumps-bf16", "bf16", samples)
    write_dump(tmp_path / "dumps-fp8_e4m3", "fp8_e4m3", samples)
    r = bench.compare_dumps(tmp_path / "dumps-bf16", tmp_path / "dumps-fp8_e4m3")
    assert r["samples"] == 3 and r["tokens"] == 18
    assert r["final_bit_identical"] and r["input_ids_identical"]
    # e4m3 keeps 3 mantissa bits: a value's error is at most 1/16 of it (+ bf16 rounding)
    assert 0 < r["aux_max_abs_diff"] < 0.1 * max(float(s[1].abs().max()) for s in samples.values())
    assert 0 < r["aux_max_rel_diff_of_row_max"] <= 0.07
    bpt = r["bytes_per_token"]
    assert bpt["bf16"]["format"] == 3 * 8 * 2 + 8 * 2 + 4
    assert bpt["fp8_e4m3"]["format"] == 3 * 8 + 3 * 4 + 8 * 2 + 4
    assert bpt["fp8_e4m3"]["measured_files"] < bpt["bf16"]["measured_files"]


def test_compare_dumps_catches_a_different_final_state(tmp_path):
    bench = load_bench()
    ids, aux, final = torch.arange(4, dtype=torch.int32), torch.ones(4, 24), torch.ones(4, 8)
    write_dump(tmp_path / "a", "bf16", {"x": (ids, aux, final)})
    write_dump(tmp_path / "b", "fp8_e4m3", {"x": (ids, aux, final * 2)})
    assert bench.compare_dumps(tmp_path / "a", tmp_path / "b")["final_bit_identical"] is False


def decodes(lengths):
    return [{"completion_tokens": 3 * v, "spec_verify_ct": 3} for v in lengths]


def summarize(bench, bf16, fp8):
    args = bench.parse_args(["--seeds", "0"])
    dumps = {
        "bytes_per_token": {
            "bf16": {"format": 516, "measured_files": 520.0},
            "fp8_e4m3": {"format": 336, "measured_files": 340.0},
        },
        "aux_max_abs_diff": 0.01,
    }
    trained = {
        f: [{"seed": 0, "final_loss": 1.5, "sim_accept_len": 2.0, "steps": 4, "loss_curve": []}]
        for f in ("bf16", "fp8_e4m3")
    }
    ev = {"prompts": len(bf16), "decodes": {"bf16-s0": decodes(bf16), "fp8_e4m3-s0": decodes(fp8)}}
    return bench.summarize(args, dumps, trained, ev)


def test_summary_has_the_recorded_keys_and_the_ci_verdict():
    bench = load_bench()
    same = summarize(bench, [2, 3, 2.5, 3, 2] * 4, [2, 3, 2.5, 2.5, 2.5] * 4)
    for key in ("bf16", "fp8"):
        for field in ("accept_length", "ci95", "bytes_per_token", "final_loss"):
            assert same[key][field] is not None
    assert same["bf16"]["bytes_per_token"] == 516 and same["fp8"]["bytes_per_token"] == 336
    assert same["equal_within_ci"] is True
    assert same["bytes_ratio_fp8_over_bf16"] == round(336 / 516, 4)
    assert same["paired_difference_fp8_minus_bf16"]["pairs"] == 20
    worse = summarize(bench, [3, 3.5, 3, 3.5] * 5, [1.5, 2, 1.5, 2] * 5)
    assert worse["equal_within_ci"] is False and worse["accept_ratio_fp8_over_bf16"] < 0.6


def test_the_recorded_result_has_the_issue_keys():
    r = json.loads((REPO / "bench" / "results" / "fp8-aux-ab.json").read_text())
    for key in ("bf16", "fp8"):
        assert set(r[key]) >= {"accept_length", "ci95", "bytes_per_token", "final_loss"}
    assert r["bf16"]["bytes_per_token"] > r["fp8"]["bytes_per_token"]
    assert isinstance(r["equal_within_ci"], bool) and r["machine"] and r["command"]


def test_the_bench_runs_end_to_end_at_tiny_sizes(tmp_path):
    bench = load_bench()
    out = tmp_path / "ab.json"
    args = [
        "--per-source", "12", "--prompts", "6", "--target-steps", "2", "--new-tokens", "8",
        "--draft-steps", "3", "--seeds", "0", "--eval-prompts", "3", "--eval-tokens", "6",
        "--holdout", "0.3", "--workdir", str(tmp_path / "w"), "--out", str(out),
    ]  # fmt: skip
    assert bench.main(args) == 0
    r = json.loads(out.read_text())
    assert r["bf16"]["bytes_per_token"] == 3 * 64 * 2 + 64 * 2 + 4  # the ci preset: hidden 64
    assert r["fp8"]["bytes_per_token"] == 3 * 64 + 3 * 4 + 64 * 2 + 4
    assert r["aux_error"]["final_bit_identical"] and r["aux_error"]["aux_max_abs_diff"] > 0
    assert r["eval"]["held_out_prompts"] >= 1 and r["bf16"]["accept_length"] >= 1
    assert isinstance(r["equal_within_ci"], bool)
