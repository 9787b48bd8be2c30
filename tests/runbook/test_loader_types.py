"""Loader: typed values (declared or inferred), where each type may go, dangerous env names."""

from __future__ import annotations

import pytest

from runbook.loader import RunbookError, load_text


def problems(text: str, **kw) -> list[str]:
    with pytest.raises(RunbookError) as info:
        load_text(text, "rb.yaml", **kw)
    return info.value.problems


TYPED = """\
name: t
vars:
  root: /srv/x
  n: 8
  lr: 0.25
  on: true
  big: {type: size, value: 500GiB}
  wait: {type: duration, value: 1h30m}
  mode: {type: enum, choices: [fast, slow], value: fast}
  site: {type: url, value: "https://example.org/x"}
  box: {type: name, value: gpu-a}
  note: {type: text, value: "any text: $(not code) 'here'"}
steps:
  - id: s
    title: S
    run: echo ${root} ${n} ${lr} ${on} ${big} ${wait} ${mode} ${site} ${box}
    env: {NOTE: "${note}"}
"""


def test_declared_and_inferred_types():
    loaded = load_text(TYPED, "rb.yaml")
    t = loaded.types
    assert [t[k] for k in ("root", "n", "lr", "on", "big", "wait", "mode", "site", "box")] == [
        "path", "integer", "number", "bool", "size", "duration", "enum", "url", "name",
    ]  # fmt: skip
    assert t["note"] == "text"
    step = loaded.runbook.steps[0]
    assert step.env == {"NOTE": "any text: $(not code) 'here'"}
    assert loaded.vars["big"] == "500GiB" and loaded.runbook.vars["n"] == 8


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("n", "8x", "an integer is digits only"),
        ("n", "-1", "starts with '-'"),
        ("lr", "1/2", "a number is written like 0.25"),
        ("on", "yes", "a bool is true or false"),
        ("big", "5 GiB", "holds a space"),
        ("wait", "soon", "a duration is written like 1h30m"),
        ("mode", "medium", "not one of the choices: fast, slow"),
        ("site", "https://h/?a=1&b", "holds '&' '?'"),
        ("box", "a/b", "a name is letters"),
        ("root", "~/x", "holds '~'"),
        ("root", "PATH=/x", "assignment"),
        ("root", "/x/*", "holds '*'"),
        ("root", "{a,b}", "holds '{' '}'"),
    ],
)
def test_set_outside_the_type_is_one_line_naming_type_and_characters(name, value, says):
    (msg,) = problems(TYPED, overrides={name: value})
    assert msg.startswith(f"--set {name}={value!r}: {name} is a"), msg
    assert says in msg, msg


def test_a_default_outside_its_declared_type_is_located():
    text = TYPED.replace("value: 500GiB", "value: lots")
    (msg,) = problems(text)
    assert msg.startswith("rb.yaml:7:8: vars.big: big is a size (declared)"), msg


def test_a_value_derived_from_a_set_value_is_checked_once():
    text = TYPED.replace("  n: 8\n", "  n: 8\n  sub: ${root}/a\n")
    (msg,) = problems(text, overrides={"root": "/x y"})
    assert msg.startswith("--set root='/x y'"), msg


def test_enum_choices_are_words_and_go_with_enum():
    (msg,) = problems(TYPED.replace("choices: [fast, slow]", "choices: [fast, 'a b']"))
    assert msg.startswith("rb.yaml:9:9: vars.mode:") and "cannot be a word" in msg, msg
    (msg,) = problems(TYPED.replace("type: name, value", "type: name, choices: [a], value"))
    assert "`choices:` goes with `type: enum`" in msg
    (msg,) = problems(TYPED.replace("type: name", "type: word"))
    assert msg.startswith("rb.yaml:11:15: vars.box.type: input should be 'path'"), msg


@pytest.mark.parametrize(
    ("where", "context"),
    [
        ("run: echo ${note}", "a shell `run:` string"),
        ('run: [echo, "${note}"]', "a `run:` argv list"),
        ('run: "true"\n    preconditions: [{check: command, run: "test ${note}"}]', "shell"),
    ],
)
def test_text_is_refused_where_a_parser_reads_it(where, context):
    text = TYPED.replace(
        "run: echo ${root} ${n} ${lr} ${on} ${big} ${wait} ${mode} ${site} ${box}", where
    )
    (msg,) = problems(text)
    assert msg.startswith("rb.yaml:1") and "${note} is text" in msg and context in msg, msg
    assert 'env: {X: "${note}"}' in msg


