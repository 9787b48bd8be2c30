"""`eagle3 plan` (remote_agent/eagle3/plan.py): the format's bytes per token, the verdict and its
remedies, the real disk probe, and the exit code the runbook's preflight relies on."""

from __future__ import annotations

import json

import pytest

from remote_agent.eagle3 import plan
from remote_agent.eagle3.cli import main
from tests.support.paths import REPO


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
    r = plan.probe_read_gbps(tmp_path, mb=16, readers=2)
    assert r["bytes"] == 16 << 20 and r["read_gb_per_s"] > 0 and r["write_gb_per_s"] > 0
    assert r["readers"] == 2 and r["method"] in ("o_direct", "posix_fadvise_dontneed")
    assert len(r["read_gb_per_s_by_eighth_of_time"]) == 2  # 2 blocks of 8 MiB: 2 slices
    assert ("bypassed" if r["method"] == "o_direct" else "DONTNEED") in r["note"]
    assert list(tmp_path.iterdir()) == []


def test_probe_without_o_direct_drops_the_cache_and_says_how_much_stayed(tmp_path, monkeypatch):
    monkeypatch.setattr(plan, "_open_direct", lambda path: None)  # a file system refusing it
    r = plan.probe_read_gbps(tmp_path, mb=16)
    assert r["method"] == "posix_fadvise_dontneed" and r["read_gb_per_s"] > 0
    cached = r["cached_fraction_before_read"]
    if cached is not None and cached > 0.01:  # tmpfs keeps its pages: flagged, not trusted
        assert "upper bound" in r["note"]
    else:
        assert "DONTNEED" in r["note"]
    assert list(tmp_path.iterdir()) == []


def test_page_cache_residency_is_measured(tmp_path):
    import os

    path = tmp_path / "f"
    path.write_bytes(os.urandom(1 << 20))
    path.read_bytes()
    cached = plan._cached_fraction(path)
    if cached is None:
        pytest.skip("no mincore here")
    assert cached > 0.9  # just written and read: in the cache
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    after = plan._cached_fraction(path)
    if plan._volume(tmp_path).get("fstype") != "tmpfs":  # tmpfs pages are the file itself
        assert after is not None and after < 0.1


def test_replanning_a_recorded_plan_with_a_probe_keeps_its_keys(tmp_path, capsys):
    recorded = REPO / "bench" / "results" / "production-plan.json"
    old = json.loads(recorded.read_text())
    out = tmp_path / "plan.json"
    probe_dir = tmp_path / "vol"
    argv = ["plan", "--from", str(recorded), "--probe", str(probe_dir), "--probe-mb", "16"]
    assert main([*argv, "--probe-readers", "2", "--out", str(out)]) == 0
    new = json.loads(out.read_text())
    assert set(old) - {"recorded_with"} <= set(new)  # every key the plan wrote (not the note)
    for key in ("tokens", "hidden_size", "aux_layers", "epochs", "train_tokens_per_s"):
        assert new[key] == old[key]
    assert new["disk_read_gb_per_s"] == new["probe"]["read_gb_per_s"] > 0
    assert new["probe"]["method"] in new["measured"]["disk_read_gb_per_s"]
    assert "disk_read_gb_per_s" not in new["assumptions"]  # measured now, no longer assumed
    assert set(new["assumptions"]) == set(old["assumptions"]) - {"disk_read_gb_per_s"}
    assert new["machine"]["hostname"] and new["machine"]["probe_volume"]["mount"]
    assert "--from" in new["command"] and "--probe-readers 2" in new["command"]
    assert "--tokens" not in new["command"]  # taken from the recorded plan, not typed
    assert new["probe"]["method"] in new["summary"] and "no --probe" not in new["not_measured"]
    assert "probe: " + new["probe"]["method"] in capsys.readouterr().out
    assert list(probe_dir.iterdir()) == []


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
    assert main([*base, "--strict", "--aux-dtype", "bf16"]) == 1  # bf16 needs 4.59 GB/s
    assert "BLOCKED" in capsys.readouterr().out
    assert main([*base, "--strict", "--aux-dtype", "fp8_e4m3"]) == 0  # 2.87 GB/s
    assert main([*base, "--strict"]) == 0  # fp8 aux is the default planned format (the A/B)
    assert main([*base, "--aux-dtype", "bf16"]) == 0  # warn only
    assert json.loads(out.read_text())["formats"]["bf16"]["disk_bound"] is True
    assert main(["plan", "--train-tokens-per-s", "1", "--extract-tokens-per-s", "1"]) == 2
    assert main(["plan", "--tokens", "1000"]) == 2  # no rates and no --from
    plan_json = json.loads(out.read_text())
    assert plan_json["planned_format"] == "bf16"
    assert plan_json["recommended_format"]["aux_dtype"] == "fp8_e4m3"
    assert "fp8-aux-ab.json" in plan_json["recommended_format"]["why"]
    assert plan_json["command"].startswith("python -m remote_agent.eagle3 plan --tokens 1000000")
    assert "the disk read bandwidth: no --probe" in plan_json["not_measured"]


def test_production_runbooks_dump_the_recommended_format():
    import yaml

    for name in ("kimi-k25-eagle3.yaml", "kimi-k25-eagle3-2box.yaml"):
        text = (REPO / "runbooks" / name).read_text()
        assert yaml.safe_load(text)["vars"]["aux_dtype"] == plan.RECOMMENDED_AUX, name
        assert "35,856 B/token" in text and "final state stays" in text, name
    ab = json.loads((REPO / "bench" / "results" / "fp8-aux-ab.json").read_text())
    assert ab["equal_within_ci"] is True  # the A/B the default rests on
    assert plan.bytes_per_token(7168, 3, plan.RECOMMENDED_AUX) == 35_856
