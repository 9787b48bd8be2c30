"""Attacks on "no runbook value is parsed as code" where the shell hands text to another parser:
`sh -c`, `bash -c`, `eval`, `su -c`, `ssh HOST CMD`, `xargs ... sh -c`, `env ... sh -c`, a pipe or
heredoc into `bash`, `python -c`, awk and sed programs (runbook/shell_code.py).

Each trial interpolates a hostile value into a command shape; what executes runs under real
bash with its env. Held: the shape is refused at validate time (it must be, whatever the value,
for the shapes that put the value into code), or it runs with no side effect and the value
arrives byte-exact (the safe forms: the value as an argument after the code, in the environment,
on stdin of a program that reads data).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runbook.interpolate import InterpolationError, substitute_shell
from tests.runbook.conftest import Cli

CODE_SHAPES = [  # the value would be parsed as code: refused
    'sh -c "printf %s ${x}"',
    "bash -c 'printf %s ${x}'",
    'eval "printf %s ${x}"',
    "eval printf %s ${x}",
    'env A=1 sh -c "printf %s ${x}"',
    'timeout 5 bash -lc "printf %s ${x}"',
    'nohup sh -c "printf %s ${x}" 2>/dev/null',
    'su -c "printf %s ${x}" root',
    'ssh -o BatchMode=yes -o ConnectTimeout=1 127.0.0.1 "printf %s ${x}" 2>/dev/null',
    'find /dev/null -maxdepth 0 -exec sh -c "printf %s ${x}" \\;',
    "printf '%s' ${x} | xargs -0 -I{} sh -c 'printf %s {}'",
    "printf 'printf %%s %s' ${x} | bash",
    "bash <<EOF\nprintf %s ${x}\nEOF",
    "bash <<'EOF'\nprintf %s ${x}\nEOF",
    'bash <<< "printf %s ${x}"',
    'source <(printf "printf %%s %s" ${x})',
    '$BASH -c "printf %s ${x}"',
    'v=$(sh -c "printf %s ${x}"); printf %s "$v"',
    'v=${x}; bash -c "printf %s $v"',
    "python3 -c \"import sys; sys.stdout.write('${x}')\"",
    'awk \'BEGIN { printf "%s", "${x}" }\'',
    "printf 'a\\n' | sed -n \"s/.*/${x}/p\" | tr -d '\\n'",
]
SAFE_SHAPES = [  # the value is data: allowed, byte-exact
    "bash -c 'printf %s \"$1\"' _ ${x}",
    "env A=1 sh -c 'printf %s \"$1\"' sh ${x}",
    "python3 -c 'import sys; sys.stdout.write(sys.argv[1])' ${x}",
    'X=${x} awk \'BEGIN { printf "%s", ENVIRON["X"] }\'',
    "bash -s -- ${x} <<'EOF'\nprintf %s \"$1\"\nEOF",
    "v=${x}; eval 'printf %s \"$v\"'",
    "printf %s ${x} | cat",
    "find /dev/null -maxdepth 0 -exec printf %s ${x} \\;",
    "timeout 5 printf %s ${x}",
]
ATOMS = [
    "$(touch {p})",
    "`touch {p}`",
    "; touch {p}",
    "\ntouch {p}\n",
    "'; touch {p}; '",
    '"; touch {p}; "',
    "'",
    '"',
    "\\",
    "$",
    "%s",
    "/e",
    "${{HOME}}",
    "\t",
    " ",
    "x",
    "\x00",
]


def _attack(shape: str) -> str:
    if shape in CODE_SHAPES:
        return "value in code another parser runs (sh -c, eval, ssh, ...)"
    return 'value as data next to another parser\'s code ("$1", env, stdin)'


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.sampled_from(CODE_SHAPES + SAFE_SHAPES),
    st.lists(st.sampled_from(ATOMS), min_size=1, max_size=5),
)
def test_values_never_reach_another_parser_as_code(
    tmp_path: Path, shape: str, atoms: list[str]
) -> None:
    from tests.faults.tally import TALLY

    pwned = tmp_path / "pwned"
    pwned.unlink(missing_ok=True)
    value = "".join(a.format(p=pwned) for a in atoms)
    try:
        text = substitute_shell(shape, lambda _: value)
    except InterpolationError:
        held = shape in CODE_SHAPES or "\x00" in value
        TALLY.trial(_attack(shape), held)
        assert held, (shape, value)
        return
    env = {**os.environ, **text.env}
    p = subprocess.run(
        ["bash", "-c", text.run], capture_output=True, timeout=20, env=env, cwd=tmp_path
    )
    held = not pwned.exists() and p.stdout == value.encode()
    TALLY.trial(_attack(shape), held)
    assert held, (shape, value, text.run, p.stdout, p.stderr[-500:])


def test_refused_at_validate_with_its_place_and_the_fix(tmp_path: Path) -> None:
    """Through the loader: one located line per refusal (file:line:col), saying what to write
    instead; the argv form (`run: [bash, -c, ...]`) too; the safe forms validate and run, with a
    hostile --set value, byte-exact and without side effect on the real local agent."""
    cli = Cli(tmp_path)
    bad = cli.runbook(
        """\
        name: code
        vars: {x: plain}
        steps:
          - id: a
            title: A
            run: |
              echo start
              bash -c "echo ${x}"
          - id: b
            title: B
            run: [ssh, box, "rm -rf ${x}"]
          - id: c
            title: C
            preconditions:
              - {check: command, run: "eval test -n ${x}"}
        """,
        "bad.yaml",
    )
    out = cli("validate", str(bad))
    err = out.stdout + out.stderr
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert out.returncode == 2, err
    assert len(lines) == 3, err
    assert all(ln.startswith(f"{bad}:") for ln in lines), err
    assert "bash -c '... \"$1\"' _ ${x}" in err and "printf '%s' ${x} | ssh HOST" in err
    assert "v=${x}; eval 'cmd \"$v\"'" in err
    from tests.faults.tally import TALLY

    pwned = tmp_path / "pwned"
    out_file = tmp_path / "out"
    value = f"a'b\"c $(touch {pwned}) `touch {pwned}`; touch {pwned}\n$HOME \\"
    good = cli.runbook(
        f"""\
        name: code
        vars: {{x: plain}}
        steps:
          - id: a
            title: A
            run: bash -c 'printf %s "$1" > {out_file}' _ ${{x}}
          - id: b
            title: B
            run: [bash, -c, 'printf %s "$1" >> {out_file}', _, "${{x}}"]
        """,
        "good.yaml",
    )
    cli("validate", str(good), check=0)
    cli("run", "--auto", "--set", f"x={value}", str(good), check=0)
    held = not pwned.exists() and out_file.read_text() == value * 2
    TALLY.trial("code shapes refused at validate (located), safe forms run", held)
    assert held
