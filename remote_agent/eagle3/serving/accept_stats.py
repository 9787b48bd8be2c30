"""Acceptance length over requests: SGLang's token-weighted formula, its spread and a 95 % CI.

A request that finished before any verify step (no `spec_verify_ct`, or 0: e.g. max_new_tokens
reached at prefill) says nothing about the drafter; adding its completion tokens would inflate
the figure, so it is counted apart. The interval is the ratio estimator's normal approximation
(delta method): Var(R) ~ sum((t_i - R v_i)^2) / ((n - 1) n vbar^2).
"""

from __future__ import annotations

import math
import statistics
from typing import Any


def accept_stats(per_request: list[dict[str, Any]]) -> dict[str, Any]:
    """per_request: {"completion_tokens": int, "spec_verify_ct": int | None} per request."""
    verified = [r for r in per_request if r.get("spec_verify_ct")]
    unverified = [r for r in per_request if not r.get("spec_verify_ct")]
    tokens = sum(r["completion_tokens"] for r in verified)
    verify = sum(r["spec_verify_ct"] for r in verified)
    ratio = tokens / verify if verify else None
    out: dict[str, Any] = {
        "requests": len(per_request),
        "verified_requests": len(verified),
        "unverified_requests": len(unverified),
        "unverified_completion_tokens": sum(r["completion_tokens"] for r in unverified),
        "completion_tokens": tokens,
        "verify_steps": verify,
        "accept_length": ratio,
        "accept_length_ci95": None,
        "per_request": None,
    }
    if ratio is None:
        return out
    each = sorted(r["completion_tokens"] / r["spec_verify_ct"] for r in verified)
    q = statistics.quantiles(each, n=10, method="inclusive") if len(each) > 1 else each * 9
    out["per_request"] = {
        "min": round(each[0], 4),
        "p10": round(q[0], 4),
        "median": round(statistics.median(each), 4),
        "p90": round(q[-1], 4),
        "max": round(each[-1], 4),
        "mean": round(statistics.fmean(each), 4),
    }
    n = len(verified)
    if n > 1:
        vbar = verify / n
        resid = sum((r["completion_tokens"] - ratio * r["spec_verify_ct"]) ** 2 for r in verified)
        half = 1.96 * math.sqrt(resid / ((n - 1) * n * vbar * vbar))
        out["accept_length_ci95"] = [round(ratio - half, 4), round(ratio + half, 4)]
    return out
