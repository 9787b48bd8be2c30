"""Attacks on "no runbook value is ever parsed as shell code" (docs/SAFETY.md, Values).

The second layer: the loader splices only word-typed values into shell text, and even those
reach the job's shell by reference (`"${EAGLE_V_x}"`), never as text it parses. Each trial here
hands that mechanism (substitute_shell) a hostile value anyway, runs what executes under real
bash, and checks that no side-effect file appeared and the value arrived byte-exact, or that it
was refused where no expansion can work. The end-to-end test goes through the first layer too.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runbook.interpolate import InterpolationError, substitute_shell

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
    'printf %s "${x}"',
    'printf %s "<${x}>"',
    "printf %s '${x}'",
    "cat <<< ${x}",
    "printf %s $(printf %s ${x}) >/dev/null; printf %s ${x}",
    "echo $(( ${x} + 1 ))",
    "[[ ${x} -eq 1 ]]",
]
REFUSED_SHAPES = {"printf %s '${x}'", "echo $(( ${x} + 1 ))", "[[ ${x} -eq 1 ]]"}
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
    if shape == 'printf %s "<${x}>"':
        return f"<{value}>"
    if shape.startswith("cat <<<"):
        return value + "\n"
    if "<<" not in shape or "printf" in shape:
        return value * (1 if "$(" in shape else shape.count("${x}"))
    return (value + "\n") * shape.count("${x}")


@settings(
    max_examples=500,
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
        text = substitute_shell(shape, lambda _: value)
    except InterpolationError:
        # refusing is allowed only where a value cannot be passed safely: a NUL (no env can
        # carry it), a terminator line in a literal (quoted) heredoc body, an uncertain `<<`,
        # single quotes, arithmetic / [[ ]]
        terminators = {"EOF", "A", "B"} & {ln.lstrip("\t") for ln in value.split("\n")}
        literal_body = "<<'EOF'" in shape or '<<"EOF"' in shape or "<<E\\OF" in shape
        uncertain = "# <<" in shape or "'<<EOF'" in shape or "((1<<" in shape
        held = (
            "\x00" in value
            or (bool(terminators) and literal_body)
            or uncertain
            or shape in REFUSED_SHAPES
        )
        TALLY.trial("hostile value interpolated into a shell command", held)
        assert held, (shape, value)
        return
    held = shape not in REFUSED_SHAPES  # these must be refused, whatever the value
    env = {**os.environ, **text.env}
    p = subprocess.run(["bash", "-c", text.run], capture_output=True, timeout=10, env=env)
    held = held and not pwned.exists()
    out = p.stdout.decode()
    if held and shape.startswith("cat <<-"):
        held = out == _expected(shape, value) or out == "".join(
            line.lstrip("\t") + "\n" for line in value.split("\n")
        )
    elif held and shape == "printf %s $(printf %s ${x})":
        pass  # the outer $(...) is unquoted: its output is split (no side effect is the point)
    elif held and "$(printf %s ${x})" in shape:
        held = out.endswith(value)
    elif held:
        held = out == _expected(shape, value)
    TALLY.trial("hostile value interpolated into a shell command", held)
    assert held, (shape, value, text.run, p.stdout)


def test_shown_form_has_the_values_inline() -> None:
    """The operator (confirmation, dry run, audit) sees the values, quoted for their context."""
    text = substitute_shell(
        'cp ${src} "${dst}/x" && cat <<EOF\n${src}\nEOF', {"src": "a b$c", "dst": 'q"'}.get
    )
    assert text.shown == 'cp \'a b$c\' "q\\"/x" && cat <<EOF\na b\\$c\nEOF'
    assert text.run == 'cp "${EAGLE_V_src}" "${EAGLE_V_dst}/x" && cat <<EOF\n${EAGLE_V_src}\nEOF'
    assert text.env == {"EAGLE_V_src": "a b$c", "EAGLE_V_dst": 'q"'}


def test_set_values_reach_a_real_run_byte_exact(tmp_path: Path) -> None:
    """End to end through the loader, the engine and the real local agent: a hostile `--set`
    value for a word variable is refused in one line (exit 2, nothing run); declared text, it
    goes through env to a step and to a command guard and arrives byte-exact."""
    from tests.faults.tally import TALLY
    from tests.runbook.conftest import Cli

    cli = Cli(tmp_path)
    pwned = tmp_path / "pwned"
    out_file = tmp_path / "out"
    value = f"a\"b'c $(touch {pwned}) `touch {pwned}`\nEOF\ntouch {pwned}\n$HOME \\"
    rb = cli.runbook(f"""\
        name: inject
        vars:
          w: plain
          x: {{type: text, value: plain}}
        steps:
          - id: s
            title: Writes the value
            env: {{X: "${{x}}"}}
            preconditions:
              - {{check: command, run: 'test -n "$X" && printf %s "$X" >/dev/null', env: {{X: "${{x}}"}}}}
            run: "cat >{out_file} <<EOF\\n$X\\nEOF\\nprintf '%s|' \\"$X\\" \\"${{w}}\\" >>{out_file}"
    """)
    refused = cli("run", "--auto", "--set", f"w={value}", str(rb))
    run = cli("run", "--auto", "--set", f"x={value}", str(rb))
    held = (
        refused.returncode == 2
        and refused.stderr.startswith("--set w=")
        and run.returncode == 0
        and not pwned.exists()
        and out_file.read_text() == f"{value}\n{value}|plain|"
    )
    TALLY.trial("hostile --set value through a real run", held)
    assert held, (refused.stderr, run.stdout[-2000:], run.stderr)
