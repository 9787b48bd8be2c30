"""The suite's tiers, in one place (tests/conftest.py marks the items from here):

- `attack`: every test of tests/faults and every test that counts trials in the tally (the
  multibox attacks). `pytest -m attack` runs the attack suite alone.
- `slow`: the tests whose measured duration (the xdist full run's `--durations`, recorded in
  docs/ARCHITECTURE.md "Test tiers") is long enough that the edit loop skips them:
  `make test-fast` runs `-m "not slow"`; `make test` and CI run everything.

A prefix names a file (or a folder, or a test with its parameters left open); a new slow test
is added here, not marked in its file, so the tiers stay readable in one list.
"""

from __future__ import annotations

from typing import Any

# Every test that starts a real sshd or network namespaces (markers `sshd`, `netns`) is slow;
# so are these nodeid prefixes: tmux end-to-end runs, multi-process training, whole pipelines.
# First cut by what each test starts (issue 29 phase 1: the xdist full run's durations came
# after it); move a test in or out by its measured `--durations`.
SLOW: tuple[str, ...] = (
    "tests/e2e/",
    "tests/multibox/",
    "tests/ssh/test_tui_tmux_ssh.py",
    "tests/tui/test_tmux_e2e.py",
    "tests/tui/test_tmux_picker.py",
    "tests/tui/test_locked_second_cockpit.py",
    "tests/tui/test_reattach.py",
    "tests/tui/test_reattach_follow.py",
    "tests/faults/test_cockpit_intent.py",
    "tests/faults/test_exactly_once.py",
    "tests/faults/test_job_lifecycle.py",
    "tests/faults/test_eagle3_service_restart.py",
    "tests/faults/test_long_context.py",
    "tests/faults/test_fanout.py",
    "tests/agent/test_reattach.py",
    "tests/eagle3/drafter/test_bench_long_context.py",
    "tests/eagle3/drafter/test_drafter_train.py",
    "tests/eagle3/drafter/test_drafter_seq_parallel.py",
    "tests/eagle3/drafter/test_drafter_seq_parallel_train.py",
    "tests/eagle3/drafter/test_drafter_long_samples.py",
    "tests/eagle3/drafter/test_drafter_eval.py",
    "tests/eagle3/drafter/test_metrics_breakdown.py",
    "tests/eagle3/drafter/test_drafter_skip_rows.py",
    "tests/eagle3/drafter/test_drafter_data.py",
    "tests/eagle3/extraction/test_reference_extract.py",
    "tests/eagle3/extraction/test_gpu_scripts_cpu.py",
    "tests/eagle3/extraction/test_canary_sglang.py",
)
SLOW_ENVIRONMENTS = ("sshd", "netns")


def attack_item(item: Any) -> bool:
    return item.nodeid.startswith("tests/faults/") or "tally" in getattr(item, "fixturenames", ())


def slow_item(item: Any) -> bool:
    return item.nodeid.startswith(SLOW) or any(m in item.keywords for m in SLOW_ENVIRONMENTS)
