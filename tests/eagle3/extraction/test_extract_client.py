"""`eagle3 extract --server` against a loopback stand-in for SGLang (see eagle3_standins.py: the
server and its ForwardBatch are the one fake; the hook, the tiny model's states, the client and
the dense format are real). Also the bad inputs: flags, unpatched server, full disk (a 1 MiB
tmpfs), missing dataset/manifest, shape mismatches, chunked prefill slipping through."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from eagle3_standins import FakeSGLang, load_hook_package, write_dataset  # noqa: E402

from remote_agent.eagle3.cli import main  # noqa: E402
from remote_agent.eagle3.dense import DumpMeta, DumpReader, init_dump_dir  # noqa: E402
from remote_agent.eagle3.extraction import server as srv  # noqa: E402

LENGTHS = [12, 40, 7, 33, 21, 5, 28, 16, 9, 37, 24, 14]


@pytest.fixture(scope="module")
def hookmod(tmp_path_factory):
    return load_hook_package(tmp_path_factory.mktemp("hookpkg"))


@pytest.fixture
def out(tmp_path) -> Path:
    return tmp_path / "dump"


@pytest.fixture
def env(hookmod, out, monkeypatch):
    """The server-side environment `eagle3 extract --launch` would set, tuned small."""

    def configure(dump_dir: Path = out, **extra: str):
        for key in list(os.environ):
            if key.startswith("EAGLE3_DUMP_"):
                monkeypatch.delenv(key)
        settings = {
            "DIR": str(dump_dir),
            "SHARD_MB": "0.05",
            "FLUSH_S": "0.5",
            "QUEUE": "2",
            "MIN_FREE_MB": "0",
            **extra,
        }
        for k, v in settings.items():
            monkeypatch.setenv(f"EAGLE3_DUMP_{k}", v)
        hookmod.reset()

    configure()
    monkeypatch.setattr(hookmod, "_writer_rank", lambda model: 0)
    yield configure
    hookmod.reset()


def extract(url, data, out, *extra) -> int:
    args = [
        "extract",
        "--server",
        url,
        "--dataset",
        str(data),
        "--out",
        str(out),
        "--disk-margin-gb",
        "0",
        "--canary-timeout",
        "30",
        "--dump-timeout",
        "60",
        "--progress-interval",
        "0",
        *map(str, extra),
    ]
    return main(args)


def machine_lines(err: str, kind: str) -> list[dict]:
    return [
        json.loads(x[9:])
        for x in err.splitlines()
        if x.startswith("@@eagle3 ") and f'"{kind}"' in x
    ]


def test_end_to_end_matches_the_reference_and_resumes(
    hookmod, env, tiny_target, tmp_path, out, capsys
):
    data = write_dataset(tmp_path / "d.jsonl", LENGTHS)
    with FakeSGLang(hookmod, tiny_target, max_batch=4, pad_rows=3) as fake:
        assert extract(fake.url, data, out, "--concurrency", 4) == 0
        err = capsys.readouterr().err
        assert fake.batches > 1
    (result,) = machine_lines(err, "result")
    assert result["ok"] and result["samples"] == len(LENGTHS) and result["tokens"] == sum(LENGTHS)
    progress = machine_lines(err, "progress")
    assert progress[-1]["done"] == len(LENGTHS)
    assert {"tokens_per_s", "gb_written", "eta_s", "rate"} <= progress[-1].keys()
    dumped = DumpReader(out)
    assert dumped.meta.producer == "sglang-patch" and len(dumped.shards) > 1
    assert main(["verify-dumps", str(out), "--dataset", str(data)]) == 0
    # the patch's dumps equal the HF reference extractor's (same per-request fp32 forward)
    ref = tmp_path / "ref"
    assert (
        main(
            [
                "extract",
                "--backend",
                "hf",
                "--model",
                str(tiny_target),
                "--dataset",
                str(data),
                "--out",
                str(ref),
                "--token-budget",
                "1",
                "--dtype",
                "fp32",
                "--disk-margin-gb",
                "0",
                "--min-free-gb",
                "0",
            ]
        )
        == 0
    )
    reference = DumpReader(ref)
    for sid in reference.ids():
        a, b = dumped.get(sid), reference.get(sid)
        for key in ("input_ids", "aux", "final"):
            assert torch.equal(a[key], b[key]), (sid, key)
    # resume: everything is there, nothing is sent again
    env()
    capsys.readouterr()
    with FakeSGLang(hookmod, tiny_target) as fake:
        assert extract(fake.url, data, out) == 0
        assert fake.batches == 1  # the canary only
    (result,) = machine_lines(capsys.readouterr().err, "result")
    assert result["skipped_existing"] == len(LENGTHS) and result["samples"] == 0


def test_partial_run_then_resume(hookmod, env, tiny_target, tmp_path, out, capsys):
    data = write_dataset(tmp_path / "d.jsonl", LENGTHS, seed=1)
    with FakeSGLang(hookmod, tiny_target) as fake:
        assert extract(fake.url, data, out, "--limit", 5) == 0
        assert extract(fake.url, data, out) == 0
    results = machine_lines(capsys.readouterr().err, "result")
    assert results[-1]["skipped_existing"] == 5 and results[-1]["samples"] == len(LENGTHS) - 5
    assert main(["verify-dumps", str(out), "--dataset", str(data)]) == 0


def test_server_without_the_extraction_flags(hookmod, env, tiny_target, tmp_path, out, capsys):
    data = write_dataset(tmp_path / "d.jsonl", LENGTHS[:3])
    wrong = {
        "disable_radix_cache": False,
        "chunked_prefill_size": 8192,
        "disable_prefill_cuda_graph": False,
        "cuda_graph_config": {"prefill": {"backend": "breakable"}},
    }
    with FakeSGLang(hookmod, tiny_target, flags=wrong) as fake:
        assert extract(fake.url, data, out) == 2
        assert fake.batches == 0  # refused before sending anything
    err = capsys.readouterr().err
    for fix in (
        "--disable-radix-cache",
        "--chunked-prefill-size -1",
        "--disable-prefill-cuda-graph",
    ):
        assert fix in err
    with FakeSGLang(hookmod, tiny_target, flags={"enable_return_aux_hidden_states": False}) as fake:
        assert extract(fake.url, data, out) == 2
    assert (
        "--enable-return-aux-hidden-states --speculative-algorithm EAGLE3"
        in capsys.readouterr().err
    )


def test_unpatched_server_is_caught_by_the_canary(hookmod, env, tiny_target, tmp_path, out, capsys):
    data = write_dataset(tmp_path / "d.jsonl", LENGTHS[:3])
    with FakeSGLang(hookmod, tiny_target, patched=False) as fake:
        assert extract(fake.url, data, out, "--canary-timeout", 2) == 1
        assert fake.batches == 1  # the canary, and nothing after it
    err = capsys.readouterr().err
    assert "no canary dump" in err and "eagle3 patch status" in err and "EAGLE3_DUMP_DIR" in err
    assert not (out / "shards").exists()


def test_missing_dataset_or_manifest(tmp_path, out, capsys):
    url = "http://127.0.0.1:9"  # never contacted
    assert extract(url, tmp_path / "nope.jsonl", out) == 2
    assert "no such dataset file" in capsys.readouterr().err
    data = write_dataset(tmp_path / "d.jsonl", [4, 5])
    (tmp_path / "d.manifest.json").unlink()
    assert extract(url, data, out) == 2
    assert "missing manifest" in capsys.readouterr().err


def test_hidden_size_and_layer_count_mismatch(hookmod, env, tiny_target, tmp_path, out, capsys):
    data = write_dataset(tmp_path / "d.jsonl", LENGTHS[:3])
    with FakeSGLang(hookmod, tiny_target) as fake:
        assert extract(fake.url, data, out, "--hidden-size", 128) == 2
        assert "hidden size 64 != expected 128" in capsys.readouterr().err
        assert extract(fake.url, data, out, "--num-layers", 9) == 2
        assert "layer count 8 != expected 9" in capsys.readouterr().err
        other = tmp_path / "other"
        init_dump_dir(
            other,
            DumpMeta(model=str(tiny_target), hidden_size=32, num_layers=8, aux_layer_ids=[2, 4, 5]),
        )
        env(other)
        assert extract(fake.url, data, other) == 2
        assert "existing dump differs" in capsys.readouterr().err
    assert not list((out / "shards").glob("*.safetensors"))


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs here: {proc.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_refused_then_failing_then_resumed(
    hookmod, env, tiny_target, tmp_path, small_disk, capsys
):
    out = small_disk / "dump"
    env(out, SHARD_MB="1", FLUSH_S="1000")  # one shard, sealed by the client's flush request
    big = write_dataset(tmp_path / "big.jsonl", [50] * 45)  # 2250 tokens x 516 B > 1 MiB
    with FakeSGLang(hookmod, tiny_target) as fake:
        assert extract(fake.url, big, out) == 1
    err = capsys.readouterr().err
    assert "not enough disk for the dump" in err and "2250 tokens x 516 B/token" in err
    assert "free under" in err and not list((out / "shards").glob("r*"))

    data = write_dataset(tmp_path / "d.jsonl", [40] * 16)  # 330 KB: fits, until the disk fills
    filler = small_disk / "filler"

    def fill_disk():
        free = shutil.disk_usage(small_disk).free
        filler.write_bytes(b"\0" * max(free - 100_000, 0))

    env(out, SHARD_MB="1", FLUSH_S="1000")
    with FakeSGLang(hookmod, tiny_target, on_first_request=fill_disk) as fake:
        assert extract(fake.url, data, out) == 1
    err = capsys.readouterr().err
    assert "extraction stopped" in err and "No space left on device" in err
    assert "run again to resume" in err
    assert not list((out / "shards").iterdir())  # nothing partial counted as done

    filler.unlink()
    env(out, SHARD_MB="1", FLUSH_S="1000")
    with FakeSGLang(hookmod, tiny_target) as fake:
        assert extract(fake.url, data, out) == 0
    assert main(["verify-dumps", str(out), "--dataset", str(data)]) == 0


def test_chunked_prefill_slipping_through_is_caught(
    hookmod, env, tiny_target, tmp_path, out, capsys
):
    """A server that claims --chunked-prefill-size -1 but chunks anyway: the hook dumps the first
    chunk and marks the rest; the client's length/id check and the markers stop the run."""
    data = write_dataset(tmp_path / "d.jsonl", [8, 40, 30])  # the canary (8 tokens) fits a chunk
    with FakeSGLang(hookmod, tiny_target, chunk=16) as fake:
        assert extract(fake.url, data, out) == 1
    err = capsys.readouterr().err
    assert "extraction stopped" in err
    # the 40-token sample arrives as chunks at prefixes 0, 16, 32; the marker names a later one
    assert (
        re.search(r"partial request: prefix_len (16|32)\b", err) or "differ from the dataset" in err
    )
    env(tmp_path / "e")
    long_first = write_dataset(tmp_path / "e.jsonl", [40, 8])  # now the canary itself is chunked
    with FakeSGLang(hookmod, tiny_target, chunk=16) as fake:
        assert extract(fake.url, long_first, tmp_path / "e") == 1
    err = capsys.readouterr().err  # whichever the client sees first: a marker or the dump
    assert (
        re.search(r"the canary failed in the hook: partial request: prefix_len (16|32)\b", err)
        or "the canary dump holds 16 of the 40 tokens sent" in err
    )


