"""accept's statistics: only verified requests count; spread and a 95 % interval that covers."""

from __future__ import annotations

import random

from remote_agent.eagle3.serving.accept_stats import accept_stats


def test_requests_without_a_verify_step_are_counted_apart():
    reqs = [
        {"completion_tokens": 30, "spec_verify_ct": 10},
        {"completion_tokens": 20, "spec_verify_ct": 10},
        {"completion_tokens": 7, "spec_verify_ct": None},  # absent in meta_info
        {"completion_tokens": 5, "spec_verify_ct": 0},
    ]
    s = accept_stats(reqs)
    assert s["accept_length"] == 2.5  # 50 / 20, not (50 + 12) / 20
    assert s["verified_requests"] == 2 and s["unverified_requests"] == 2
    assert s["unverified_completion_tokens"] == 12 and s["requests"] == 4
    assert s["per_request"]["min"] == 2.0 and s["per_request"]["max"] == 3.0
    lo, hi = s["accept_length_ci95"]
    assert lo < 2.5 < hi


def test_nothing_verified_gives_no_figure():
    s = accept_stats([{"completion_tokens": 9, "spec_verify_ct": None}])
    assert s["accept_length"] is None and s["accept_length_ci95"] is None


def _request(rng: random.Random, p: float, steps: int = 3) -> dict:
    """One request of chain drafting: each verify accepts a geometric run (capped) + bonus."""
    verify = rng.randint(5, 60)
    tokens = 0
    for _ in range(verify):
        a = 0
        while a < steps and rng.random() < p:
            a += 1
        tokens += a + 1
    return {"completion_tokens": tokens, "spec_verify_ct": verify}


def test_the_interval_covers_the_true_acceptance_about_95_percent_of_the_time():
    rng = random.Random(0)
    p = 0.6
    true = sum(p**k for k in range(4))  # E[a + 1] with a capped at 3
    trials, covered = 300, 0
    for _ in range(trials):
        lo, hi = accept_stats([_request(rng, p) for _ in range(40)])["accept_length_ci95"]
        covered += lo <= true <= hi
    assert 0.90 <= covered / trials <= 0.99, covered / trials
