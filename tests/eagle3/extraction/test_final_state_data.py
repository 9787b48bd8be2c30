"""`verify-dumps --model`: sampled supervised rows of the dumped `final` must predict the data's
next token through the target's lm_head (extraction/final_check.py). Real tiny target, real HF
reference dumps of its own greedy continuations, a real shard corrupted on disk."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from eagle3_standins import write_records  # noqa: E402

from remote_agent.eagle3.cli import main  # noqa: E402
from remote_agent.eagle3.dense import DumpReader  # noqa: E402


def greedy_records(target, n: int = 4, prompt: int = 8, new: int = 12) -> list[dict]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(11, 1500, (1, prompt), generator=g)
        with torch.no_grad():
            seq = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        seq = seq[0].tolist()[: prompt + new]
        mask = [0] * prompt + [1] * (len(seq) - prompt)
        out.append({"id": f"g{i:02d}", "source": "greedy", "input_ids": seq, "loss_mask": mask})
    return out


def human_records(n: int = 4, prompt: int = 8, new: int = 12) -> list[dict]:
    """Answers the target did not write (random tokens): its top-1 agrees with them at chance."""
    g = torch.Generator().manual_seed(1)
    return [
        {"id": f"h{i:02d}", "source": "human",
         "input_ids": torch.randint(11, 1500, (prompt + new,), generator=g).tolist(),
         "loss_mask": [0] * prompt + [1] * new}
        for i in range(n)
    ]  # fmt: skip


def corrupt_final(dump, sid: str) -> None:
    """Replace one sample's final rows on disk with another position's (rows reversed)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    reader = DumpReader(dump)
    loc = reader.index[sid]
    shard = loc.shard
    reader.close()
    entries = {e[0]: (int(e[1]), int(e[2])) for e in DumpReader.shard_index(shard)}
    off, n = entries[sid]
    with safe_open(str(shard), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    tensors["final"][off : off + n] = tensors["final"][off : off + n].flip(0).clone()
    save_file(tensors, str(shard), metadata=meta)


@pytest.mark.timeout(900)
def test_final_rows_predict_the_data_and_a_corrupted_sample_is_named(tiny_target, tmp_path, capsys):
    # one dump mixing both kinds, as a merge of regenerated and human-written sources does: the
    # human samples agree at chance, and must not be named against the greedy ones' rate
    data = write_records(tmp_path / "mixed.jsonl", greedy_records(tiny_target) + human_records())
    dump = tmp_path / "dump"
    assert main(["extract", "--backend", "hf", "--model", str(tiny_target), "--dataset",
                 str(data), "--out", str(dump), "--device", "cpu", "--disk-margin-gb", "0",
                 "--min-free-gb", "0"]) == 0  # fmt: skip
    capsys.readouterr()
    verify = ["verify-dumps", str(dump), "--dataset", str(data), "--model", str(tiny_target),
              "--json"]  # fmt: skip
    assert main(verify) == 0
    good = json.loads(capsys.readouterr().out)["final_state"]
    assert good["rows"] == 8 * 12 and not good["problems"]
    assert good["source_rates"]["greedy"] >= 0.9 and good["source_rates"]["human"] < 0.2
    corrupt_final(dump, "g02")
    assert main(verify) == 1
    bad = json.loads(capsys.readouterr().out)["final_state"]
    assert bad["rate"] < good["rate"]
    assert len(bad["problems"]) == 1 and bad["problems"][0].startswith("g02: final rows predict")
    assert "first disagreeing rows" in bad["problems"][0]