def test_check_flags_and_launch_command(tmp_path):
    ok = {
        "enable_return_aux_hidden_states": True,
        "disable_radix_cache": True,
        "chunked_prefill_size": -1,
        "cuda_graph_config": {"prefill": {"backend": "disabled"}},
        "tp_size": 8,
    }
    assert srv.check_flags(ok) == []
    assert srv.check_flags({**ok, "tp_size": 4}, tp=8) == ["tp_size = 4, expected --tp-size 8"]
    assert (
        srv.check_flags(
            {**ok, "return_aux_hidden_state_layer_ids": [1, 29, 57]}, layers=[2, 30, 58]
        )
        == []
    )
    assert (
        "captures layers"
        in srv.check_flags(
            {**ok, "return_aux_hidden_state_layer_ids": [3, 30, 58]}, layers=[2, 30, 58]
        )[0]
    )
    assert any(
        "two_batch_overlap" in p for p in srv.check_flags({**ok, "enable_two_batch_overlap": True})
    )
    assert any(
        "--enable-dp-attention" in p for p in srv.check_flags({**ok, "enable_dp_attention": True})
    )
    cmd = srv.launch_command(
        Path("/m"), 30000, 8, [1, 29, 57], ["--mem-fraction-static", "0.8"], python="py"
    )
    text = " ".join(cmd)
    for flag in (
        "--enable-return-aux-hidden-states --speculative-algorithm EAGLE3",
        "--disable-radix-cache",
        "--chunked-prefill-size -1",
        "--disable-prefill-cuda-graph",
        "--tp-size 8",
        "--return-aux-hidden-state-layer-ids 1 29 57",
        "--mem-fraction-static 0.8",
    ):
        assert flag in text
    env = srv.dump_env(tmp_path, "dump-", [1, 29, 57], "fp8_e4m3")
    assert env["EAGLE3_DUMP_LAYER_IDS"] == "2,30,58" and env["EAGLE3_DUMP_AUX_DTYPE"] == "fp8_e4m3"
