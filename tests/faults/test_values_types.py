"""Fuzz of the value types (runbook/value_types.py): whatever a word type accepts stays one inert
word for every shell parser, spliced *unquoted* into code that a nested shell parses again
(`sh -c "... ${x} ..."`, `eval`), under dash and under bash in its POSIX mode; no input crashes
a type check; an inferred type accepts its own default; size and duration read what they accept.
"""

from __future__ import annotations

import shlex
import string
import subprocess
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runbook import value_types
from runbook.interpolate import as_text
from runbook.units import parse_duration, parse_size
from tests.faults.tally import TALLY

WORD_TYPES = [t for t in value_types.TYPE_NAMES if t not in ("text", "enum")]
SHELL_SPECIAL = set("'\"`$\\()[]{}*?;&|<> \t\n#!~^")
# words drawn mostly from the allowed alphabet and near misses (each shell-special character)
ALPHABET = string.ascii_letters + string.digits + "_./:@%+,=-" + "".join(SHELL_SPECIAL)


@settings(max_examples=2000, deadline=None)
@given(st.sampled_from(WORD_TYPES + ["text"]), st.text(max_size=40))
def test_no_input_crashes_a_type_check(kind: str, value: str) -> None:
    why = value_types.refusal(kind, value)
    assert why is None or (isinstance(why, str) and why)


@settings(max_examples=3000, deadline=None)
@given(st.sampled_from(WORD_TYPES), st.text(alphabet=ALPHABET, max_size=24))
def test_an_accepted_word_holds_no_shell_syntax(kind: str, value: str) -> None:
    if value_types.refusal(kind, value) is not None:
        return
    held = (
        not (set(value) & SHELL_SPECIAL)
        and shlex.quote(value) in (value, "''")  # Python's own idea of a shell-safe word
        and not value.startswith(("-", "+", "=", "~", "%"))
    )
    TALLY.trial("value types: an accepted word holds no shell syntax", held)
    assert held, (kind, value)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.sampled_from(["path", "name", "url"]),
    st.text(alphabet=ALPHABET, min_size=1, max_size=16),
    st.sampled_from(["/usr/bin/dash", "/usr/bin/bash"]),
)
def test_an_accepted_word_is_inert_in_nested_shell_code(
    tmp_path: Path, kind: str, value: str, shell: str
) -> None:
    """Spliced into code a second shell parses (the shape values used to escape through)."""
    if kind == "url":
        value = "https://h/" + value
    if value_types.refusal(kind, value) is not None:
        return
    canary = tmp_path / "canary"
    code = f"printf '%s|' {value} x{value}x; eval printf \"'%s|'\" {value}"
    p = subprocess.run(
        ["sh", "-c", code], executable=shell, capture_output=True, cwd=tmp_path, timeout=10
    )
    held = p.stdout.decode() == f"{value}|x{value}x|{value}|" and not canary.exists()
    TALLY.trial("value types: an accepted word is inert in nested shell code", held)
    assert held, (kind, value, shell, p.stdout, p.stderr)


@settings(max_examples=1000, deadline=None)
@given(
    st.one_of(
        st.booleans(),
        st.integers(min_value=-(10**6), max_value=10**12),
        st.floats(allow_nan=False, allow_infinity=False, min_value=0, max_value=1e9),
        st.text(max_size=30),
    )
)
def test_an_inferred_type_accepts_its_default(default: object) -> None:
    kind = value_types.infer(default)
    text = as_text(default)
    if "\0" in text:  # no type holds a NUL (no environment can carry it): refused, located
        assert value_types.refusal(kind, text) is not None
        return
    assert value_types.refusal(kind, text) is None, (default, kind)


@settings(max_examples=1000, deadline=None)
@given(st.text(alphabet="0123456789.kKmMgGtTiIbBsShHdD ", max_size=12))
def test_size_and_duration_read_what_they_accept(value: str) -> None:
    if value_types.refusal("size", value) is None:
        assert parse_size(value) >= 0
    if value_types.refusal("duration", value) is None:
        assert parse_duration(value) >= 0
