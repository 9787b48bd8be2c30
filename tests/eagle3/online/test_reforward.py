"""reforward.Reforwards: a sample's rows streamed again are compared with its first arrival's."""

import pytest

torch = pytest.importorskip("torch")

from remote_agent.eagle3.online.reforward import Reforwards, rows_digest  # noqa: E402


def sample(bump: float = 0.0, dtype=torch.bfloat16):
    aux = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(dtype)
    aux[1, 2] += bump
    return {"aux": aux, "final": torch.ones(3, 2, dtype=dtype), "ids": torch.arange(3)}


def test_first_arrivals_count_nothing_and_repeats_are_judged_by_their_bytes():
    r = Reforwards()
    r.see("a", rows_digest(sample()))
    r.see("b", rows_digest(sample()))
    assert r.to_json()["samples_streamed_again"] == 0
    r.see("a", rows_digest(sample()))  # the same rows again
    r.see("b", rows_digest(sample(bump=0.25)))  # one element one bf16 step off
    assert r.to_json() == {
        "samples_streamed_again": 2,
        "rows_identical_to_first": 1,
        "rows_differing": 1,
        "differing_examples": ["b"],
    }


def test_the_digest_sees_dtype_and_shape_not_only_values():
    assert rows_digest(sample()) == rows_digest(sample())
    assert rows_digest(sample()) != rows_digest(sample(dtype=torch.float16))
    flat = {k: v.reshape(-1) for k, v in sample().items()}
    assert rows_digest(sample()) != rows_digest(flat)
