"""SGLang serving the drafter: `sglang-launch` (the flags each mode needs, sglang_launch_cmd.py),
and the checks against a live server, `serve-check` and `accept` (checks.py; the acceptance
statistics in accept_stats.py). Standard library only (sglang itself is never imported)."""
