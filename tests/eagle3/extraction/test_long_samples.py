"""Long samples against the server's memory (extraction/server.py long_sample_problem): a sample
longer than one prefill can hold (KV pool, input limit, context) is refused before anything is
sent, naming the samples, the limit and the fix; never an OOM or a stalled queue mid-run."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from eagle3_standins import FakeSGLang, load_hook_package, write_dataset  # noqa: E402

from remote_agent.eagle3.cli import main  # noqa: E402
from remote_agent.eagle3.extraction.server import long_sample_problem, prefill_limit  # noqa: E402


def test_the_smallest_limit_wins_and_is_named():
    info = {"max_total_num_tokens": 50000, "max_req_input_len": 262000, "context_length": 262144}
    assert prefill_limit(info)[0] == 50000
    assert "max_total_num_tokens=50000" in prefill_limit(info)[1]
    assert prefill_limit({})[0] is None and long_sample_problem({}, {"a": 10**6}) is None
    why = long_sample_problem(info, {"a": 64000, "b": 1000, "c": 51000})
    assert why.startswith("2 samples are longer than this server can prefill in one request")
    assert why.index("a (64000 tokens)") < why.index("c (51000 tokens)")
    assert "--max-len 50000" in why and "--mem-fraction-static" in why
    assert long_sample_problem(info, {"a": 50000}) is None  # exactly at the limit fits


def test_extract_refuses_before_sending_anything(tmp_path, monkeypatch, tiny_target, capsys):
    hook = load_hook_package(tmp_path / "pkg")
    for k, v in {"DIR": str(tmp_path / "dump"), "SYNC": "1", "MIN_FREE_MB": "0"}.items():
        monkeypatch.setenv(f"EAGLE3_DUMP_{k}", v)
    hook.reset()
    monkeypatch.setattr(hook, "_writer_rank", lambda model: 0)
    data = write_dataset(tmp_path / "d.jsonl", [12, 40, 7, 33])
    with FakeSGLang(hook, tiny_target, flags={"max_total_num_tokens": 30}) as fake:
        rc = main(["extract", "--server", fake.url, "--dataset", str(data),
                   "--out", str(tmp_path / "dump"), "--disk-margin-gb", "0"])  # fmt: skip
        assert fake.batches == 0  # not even the canary was sent
    hook.reset()
    err = capsys.readouterr()
    assert rc == 2
    assert "2 samples are longer than this server can prefill in one request (30 tokens" in (
        err.out + err.err
    )