def test_text_in_host_connection_settings_is_refused_host_vars_typed():
    text = TYPED + "hosts:\n  a: {ssh: '${note}', vars: {nic: 'eth0; x'}}\n"
    msgs = problems(text)
    assert any(m.startswith("rb.yaml:") and "hosts.a.ssh: ${note} is text" in m for m in msgs)


def test_host_vars_take_the_runbook_variable_type():
    text = TYPED + "hosts:\n  a: {ssh: a, vars: {n: eight}}\n"
    (msg,) = problems(text)
    assert msg.startswith("rb.yaml:") and "hosts.a.vars.n: n is an integer" in msg, msg


def test_fanout_vars_are_words():
    text = """\
name: t
vars: {boxes: "a,b"}
hosts:
  a: {ssh: a, vars: {addr: 10.0.0.1}}
  b: {ssh: b, vars: {addr: "10.0.0.2 x"}}
steps:
  - {id: s, title: S, hosts: "${boxes}", run: "echo ${host} ${host_rank} ${addr}"}
"""
    msgs = problems(text)
    assert any("${addr} is text" in m for m in msgs), msgs


@pytest.mark.parametrize("name", ["BASH_ENV", "ENV", "PS4", "LD_PRELOAD", "PYTHONPATH",
                                  "GIT_CONFIG_COUNT", "PERL5OPT", "NODE_OPTIONS", "PATH"])  # fmt: skip
def test_dangerous_env_names_need_allow_env(name):
    text = TYPED.replace('env: {NOTE: "${note}"}', f'env: {{{name}: "${{root}}"}}')
    (msg,) = problems(text)
    assert msg.startswith(f"rb.yaml:17:11: steps[0].env.{name}: {name} is read by"), msg
    assert f"allow_env: [{name}]" in msg
    ok = text.replace(f"env: {{{name}", f"allow_env: [{name}]\n    env: {{{name}")
    assert load_text(ok, "rb.yaml").runbook.steps[0].env == {name: "/srv/x"}
    (msg,) = problems(ok.replace('"${root}"', '"${note}"'))
    assert "and ${note} is text" in msg


def test_dangerous_env_names_in_checks_and_stray_allow_env():
    text = TYPED.replace(
        'env: {NOTE: "${note}"}',
        "postconditions: [{check: command, run: 'true', env: {BASH_ENV: /x}}]\n"
        "    allow_env: [HOME, NOTE]",
    )
    msgs = problems(text)
    assert any("postconditions[0].env.BASH_ENV" in m for m in msgs), msgs
    assert any("allow_env[0]: HOME is not set" in m for m in msgs), msgs
    assert any("allow_env[1]: 'NOTE' is not a refused environment name" in m for m in msgs)


def test_lint_warnings_are_located_not_refusals():
    text = TYPED.replace('env: {NOTE: "${note}"}', "").replace(
        "run: echo ${root}", 'run: bash -c "ls ${root}"; echo ${root}'
    )
    loaded = load_text(text, "rb.yaml")
    (w,) = loaded.warnings
    assert w.startswith("rb.yaml:16:10: steps[0].run: warning: ${root} is in code"), w


def test_text_cannot_name_a_host():
    text = TYPED.replace("    env: {NOTE", "    host: ${note}\n    env: {NOTE")
    (msg,) = problems(text)
    assert "steps[0].host: ${note} is text" in msg and "connection settings" in msg, msg


def test_every_shipped_runbook_loads_with_its_types():
    from runbook.loader import load_runbook
    from tests.support.paths import REPO

    paths = sorted(REPO.glob("runbooks/*.yaml")) + sorted(REPO.glob("tests/**/*.yaml"))
    assert len(paths) >= 8
    for path in paths:
        loaded = load_runbook(path)
        # text only where a value must hold template braces (the online stream's `{k}` per
        # rank), and then the loader lets it reach a command only through env
        text = {k for k in loaded.vars if loaded.types[k] == "text"}
        assert text <= {"stream"}, (path, text)
