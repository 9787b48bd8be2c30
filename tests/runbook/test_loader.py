"""Loader: interpolation, quoting, secrets, schema errors located at file:line:col."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from runbook.loader import RunbookError, load_text
from runbook.schema import DiskFree, StepSucceeded

BASE = """\
name: t
vars:
  root: /data
  merged: ${root}/merged.jsonl
  n: 5
secrets:
  KEY: {env: T_API_KEY}
auto_confirm: [wipe]
steps:
  - id: prep
    title: Prepare
    run: echo ${merged} ${n}
    env: {API_KEY: "${KEY}", PLAIN: "${root}"}
    preconditions:
      - {check: disk_free, path: "${root}", min: 1.5GiB}
  - id: wipe
    title: Wipe
    delete: ["${root}/old"]
    delete_within: "${root}"
    requires: [prep]
    destructive: true
    confirm: "delete ${root}/old?"
    preconditions:
      - {check: step_succeeded, step: prep, within: 2h}
"""


def problems(text: str, **kw) -> list[str]:
    with pytest.raises(RunbookError) as info:
        load_text(text, "rb.yaml", **kw)
    return info.value.problems


def test_valid_runbook_interpolates_and_quotes():
    rb = load_text(BASE, "rb.yaml").runbook
    prep, wipe = rb.steps
    assert prep.run == "echo /data/merged.jsonl 5"
    assert wipe.run is None and wipe.delete == ["/data/old"] and wipe.delete_within == "/data"
    assert prep.env == {"PLAIN": "/data"}
    assert prep.secret_env == {"API_KEY": "KEY"}  # the secret's value never enters the model
    check = prep.preconditions[0]
    assert isinstance(check, DiskFree) and check.min == int(1.5 * 2**30)
    assert check.probe() == {"check": "disk_free", "path": "/data", "min_bytes": int(1.5 * 2**30)}
    within = wipe.preconditions[0]
    assert isinstance(within, StepSucceeded) and within.within == 7200.0
    assert wipe.confirm == "delete /data/old?"


@pytest.mark.parametrize(
    "hostile",
    [
        "/x; touch /tmp/pwned",
        "$(touch /tmp/pwned)",
        "`id`",
        "a'b\"c",
        "x\ny",
        "-rf /",
        "${root}",
        "*",
    ],
)
def test_override_values_outside_their_type_are_refused(hostile):
    """`root` is a path (inferred from /data): a --set value a shell could read as syntax is
    refused in one line naming the variable, its type and what it may hold."""
    (msg,) = problems(BASE, overrides={"root": hostile})
    assert msg.startswith(f"--set root={hostile!r}: root is a path (inferred from its default")
    assert "letters, digits and _ . / : @ % + , = -" in msg and "type: text" in msg


def test_word_values_reach_the_shell_as_one_inert_word(tmp_path):
    rb = load_text(BASE, "rb.yaml", overrides={"root": "./a=b:c@d%e+f,g-h"}).runbook
    cmd = rb.steps[0].run
    assert isinstance(cmd, str)
    assert shlex.split(cmd) == ["echo", "./a=b:c@d%e+f,g-h/merged.jsonl", "5"]
    out = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout == "./a=b:c@d%e+f,g-h/merged.jsonl 5\n"
    assert list(tmp_path.iterdir()) == []


def test_placeholder_inside_quotes_is_refused():
    text = BASE.replace("run: echo ${merged} ${n}", "run: echo '${merged}'")
    (msg,) = problems(text)
    assert msg.startswith("rb.yaml:12:10: steps[0].run:") and "inside quotes" in msg


def test_undefined_variable_and_shell_hint():
    text = BASE.replace("run: echo ${merged} ${n}", "run: echo ${HOME}")
    (msg,) = problems(text)
    assert re.match(
        r"rb\.yaml:12:\d+: steps\[0\]\.run: undefined variable 'HOME' \(for a shell variable write \$NAME",
        msg,
    )


def test_secret_in_command_line_is_refused():
    text = BASE.replace("run: echo ${merged} ${n}", "run: echo ${KEY}")
    (msg,) = problems(text)
    assert "secret 'KEY' can only be passed to a step through env" in msg


def test_secret_mixed_into_env_value_is_refused():
    text = BASE.replace('API_KEY: "${KEY}"', 'API_KEY: "Bearer ${KEY}"')
    (msg,) = problems(text)
    assert "rb.yaml:13:" in msg and "a secret must be the whole value" in msg


def test_unknown_key_is_located():
    text = BASE.replace("    title: Prepare\n", "    title: Prepare\n    retires: 3\n")
    (msg,) = problems(text)
    assert msg.startswith("rb.yaml:12:5: steps[0].retires: unknown key")


def test_unknown_check_type_lists_the_valid_ones():
    text = BASE.replace("check: disk_free", "check: disk_fre")
    (msg,) = problems(text)
    assert msg.startswith("rb.yaml:15:9: steps[0].preconditions[0]: unknown check type 'disk_fre'")
    assert "disk_free" in msg


def test_bad_size_is_located_at_the_value():
    text = BASE.replace("min: 1.5GiB", "min: 5 lightyears")
    (msg,) = problems(text)
    assert msg.startswith("rb.yaml:15:") and "cannot read size '5 lightyears'" in msg


def test_destructive_needs_confirm_and_auto_confirm_must_be_destructive():
    text = BASE.replace('    confirm: "delete ${root}/old?"\n', "")
    assert any("needs `confirm:`" in p for p in problems(text))
    text = BASE.replace("auto_confirm: [wipe]", "auto_confirm: [prep]")
    assert any("auto_confirm lists destructive steps only" in p for p in problems(text))


def test_requires_unknown_and_cycles():
    text = BASE.replace("requires: [prep]", "requires: [nope]")
    assert any("steps[1].requires[0]: unknown step 'nope'" in p for p in problems(text))
    cyc = BASE.replace("    title: Prepare\n", "    title: Prepare\n    requires: [wipe]\n")
    assert any(
        "requires form a cycle: prep -> wipe -> prep" in p or "wipe -> prep -> wipe" in p
        for p in problems(cyc)
    )


def test_duplicate_ids_and_duplicate_keys():
    text = BASE.replace("id: wipe", "id: prep")
    assert any("duplicate step id 'prep'" in p for p in problems(text))
    dup = BASE.replace("    title: Prepare\n", "    title: Prepare\n    title: Again\n")
    (msg,) = problems(dup)
    assert msg.startswith("rb.yaml:12:5:") and "duplicate key 'title'" in msg


def test_override_of_undeclared_variable_is_an_error():
    assert any("--set nope: no such variable" in p for p in problems(BASE, overrides={"nope": "1"}))


def test_variable_cycle():
    text = BASE.replace("root: /data", "root: ${merged}")
    assert any("cycle" in p for p in problems(text))


def test_literal_dollar_brace_escape():
    text = BASE.replace("run: echo ${merged} ${n}", "run: echo $${HOME} $HOME")
    assert load_text(text, "rb.yaml").runbook.steps[0].run == "echo ${HOME} $HOME"


def test_yaml_11_boolean_keys_are_taken_as_written():
    text = BASE.replace(
        "    title: Prepare\n",
        "    title: Prepare\n    idempotent: true\n    retry: {max: 2, on: [lost, 137]}\n",
    )
    retry = load_text(text, "rb.yaml").runbook.steps[0].retry
    assert retry is not None and retry.on == ["lost", 137]


def test_shipped_runbooks_walk_each_delete_target_once():
    """A delete's size is its delete_target evidence (from `delete:`), which walks the target;
    a `dir_size` guard on the same path would walk a multi-TB directory a second time on every
    evaluation and again at launch. The shipped runbooks carry none."""
    from runbook.loader import load_runbook
    from tests.support.paths import REPO

    for path in sorted((REPO / "runbooks").glob("*.yaml")):
        rb = load_runbook(path).runbook
        for step in rb.steps:
            sized = {c.path for c in step.preconditions if c.check == "dir_size"}
            assert not sized & set(step.delete), (path.name, step.id)


DELETE_STEP = """\
name: d
steps:
  - id: wipe
    title: Wipe
    destructive: true
    confirm: wipe?
{body}
"""


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        (
            '    delete: ["/w/old*"]\n    delete_within: /w',
            "rb.yaml:7:14: steps[0].delete[0]: '/w/old*'",
        ),
        ('    delete: ["/w/{a,b}"]\n    delete_within: /w', "is not expanded here"),
        ('    delete: ["/w/a/../b"]\n    delete_within: /w', "may not contain `..`"),
        ('    delete: ["/w/old"]', "`delete:` (the paths) and `delete_within:`"),
        (
            '    delete: ["/w/old"]\n    delete_within: /w\n    run: "true"',
            "done by the agent itself: remove run",
        ),
        ("    run: [rm, -rf, /w/old]", "rb.yaml:7:10: steps[0].run: `rm` removes files"),
        (
            "    run: [rm, -rf, /w/old]\n    removes: [/w/old]\n    removes_within: /w",
            "`removes:`/`removes_within:` are gone",
        ),
    ],
)
def test_delete_steps_are_checked_where_written(body, expect):
    found = problems(DELETE_STEP.format(body=body))
    assert any(expect in p for p in found), found


def test_a_delete_step_needs_destructive():
    text = DELETE_STEP.format(body='    delete: ["/w/old"]\n    delete_within: /w')
    found = problems(
        text.replace("    destructive: true\n", "").replace("    confirm: wipe?\n", "")
    )
    assert any("must be `destructive: true`" in p for p in found), found


def test_unknown_key_in_a_variable_declaration_names_the_key_and_its_mapping():
    """It said `unknown key '?'` and listed the runbook's top-level keys."""
    text = BASE.replace(
        "vars:\n", "vars:\n  tok:\n    value: x\n    type: text\n    secret: true\n", 1
    )
    assert "vars:\n  tok:" in text
    (msg,) = problems(text)
    assert ".tok.secret: unknown key 'secret'" in msg, msg
    assert "`secrets:`" in msg and "allowed here: type, value, choices" in msg, msg
    text = BASE.replace(
        "vars:\n", "vars:\n  m:\n    value: 3\n    type: integer\n    vlaue: 4\n", 1
    )
    (msg,) = problems(text)
    assert "unknown key 'vlaue'; did you mean 'value'?" in msg, msg
