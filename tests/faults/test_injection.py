"""Attacks on "no runbook value is ever parsed as shell code" (docs/SAFETY.md, No injection).

Each trial interpolates a hostile value into a command shape, runs the result under real bash,
and checks that no side-effect file appeared and the value arrived byte-exact (or was refused).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runbook.interpolate import InterpolationError, substitute

SHAPES = [
    "printf %s ${x}",
    "cat <<EOF\n${x}\nEOF",
    "cat <<'EOF'\n${x}\nEOF",
    'cat <<"EOF"\n${x}\nEOF',
    "cat <<-EOF\n${x}\nEOF",
    "cat <<E\\OF\n${x}\nEOF",
    "cat <<EOF | cat\n${x}\nEOF",
    "cat <<A; cat <<B\n${x}\nA\n${x}\nB",
    'echo "it\'s" >/dev/null; cat <<EOF\n${x}\nEOF',
    "printf %s $(printf %s ${x})",
    "echo $((1<<2)) >/dev/null\nprintf %s ${x}",
    "# <<EOF\nprintf %s ${x}",
    "echo '<<EOF' >/dev/null\nprintf %s ${x}",
]
ATOMS = [
    "$(touch {p})",
    "`touch {p}`",
    "; touch {p}",
    "\ntouch {p}\n",
    "\nEOF\ntouch {p}\n",
    "\nA\ntouch {p}\n",
    "'",
    '"',
    "\\",
    "$",
    "${{HOME}}",
    "\x00",
    "\t",
    "EOF",
    " ",
    "x",
]


def _expected(shape: str, value: str) -> str:
    n = shape.count("${x}")
    return value * n if "<<" not in shape or "printf" in shape else (value + "\n") * n


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.sampled_from(SHAPES), st.lists(st.sampled_from(ATOMS), min_size=1, max_size=6))
def test_hostile_values_never_run(tmp_path: Path, shape: str, atoms: list[str]) -> None:
    from tests.faults.tally import TALLY

    pwned = tmp_path / "pwned"
    pwned.unlink(missing_ok=True)
    value = "".join(a.format(p=pwned) for a in atoms)
    try:
        command = substitute(shape, lambda _: value, shell=True)
    except InterpolationError:
        # refusing is allowed only where a value cannot be inserted safely: a terminator line, NUL
        terminators = {"EOF", "A", "B"} & {ln.lstrip("\t") for ln in value.split("\n")}
        uncertain = "# <<" in shape or "'<<EOF'" in shape or "((" in shape
        held = "\x00" in value or bool(terminators) or uncertain
        TALLY.trial("hostile value interpolated into a shell command", held)
        assert held, (shape, value)
        return
    p = subprocess.run(["bash", "-c", command], capture_output=True, timeout=10)
    held = not pwned.exists()
    if held and shape.endswith("printf %s ${x}") and "$(" not in shape:
        held = p.stdout.decode() == value
    elif held and "printf" not in shape:
        body = p.stdout.decode()
        if shape.startswith("cat <<-"):
            body_ok = body == "".join(line.lstrip("\t") + "\n" for line in value.split("\n"))
        else:
            body_ok = body == _expected(shape, value)
        held = body_ok
    TALLY.trial("hostile value interpolated into a shell command", held)
    assert held, (shape, value, command, p.stdout)
