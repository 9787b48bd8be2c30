"""Attack: SGLang hands the hook's rows to the wrong request (or one value is off): the canary
against SGLang's own return_hidden_states must refuse (exit 1) before any data is extracted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eagle3" / "extraction"))

from eagle3_standins import FakeSGLang, load_hook_package, write_dataset  # noqa: E402

from remote_agent.eagle3.cli import main  # noqa: E402
from remote_agent.eagle3.extraction.canary_sglang import RESULT_NAME  # noqa: E402


@pytest.mark.parametrize("fault", ["swap", "shift", "ulp"])
def test_wrong_rows_from_sglang_are_refused(fault, tiny_target, tmp_path, monkeypatch, tally):
    hook = load_hook_package(tmp_path / "pkg")
    out = tmp_path / "dump"
    for k, v in {"DIR": str(out), "SYNC": "1", "MIN_FREE_MB": "0"}.items():
        monkeypatch.setenv(f"EAGLE3_DUMP_{k}", v)
    hook.reset()
    monkeypatch.setattr(hook, "_writer_rank", lambda model: 0)
    data = write_dataset(tmp_path / "d.jsonl", [40, 17])
    flags = {"enable_return_hidden_states": True}
    with FakeSGLang(hook, tiny_target, flags=flags, rows_fault=fault) as fake:
        code = main(
            ["extract", "--server", fake.url, "--dataset", str(data), "--out", str(out),
             "--disk-margin-gb", "0", "--canary-timeout", "30", "--canary-only"]
        )  # fmt: skip
    hook.reset()
    result = json.loads((out / "canary" / RESULT_NAME).read_text())
    held = code == 1 and result["bit_exact"] is False and not (out / "shards").exists()
    tally.trial("canary vs SGLang: wrong rid-to-rows mapping refused", held)
    assert held, (code, result)
