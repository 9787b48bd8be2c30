"""compare.locate: the epoch of a logged step, and whether it opened its epoch (where an online
run fed by a producer's second forward first parts from offline training)."""

import json

from remote_agent.eagle3.online.compare import equal_on_first_forwards, locate


def test_locate_names_the_epoch_and_its_first_step(tmp_path):
    lines = [{"step": i + 1, "epoch": e, "loss": 1.0} for i, e in enumerate([0, 0, 0, 1, 1, 2])]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert locate(tmp_path, 1) == {"epoch": 0, "first_step_of_epoch": True}
    assert locate(tmp_path, 3) == {"epoch": 0, "first_step_of_epoch": False}
    assert locate(tmp_path, 4) == {"epoch": 1, "first_step_of_epoch": True}
    assert locate(tmp_path, 5) == {"epoch": 1, "first_step_of_epoch": False}
    assert locate(tmp_path, 6) == {"epoch": 2, "first_step_of_epoch": True}
    assert locate(tmp_path, 7) == {"epoch": None, "first_step_of_epoch": None}


# equal_on_first_forwards: what the SGLang bench accepts besides bit-equality

EPOCH2 = {"epoch": 1, "first_step_of_epoch": True}
CHANGED = {"samples_streamed_again": 4, "rows_identical_to_first": 0, "rows_differing": 4}
OFF = [4.0, 3.5, 3.2, 3.0]  # two epochs of two steps


def test_identical_runs_are_equal():
    assert equal_on_first_forwards(OFF, list(OFF), None, {})


def test_a_later_epoch_off_by_a_reforwards_rounding_is_equal():
    on = [4.0, 3.5, 3.2 * (1 + 2e-6), 3.0 * (1 - 5e-6)]
    assert equal_on_first_forwards(on, OFF, EPOCH2, CHANGED)


def test_a_difference_inside_the_first_epoch_is_not():
    on = [4.0, 3.5 + 1e-7, 3.2, 3.0]
    assert not equal_on_first_forwards(on, OFF, {"epoch": 0, "first_step_of_epoch": False}, CHANGED)


def test_a_later_difference_not_at_an_epoch_start_is_not():
    on = [4.0, 3.5, 3.2, 3.0 + 1e-6]
    assert not equal_on_first_forwards(on, OFF, {"epoch": 1, "first_step_of_epoch": False}, CHANGED)


def test_no_changed_rows_means_the_difference_is_unexplained():
    on = [4.0, 3.5, 3.2 * (1 + 2e-6), 3.0]
    same = {"samples_streamed_again": 4, "rows_identical_to_first": 4, "rows_differing": 0}
    assert not equal_on_first_forwards(on, OFF, EPOCH2, same)


def test_a_later_epoch_far_off_is_not():  # a wrong sample or order, not rounding
    on = [4.0, 3.5, 3.2 * 1.01, 3.0]
    assert not equal_on_first_forwards(on, OFF, EPOCH2, CHANGED)


def test_runs_of_unequal_length_are_not():
    assert not equal_on_first_forwards(OFF[:3], OFF, None, {})
