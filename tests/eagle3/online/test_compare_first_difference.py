"""bench_online's first_loss_difference: where an online run and its offline twin part."""

from __future__ import annotations

from remote_agent.eagle3.online.compare import first_difference


def test_equal_runs_have_none():
    assert first_difference([3.0, 2.5, 2.0], [3.0, 2.5, 2.0]) is None


def test_the_first_differing_step_and_both_values():
    got = first_difference([3.0, 2.5, 2.0, 1.9], [3.0, 2.5, 2.0000001, 1.8])
    assert got == {"step": 3, "a": 2.0, "b": 2.0000001, "of": 4}


def test_a_run_cut_short_differs_after_its_last_step():
    assert first_difference([3.0, 2.5], [3.0, 2.5, 2.0]) == {
        "step": 3, "a": None, "b": None, "of": 3,
    }  # fmt: skip
