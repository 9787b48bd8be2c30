"""`eagle3 plan` (remote_agent/eagle3/plan.py): the format's bytes per token, the verdict and its
remedies, the real disk probe, and the exit code the runbook's preflight relies on."""

from __future__ import annotations

import json

from remote_agent.eagle3 import plan
from remote_agent.eagle3.cli import main


def test_kimi_bytes_per_token_are_the_dump_formats():
    assert plan.bytes_per_token(7168, 3, "bf16") == 57_348  # 4 x 7168 x 2 + int32 id
    assert plan.bytes_per_token(7168, 3, "fp8_e4m3") == 35_856  # final stays bf16


def test_disk_bound_plan_names_every_remedy():
    p = plan.make_plan(87_800_000, 7168, 3, 3, 87_288, 15_000, 1.335)
    bf16, fp8 = p["formats"]["bf16"], p["formats"]["fp8_e4m3"]
    assert round(bf16["dump_tb"], 2) == 5.04 and bf16["disk_bound"] and fp8["disk_bound"]
    assert abs(bf16["train_read_gb_per_s_needed"] - 87_288 * 57_348 / 1e9) < 1e-3
    text = " ".join(p["remedies"])
    for word in ("fp8", "epochs", "faster volume", "online mode"):
        assert word in text
    fast = plan.make_plan(87_800_000, 7168, 3, 3, 87_288, 15_000, 8.0)
    assert fast["verdict"].startswith("ok") and not fast["remedies"]
    mid = plan.make_plan(87_800_000, 7168, 3, 3, 87_288, 15_000, 4.0)
    assert mid["formats"]["bf16"]["disk_bound"] and not mid["formats"]["fp8_e4m3"]["disk_bound"]
    assert mid["remedies"][0].startswith("fp8 aux (`extract --aux-dtype fp8_e4m3`)")


def test_probe_reads_a_real_file_and_cleans_up(tmp_path):
    r = plan.probe_read_gbps(tmp_path, mb=16)
    assert r["bytes"] == 16 << 20 and r["read_gb_per_s"] > 0 and r["write_gb_per_s"] > 0
    assert list(tmp_path.iterdir()) == []


def test_strict_blocks_only_the_planned_format(tmp_path, capsys):
    out = tmp_path / "plan.json"
    base = [
        "plan",
        "--tokens",
        "1000000",
        "--train-tokens-per-s",
        "80000",
        "--extract-tokens-per-s",
        "15000",
        "--read-gbps",
        "4.0",
        "--out",
        str(out),
    ]
    assert main([*base, "--strict"]) == 1  # bf16 needs 4.59 GB/s
    assert "BLOCKED" in capsys.readouterr().out
    assert main([*base, "--strict", "--aux-dtype", "fp8_e4m3"]) == 0  # 2.87 GB/s
    assert main(base) == 0  # warn only
    assert json.loads(out.read_text())["formats"]["bf16"]["disk_bound"] is True
    assert main(["plan", "--train-tokens-per-s", "1", "--extract-tokens-per-s", "1"]) == 2
