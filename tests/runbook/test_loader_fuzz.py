"""Hypothesis: no input makes the loader raise anything but a RunbookError with located messages."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runbook.loader import RunbookError, load_text

LOCATED = re.compile(r"^(rb\.yaml:\d+:\d+: |--set )")

KEYS = [
    "name",
    "steps",
    "id",
    "title",
    "run",
    "requires",
    "preconditions",
    "check",
    "path",
    "min",
    "destructive",
    "confirm",
    "vars",
    "secrets",
    "env",
    "retry",
    "max",
    "on",
    "timeout",
    "skip_if",
    "disk_free",
    "path_exists",
    "step_succeeded",
    "step",
    "within",
    "auto_confirm",
    "detach",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**6),
    st.text(max_size=12),
    st.sampled_from(["${a}", "${", "$${x}", "1GiB", "5m", "echo hi", "prep"]),
)
trees = st.recursive(
    scalars,
    lambda c: st.one_of(
        st.lists(c, max_size=4), st.dictionaries(st.sampled_from(KEYS), c, max_size=5)
    ),
    max_leaves=25,
)


def _yaml(obj) -> str:
    import json

    return json.dumps(obj)  # JSON is YAML


def _check(text: str) -> None:
    try:
        load_text(text, "rb.yaml")
    except RunbookError as exc:
        assert exc.problems
        for p in exc.problems:
            assert LOCATED.match(p), p


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees)
def test_structured_garbage(tree):
    _check(_yaml({"name": "t", "steps": tree}) if not isinstance(tree, dict) else _yaml(tree))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text(text):
    _check(text)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_as_text(data):
    _check(data.decode("utf-8", "replace"))


TAGS = st.sampled_from(["", "!!python/object:os.system ", "!x ", "!!str ", "!!set ", "!!int "])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(TAGS, st.integers(1, 9)), min_size=1, max_size=6))
def test_tags_and_alias_chains(levels):
    """Tags anywhere and alias chains of any fan-out: a located error or a runbook, fast."""
    lines = ["a0: &a0 lol"]
    for d, (tag, width) in enumerate(levels, 1):
        lines.append(f"a{d}: {tag}&a{d} [{', '.join([f'*a{d - 1}'] * width)}]")
    _check("\n".join(lines) + "\nname: t\nsteps: []\n")
