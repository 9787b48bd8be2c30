"""Attacks on "no runbook value is parsed as code" where the shell hands text to another parser:
`sh -c`, `bash -c`, `eval`, `su -c`, `ssh HOST CMD`, `xargs ... sh -c`, `env ... sh -c`, a pipe or
heredoc into `bash`, `python -c`, awk and sed programs.

The defence is the value's type (runbook/value_types.py), not the table of such commands
(runbook/shell_code.py, now a lint): through the real loader, a variable inferred from a word
default refuses every hostile `--set` value, and one declared `type: text` may not be spliced
into any of these shapes. What is accepted (a word) runs under real bash with no side effect and,
in the data forms, arrives byte-exact; validate warns (located) where a word sits in code.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runbook.loader import RunbookError, load_text
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


def _runbook(shape: str, decl: str) -> str:
    import json

    return (
        f"name: code\nvars:\n  x: {decl}\nsteps:\n"
        f"  - {json.dumps({'id': 's', 'title': 'S', 'run': shape})}\n"
    )


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.sampled_from(CODE_SHAPES + SAFE_SHAPES),
    st.sampled_from(["plain", "{type: text, value: plain}"]),
    st.lists(st.sampled_from(ATOMS), min_size=1, max_size=5),
)
def test_values_never_reach_another_parser_as_code(
    tmp_path: Path, shape: str, decl: str, atoms: list[str]
) -> None:
    from tests.faults.tally import TALLY

    pwned = tmp_path / "pwned"
    pwned.unlink(missing_ok=True)
    value = "".join(a.format(p=pwned) for a in atoms)
    try:
        loaded = load_text(_runbook(shape, decl), "rb.yaml", {"x": value})
    except RunbookError as exc:
        # refused: a text variable in any shell string, or a value outside the word type (a
        # NUL is no value at all: no environment can carry it)
        held = all(
            p.startswith("--set x=") and ("x is a path" in p or "NUL" in p)
            if p.startswith("--set")
            else p.startswith("rb.yaml:")
            and (
                ("${x} is text" in p and decl != "plain")
                or "${x} is inside quotes '...', where nothing expands" in p  # refused as well
            )
            for p in exc.problems
        )
        TALLY.trial(_attack(shape), held)
        assert held, (shape, value, exc.problems)
        return
    step = loaded.runbook.steps[0]
    assert decl == "plain" and isinstance(step.run, str)
    env = {**os.environ, **step.env, **step.run_env}
    p = subprocess.run(
        ["bash", "-c", step.run_exec or step.run],
        capture_output=True,
        timeout=20,
        env=env,
        cwd=tmp_path,
    )
    held = not pwned.exists() and (shape in CODE_SHAPES or p.stdout == value.encode())
    TALLY.trial(_attack(shape), held)
    assert held, (shape, value, step.run_exec, p.stdout, p.stderr[-500:])


def test_code_shapes_warned_at_validate_text_refused_and_env_is_the_way(tmp_path: Path) -> None:
    """Through the CLI: a word in code is a located warning (validate still ok); the same
    shapes with a text variable are located errors naming the variable, its type and the way
    (env); that way runs a hostile --set value byte-exact with no side effect on the real
    local agent."""
    cli = Cli(tmp_path)
    body = """\
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
        """
    body = textwrap.dedent(body)
    word = cli.runbook("name: code\nvars: {x: plain}\n" + body, "word.yaml")
    out = cli("validate", str(word), check=0)
    warnings = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(warnings) == 3, out.stderr
    assert all(ln.startswith(f"{word}:") and ": warning: ${x}" in ln for ln in warnings)
    assert "bash -c '... \"$1\"' _ ${x}" in out.stderr
    text = cli.runbook("name: code\nvars: {x: {type: text, value: plain}}\n" + body, "text.yaml")
    out = cli("validate", str(text), check=2)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 3, out.stderr
    assert all(ln.startswith(f"{text}:") and "${x} is text" in ln for ln in lines), lines
    assert all("env: {X:" in ln for ln in lines)
    from tests.faults.tally import TALLY

    pwned = tmp_path / "pwned"
    out_file = tmp_path / "out"
    value = f"a'b\"c $(touch {pwned}) `touch {pwned}`; touch {pwned}\n$HOME \\"
    good = cli.runbook(
        f"""\
        name: code
        vars: {{x: {{type: text, value: plain}}}}
        steps:
          - id: a
            title: A
            run: bash -c 'printf %s "$X" > {out_file}'
            env: {{X: "${{x}}"}}
          - id: b
            title: B
            run: [bash, -c, 'printf %s "$X" >> {out_file}']
            env: {{X: "${{x}}"}}
        """,
        "good.yaml",
    )
    cli("validate", str(good), check=0)
    refused = cli("run", "--auto", "--set", f"x={value}", str(word), check=2)
    cli("run", "--auto", "--set", f"x={value}", str(good), check=0)
    held = (
        refused.stderr.startswith("--set x=")
        and not pwned.exists()
        and out_file.read_text() == value * 2
    )
    TALLY.trial("code shapes: text refused at validate (located), env form runs", held)
    assert held
