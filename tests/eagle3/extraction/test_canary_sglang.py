"""The canary against SGLang's own return_hidden_states (extraction/canary_sglang.py) on CPU.

The server is the FakeSGLang stand-in (real tiny HF model, real hook, stand-in ForwardBatch);
its return_hidden_states hands each request the bf16 rows of the batch's aux tensor at the
request's own offset, as SGLang 0.5.14's batch_result_processor does. The real comparison runs
on the GPU (bench/gpu_sglang.sh); here the client's side of it is pinned.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from eagle3_standins import FakeSGLang, load_hook_package, write_dataset  # noqa: E402

from remote_agent.eagle3.cli import main  # noqa: E402
from remote_agent.eagle3.extraction.canary_sglang import RESULT_NAME, compare_rows  # noqa: E402

HIDDEN = {"enable_return_hidden_states": True}


@pytest.fixture
def hook(tmp_path, monkeypatch):
    mod = load_hook_package(tmp_path / "pkg")
    for k, v in {"DIR": str(tmp_path / "dump"), "SYNC": "1", "MIN_FREE_MB": "0"}.items():
        monkeypatch.setenv(f"EAGLE3_DUMP_{k}", v)
    mod.reset()
    monkeypatch.setattr(mod, "_writer_rank", lambda model: 0)
    yield mod
    mod.reset()


def canary_only(url: str, data, out, *extra) -> int:
    return main(
        ["extract", "--server", url, "--dataset", str(data), "--out", str(out),
         "--disk-margin-gb", "0", "--canary-timeout", "30", "--canary-only", *map(str, extra)]
    )  # fmt: skip


def test_batched_canary_is_bit_exact_with_sglang_rows(hook, tiny_target, tmp_path):
    data, out = write_dataset(tmp_path / "d.jsonl", [70, 33]), tmp_path / "dump"
    with FakeSGLang(hook, tiny_target, flags=HIDDEN, pad_rows=3) as fake:
        assert canary_only(fake.url, data, out) == 0
    r = json.loads((out / "canary" / RESULT_NAME).read_text())
    assert r["bit_exact"] is True and r["samples"] == 4 and r["shared_forward"] is True
    assert r["compared"] == ["aux"] and r["not_compared"] == ["final"]
    assert r["max_abs_err"] == 0.0
    tokens = [p["tokens"] for p in r["per_sample"]]
    assert tokens[0] != tokens[1]  # two lengths: a wrong offset cannot line up by chance
    assert all(p["ids_equal"] and p["rows_differing"] == 0 for p in r["per_sample"])


def test_final_state_check_passes_then_blocks_a_corrupted_final(
    hook, tiny_target, tmp_path, capsys
):
    """With --model the canary also requires argmax(final[-1] @ lm_head^T) to be the token the
    server generated; a dumped final whose last row is wrong stops extraction, located."""
    data = write_dataset(tmp_path / "d.jsonl", [70, 33, 20, 9])
    out = tmp_path / "dump"
    with FakeSGLang(hook, tiny_target, flags=HIDDEN) as fake:
        assert canary_only(fake.url, data, out, "--model", tiny_target) == 0
    fsc = json.loads((out / "canary" / RESULT_NAME).read_text())["final_state_check"]
    assert fsc["ok"] and fsc["prompts"] == fsc["argmax_matches"] == 4
    assert "equals SGLang's token on 4/4 prompts" in capsys.readouterr().out
    import shutil

    shutil.rmtree(out)  # the hook writes where its environment says: the same dir, emptied
    hook.reset()
    bad = out
    with FakeSGLang(hook, tiny_target, flags=HIDDEN, final_fault=True) as fake:
        assert canary_only(fake.url, data, bad, "--model", tiny_target) == 1
    err = capsys.readouterr()
    text = err.out + err.err
    assert "the dumped final state is not the one SGLang decodes from" in text
    assert "__eagle3__:canary:rhs-" in text and "vs-sglang.json" in text
    fsc = json.loads((bad / "canary" / RESULT_NAME).read_text())["final_state_check"]
    assert not fsc["ok"] and fsc["argmax_matches"] < 4


def test_no_comparison_without_return_hidden_states(hook, tiny_target, tmp_path):
    data, out = write_dataset(tmp_path / "d.jsonl", [12, 40]), tmp_path / "dump"
    with FakeSGLang(hook, tiny_target) as fake:
        assert canary_only(fake.url, data, out) == 0
    assert not (out / "canary" / RESULT_NAME).exists()


def test_compare_rows_picks_the_tensor_by_width():
    aux = torch.arange(24, dtype=torch.float32).reshape(2, 12)
    final = torch.ones(2, 4)
    sample = {"aux": aux, "final": final}
    assert compare_rows(sample, aux.tolist())["compared"] == "aux"
    r = compare_rows(sample, final.tolist())
    assert r["compared"] == "final" and r["equal"]
    r = compare_rows(sample, [[0.0] * 5] * 2)
    assert r["compared"] is None and not r["equal"] and "width 5" in r["reason"]
    r = compare_rows(sample, aux[:1].tolist())
    assert not r["equal"] and "rows" in r["reason"]
