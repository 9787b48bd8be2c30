"""Load a runbook: YAML with positions -> interpolation -> schema -> cross-step checks.

Every problem is a RunbookError whose message reads `file:line:col: where: what to fix`.
"""

from __future__ import annotations

import graphlib
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any, get_args

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from runbook import env_names, fanout_expand, value_types
from runbook.delete_lint import shell_deletion
from runbook.interpolate import (
    VALUE_ENV_PREFIX,
    InterpolationError,
    ShellText,
    as_text,
    placeholders,
    resolve_vars,
    substitute,
    substitute_shell,
)
from runbook.schema import CHECK_TYPES, Runbook, Step, StepSucceeded, VarDecl
from runbook.shell_code import argv_lint, lint
from runbook.yaml_source import Pos, SourceDoc, YamlError, load_yaml

BUILTIN_VARS = ("run_id", "runbook_dir", "state_dir", *fanout_expand.HOST_VARS)
_CHECK_LISTS = ("preconditions", "postconditions", "skip_if")


class RunbookError(Exception):
    """A runbook that cannot be used, with every problem found (each located)."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class LoadedRunbook:
    runbook: Runbook
    path: Path
    sha256: str  # of the file's bytes: recorded in the audit
    vars: dict[str, str]  # resolved, secrets never included
    source: SourceDoc
    types: dict[str, str] = dataclass_field(default_factory=dict)  # var -> its type's name
    # located lint findings (runbook/shell_code.py): a value where a program may run it
    warnings: list[str] = dataclass_field(default_factory=list)

    def where(self, *path: str | int) -> str:
        pos = self.source.where(tuple(path))
        return f"{self.path}:{pos.line}:{pos.col}"


def _loc(path: tuple[str | int, ...]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


class _Problems:
    def __init__(self, doc: SourceDoc) -> None:
        self.doc, self.items, self.warnings = doc, [], []
        self.types: dict[str, str] = {}  # the type of every value a placeholder may name

    def _at(self, path: tuple[str | int, ...], message: str, key: bool) -> str:
        pos: Pos = self.doc.where(path, key=key)
        return f"{self.doc.file}:{pos.line}:{pos.col}: {_loc(path)}: {message}"

    def add(self, path: tuple[str | int, ...], message: str, key: bool = False) -> None:
        self.items.append(self._at(path, message, key))

    def warn(self, path: tuple[str | int, ...], message: str) -> None:
        line = self._at(path, "warning: " + message, False)
        if line not in self.warnings:  # a fan-out step is interpolated once per host
            self.warnings.append(line)


def parse_overrides(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise RunbookError([f"--set {pair!r}: write --set name=value"])
        out[name.strip()] = value
    return out


def _is_shell_context(path: tuple[str | int, ...]) -> bool:
    """`run:` strings of steps and of command checks are shell; everything else is plain text."""
    return bool(path) and path[-1] == "run"


def _context(path: tuple[str | int, ...]) -> str | None:
    """Where a string at `path` goes: "a shell `run:` string", "a `run:` argv list", "a host's
    connection settings" (ssh's argv and the box's shell), or None (data the product reads)."""
    if _is_shell_context(path):
        return "a shell `run:` string"
    if len(path) >= 2 and path[-2] == "run" and isinstance(path[-1], int):
        return "a `run:` argv list"
    if path[:1] == ("hosts",) and "vars" not in path or path[-1:] == ("host",):
        return "a host's connection settings"  # an ssh target, the box's python and spool
    return None


def _splice_refusal(name: str, types: Mapping[str, str], context: str) -> str | None:
    kind = types.get(name, "text")
    if value_types.TYPES[kind].splice_safe:
        return None
    return (
        f"${{{name}}} is {kind} (any characters), which may not be spliced into {context}: a "
        "shell or the program could read it as code; pass it through the step's env instead "
        f'(env: {{X: "${{{name}}}"}}, then "$X" in the command, os.environ[\'X\'], ...) or '
        "declare a type that cannot hold code (path, name, integer, ...: docs/RUNBOOKS.md)"
    )


def _interpolate_tree(
    data: Any,
    path: tuple[str | int, ...],
    values: Mapping[str, str],
    secrets: Mapping[str, Any],
    problems: _Problems,
) -> Any:
    if isinstance(data, dict):
        out = {
            k: _interpolate_tree(v, path + (k,), values, secrets, problems) for k, v in data.items()
        }
        _pass_values_by_env(data, out, path, problems)
        return out
    if isinstance(data, list):
        out_list = [
            _interpolate_tree(v, path + (i,), values, secrets, problems) for i, v in enumerate(data)
        ]
        if _is_shell_context(path):  # an argv `run:`: no shell, but it may start one
            _lint_argv(data, out_list, path, problems)
        return out_list
    if not isinstance(data, str):
        return data
    shell = _is_shell_context(path)
    context = _context(path)

    def lookup(name: str) -> str:
        if name in secrets:
            raise InterpolationError(
                f"secret {name!r} can only be passed to a step through env (env: {{VAR: ${{{name}}}}}), "
                "never in a command line or other field"
            )
        if name not in values:
            hint = " (for a shell variable write $NAME or $${NAME})" if shell else ""
            known = ", ".join(sorted(values)) or "none"
            raise InterpolationError(f"undefined variable {name!r}{hint}; defined: {known}")
        why = _splice_refusal(name, problems.types, context) if context else None
        if why is not None:
            raise InterpolationError(why)
        return values[name]

    try:
        if shell:
            # shown text in `run`; what executes (values by reference) rides along, see below
            text = substitute_shell(data, lookup)
            for message in lint(data):
                problems.warn(path, message)
            return _ShellRun(text.shown, text) if text.env else text.shown
        return substitute(data, lookup)
    except InterpolationError as exc:
        problems.add(path, str(exc.args[0]))
        return data


def _lint_argv(raw: list, out: list, path: tuple[str | int, ...], problems: _Problems) -> None:
    """`run: [bash, -c, "... ${x}"]`: a (word-typed) value where a program may run it: warned."""
    if not all(isinstance(a, str) for a in out):
        return
    named = []
    for k, a in enumerate(raw):
        try:
            named += [(k, n) for n in placeholders(a)] if isinstance(a, str) else []
        except InterpolationError:
            continue  # reported by the interpolation pass
    for k, message in argv_lint(out, named) if named else []:
        problems.warn(path + (k,), message)


class _ShellRun(str):
    """A `run:` string as shown, carrying the form that executes and its values' env."""

    text: ShellText

    def __new__(cls, shown: str, text: ShellText) -> _ShellRun:
        obj = super().__new__(cls, shown)
        obj.text = text
        return obj


def _pass_values_by_env(
    raw: dict, out: dict, path: tuple[str | int, ...], problems: _Problems
) -> None:
    """A `run:` whose values go by reference: `run_exec` executes, `run_env` carries them."""
    for key in ("run_exec", "run_env"):
        if key in raw:
            problems.add(path + (key,), "unknown field (eagle-tui fills it in)", key=True)
    run = out.get("run")
    if not isinstance(run, _ShellRun):
        return
    env = out.get("env")
    clash = (
        sorted(k for k in env if str(k).startswith(VALUE_ENV_PREFIX))
        if isinstance(env, dict)
        else []
    )
    if clash:
        problems.add(
            path + ("env", clash[0]),
            f"env names starting with {VALUE_ENV_PREFIX} are eagle-tui's (runbook values)",
            key=True,
        )
        return
    out["run"] = str(run)
    out["run_exec"] = run.text.run
    out["run_env"] = run.text.env


def _split_secret_env(
    step: dict, index: int, secrets: Mapping[str, Any], problems: _Problems
) -> None:
    """`env: {X: ${SECRET}}` moves to secret_env; a secret mixed into a longer value is refused."""
    env = step.get("env")
    if not isinstance(env, dict):
        return
    secret_env = {}
    for var, value in list(env.items()):
        if not isinstance(value, str):
            continue
        try:
            names = placeholders(value)
        except InterpolationError:
            continue  # reported by the interpolation pass
        used = [n for n in names if n in secrets]
        if not used:
            continue
        if value != f"${{{used[0]}}}" or len(names) != 1:
            problems.add(
                ("steps", index, "env", var),
                f"a secret must be the whole value: write {var}: ${{{used[0]}}}",
            )
            continue
        secret_env[var] = used[0]
        del env[var]
    if secret_env:
        step["secret_env"] = secret_env


def _allowed_keys(body: Any, path: tuple[str | int, ...]) -> list[str]:
    """The keys the schema accepts in the mapping that holds `path`'s last key."""
    from runbook import schema

    parent = path[:-1]
    model: Any = None
    if len(parent) == 0:
        model = schema.Runbook
    elif parent[0] == "steps" and len(parent) == 2:
        model = schema.Step
    elif parent[0] == "steps" and len(parent) == 3 and parent[2] == "retry":
        model = schema.Retry
    elif parent[0] == "steps" and len(parent) == 4 and parent[2] in _CHECK_LISTS:
        node = body
        for p in parent:
            node = node[p]
        kind = node.get("check") if isinstance(node, dict) else None
        for m in get_args(get_args(schema.Check)[0]):  # Annotated[Union[...], discriminator]
            if get_args(m.model_fields["check"].annotation)[0] == kind:
                model = m
    if model is None:
        return []
    hidden = ("secret_env", "run_exec", "run_env", *fanout_expand.INTERNAL_FIELDS)
    return [k for k in model.model_fields if k not in hidden]


def _friendly(
    err: ErrorDetails,
    body: Any = None,
    path: tuple[str | int, ...] = (),
    allowed: list[str] | None = None,
) -> str:
    """`allowed`: the keys of the mapping that holds the unknown key, where `path` is not a path
    in the runbook's body (a variable's declaration)."""
    kind, msg = err["type"], err["msg"]
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        import difflib

        if allowed is None:
            allowed = _allowed_keys(body, path)
        key = path[-1] if path else err["loc"][-1] if err["loc"] else "?"
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        if key == "secret" and "secret" not in allowed:
            hint = "; a secret is declared in the runbook's `secrets:` (name: {env: ENV_VAR})"
        listing = f" (allowed here: {', '.join(allowed)})" if allowed else ""
        return f"unknown key {key!r}{hint}{listing}"
    if kind == "missing":
        return "required key is missing"
    if kind == "union_tag_invalid":
        return f"unknown check type {ctx.get('tag')!r}; use one of: {', '.join(CHECK_TYPES)}"
    if kind == "union_tag_not_found":
        return f"each check needs a `check:` key naming its type ({', '.join(CHECK_TYPES)})"
    if kind == "string_pattern_mismatch":
        return f"invalid value (must match {ctx.get('pattern')})"
    if msg.startswith("Value error, "):
        return msg[len("Value error, ") :]
    return msg[0].lower() + msg[1:] if msg else kind


def _data_path(data: Any, loc: Sequence[Any]) -> tuple[tuple[str | int, ...], bool]:
    """Map a pydantic error location onto the data tree, skipping union tags; (path, key-missing)."""
    path: list[str | int] = []
    node = data
    for i, item in enumerate(loc):
        if (
            isinstance(node, dict)
            and item in node
            or isinstance(node, list)
            and isinstance(item, int)
            and 0 <= item < len(node)
        ):
            path.append(item)
            node = node[item]
        elif isinstance(node, dict) and isinstance(item, str) and i == len(loc) - 1:
            path.append(item)  # a missing or unknown key: point at its parent mapping
            return tuple(path), True
    return tuple(path), False


def load_text(
    text: str,
    file: str,
    overrides: Mapping[str, str] | None = None,
    run_id: str = "RUN_ID",
    state_dir: str = "STATE_DIR",
) -> LoadedRunbook:
    try:
        doc = load_yaml(text, file)
    except YamlError as exc:
        raise RunbookError([str(exc)]) from None
    problems = _Problems(doc)
    data = doc.data
    if not isinstance(data, dict):
        problems.add((), "a runbook is a mapping with at least `name` and `steps`")
        raise RunbookError(problems.items)

    raw_vars = data.get("vars") or {}
    raw_secrets = data.get("secrets") or {}
    if not isinstance(raw_vars, dict):
        problems.add(("vars",), "vars must be a mapping of name: value")
        raw_vars = {}
    if not isinstance(raw_secrets, dict):
        problems.add(("secrets",), "secrets must be a mapping of name: {env: ENV_VAR}")
        raw_secrets = {}
    decls = _declarations(raw_vars, raw_secrets, problems)
    merged = {k: d.value for k, d in decls.items()}
    # --set values are literal: never interpolated, so `${` in a value stays text
    literal = {
        "run_id": run_id,
        "runbook_dir": str(Path(file).resolve().parent),
        "state_dir": state_dir,
    }
    builtins = dict(literal)
    for name, value in (overrides or {}).items():
        if name not in raw_vars:
            known = ", ".join(sorted(raw_vars)) or "none"
            problems.items.append(f"--set {name}: no such variable in {file} (declared: {known})")
        else:
            merged[name] = literal[name] = value
    values: dict[str, str] = {}
    try:
        values = resolve_vars({k: v for k, v in merged.items() if k not in literal}, literal)
        defaults = resolve_vars({k: d.value for k, d in decls.items()}, builtins)
    except InterpolationError as exc:
        message, *about = exc.args  # (message, variable name) or (message,)
        var = about[0] if about else None
        where = ("vars", var) if isinstance(var, str) and var in raw_vars else ("vars",)
        problems.add(where, str(message))
    else:
        problems.types = _check_types(decls, defaults, values, overrides or {}, problems)
        problems.types |= _host_var_types(data.get("hosts"), problems.types, problems)

    body = {k: v for k, v in data.items() if k not in ("vars", "secrets")}
    steps = body.get("steps")
    if isinstance(steps, list):
        _check_env(steps, problems.types, problems)
        for i, step in enumerate(steps):
            if isinstance(step, dict):
                _split_secret_env(step, i, raw_secrets, problems)
    fan_raw = fanout_expand.raw_fanouts(steps) if isinstance(steps, list) else {}
    if not problems.items:
        body = _interpolate_tree(
            {k: v for k, v in body.items() if k != "steps"}, (), values, raw_secrets, problems
        ) | {"steps": steps}
        if isinstance(steps, list):
            body["steps"] = [
                _interpolate_step(s, i, values, raw_secrets, problems, i in fan_raw, body)
                for i, s in enumerate(steps)
            ]
    if problems.items:
        raise RunbookError(problems.items)

    body["vars"] = merged
    body["secrets"] = raw_secrets
    try:
        runbook = Runbook.model_validate(body)
    except ValidationError as exc:
        for err in exc.errors():
            path, _ = _data_path(body, err["loc"])
            problems.add(path, _friendly(err, body, path), key=err["type"] == "extra_forbidden")
        raise RunbookError(problems.items) from None

    _cross_checks(runbook, problems)
    if problems.items:
        raise RunbookError(problems.items)
    if fan_raw:
        runbook = _expand_fanouts(runbook, fan_raw, values, raw_secrets, problems, body)
        if problems.items:
            raise RunbookError(problems.items)
    return LoadedRunbook(
        runbook=runbook,
        path=Path(file),
        sha256=hashlib.sha256(text.encode()).hexdigest(),
        vars={k: v for k, v in values.items() if k in raw_vars},  # builtins and secrets excluded
        source=doc,
        types=dict(problems.types),
        warnings=list(problems.warnings),
    )


def _declarations(
    raw_vars: dict, raw_secrets: dict, problems: _Problems
) -> dict[str, VarDecl | _Plain]:
    """Each variable's declared form (`{type: ..., value: ...}`) or its plain default."""
    out: dict[str, VarDecl | _Plain] = {}
    for name, value in raw_vars.items():
        if name in BUILTIN_VARS:
            problems.add(
                ("vars", name), f"{name!r} is a built-in variable; choose another name", key=True
            )
        elif name in raw_secrets:
            problems.add(("vars", name), f"{name!r} is both a variable and a secret", key=True)
        elif isinstance(value, dict):
            try:
                out[name] = VarDecl.model_validate(value)
            except ValidationError as exc:
                for err in exc.errors():
                    sub, _ = _data_path(value, err["loc"])
                    path = ("vars", name, *sub)
                    text = _friendly(err, value, sub, allowed=list(VarDecl.model_fields))
                    problems.add(path, text, key=err["type"] == "extra_forbidden")
        elif not isinstance(value, (str, int, float, bool)):
            problems.add(
                ("vars", name),
                "a variable's value must be a string, number or boolean, or "
                "{type: TYPE, value: VALUE} (types: " + ", ".join(value_types.TYPE_NAMES) + ")",
            )
        else:
            out[name] = _Plain(value)
    return out


@dataclass(frozen=True)
class _Plain:
    """A variable written `name: value`: its type is inferred from the (resolved) default."""

    value: str | int | float | bool
    type: None = None
    choices: None = None


def _check_types(
    decls: Mapping[str, VarDecl | _Plain],
    defaults: Mapping[str, str],
    values: Mapping[str, str],
    overrides: Mapping[str, str],
    problems: _Problems,
) -> dict[str, str]:
    """Every value's type (declared, or inferred from the default), each value checked against
    it: a `--set` one as a one-line `--set` error, the others located in the runbook."""
    types = {k: value_types.infer(v) for k, v in defaults.items() if k not in decls}
    refused_set = False
    for name, d in sorted(decls.items(), key=lambda kv: kv[0] not in overrides):
        inferred = d.type is None
        kind = d.type or value_types.infer(_typed_default(d.value, defaults[name]))
        types[name] = kind
        why = value_types.refusal(kind, values[name], d.choices)
        if why is None:
            continue
        how = f"inferred from its default {defaults[name]!r}" if inferred else "declared"
        if name in overrides:
            refused_set = True
            instead = (
                f"give {_a(kind)} (e.g. {value_types.TYPES[kind].example})"
                if kind != "enum"
                else "give one of the choices"
            )
            problems.items.append(
                f"--set {name}={overrides[name]!r}: {name} is {_a(kind)} ({how}) and {why}; "
                f"{instead}, or, for text with such characters, the runbook must declare "
                f"`{name}: {{type: text, value: ...}}` and pass it through a step's env"
            )
        elif not (refused_set and values[name] != defaults[name]):  # not just a --set's echo
            src = "" if values[name] == defaults[name] else f" (its value {values[name]!r})"
            problems.add(("vars", name), f"{name} is {_a(kind)} ({how}){src} and {why}")
    return types


def _a(kind: str) -> str:
    """`a path`, `an integer`: the type named with its article."""
    return f"{'an' if kind in ('integer', 'enum') else 'a'} {kind}"


def _typed_default(raw: object, resolved: str) -> object:
    """The default as YAML typed it (8 is an integer, "8" a path) unless it references others."""
    return raw if not isinstance(raw, str) else resolved


def _host_var_types(hosts: Any, types: Mapping[str, str], problems: _Problems) -> dict[str, str]:
    """The type of each host variable (a runbook variable's type where it shares the name,
    else inferred; text if any host's value is text), each host's value checked; and the
    fan-out's own variables."""
    out = {"host": "name", "host_rank": "integer", "host_count": "integer"}
    for host, config in hosts.items() if isinstance(hosts, dict) else ():
        own = config.get("vars") if isinstance(config, dict) else None
        for name, value in own.items() if isinstance(own, dict) else ():
            if not isinstance(value, (str, int, float, bool)):
                continue  # the schema reports it
            text = as_text(value)
            kind = types.get(name) or value_types.infer(value)
            why = value_types.refusal(kind, text)
            if why is not None:
                problems.add(("hosts", host, "vars", name), f"{name} is {_a(kind)} and {why}")
            elif out.get(name) != "text":
                out[name] = kind
    return out


def _check_env(steps: list, types: Mapping[str, str], problems: _Problems) -> None:
    """Names a program reads as code (runbook/env_names.py) only where the step lists them in
    `allow_env:`, and never from a text value; in the step's env and its command checks' env."""
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            continue
        allowed = step.get("allow_env") or []
        allowed = allowed if isinstance(allowed, list) else []
        places: list[tuple[tuple[str | int, ...], Any]] = [(("steps", i, "env"), step.get("env"))]
        for field in _CHECK_LISTS:
            checks = step.get(field)
            checks = [checks] if isinstance(checks, dict) else checks
            for j, check in enumerate(checks if isinstance(checks, list) else []):
                if isinstance(check, dict):
                    places.append(((("steps", i, field, j, "env")), check.get("env")))
        service = step.get("service")
        ready = service.get("ready") if isinstance(service, dict) else None
        if isinstance(ready, dict):
            places.append((("steps", i, "service", "ready", "env"), ready.get("env")))
        used = set()
        for path, env in places:
            for name, value in env.items() if isinstance(env, dict) else ():
                if not isinstance(name, str) or not env_names.dangerous(name):
                    continue
                used.add(name)
                if name not in allowed:
                    problems.add(path + (name,), env_names.why(name), key=True)
                    continue
                try:
                    named = placeholders(value) if isinstance(value, str) else []
                except InterpolationError:
                    continue  # reported by the interpolation pass
                for var in named:
                    if types.get(var, "text") == "text":  # a secret is text
                        problems.add(
                            path + (name,),
                            f"{name} is read as code or as where to load code from, and "
                            f"${{{var}}} is text: give it a type that holds no code (path, ...)",
                        )
        for j, name in enumerate(allowed):
            if not isinstance(name, str) or not env_names.dangerous(name):
                problems.add(
                    ("steps", i, "allow_env", j),
                    f"{name!r} is not a refused environment name; remove it from `allow_env:`",
                )
            elif name not in used:
                problems.add(("steps", i, "allow_env", j), f"{name} is not set in this step's env")


def _interpolate_step(
    step: Any,
    index: int,
    values: Mapping[str, str],
    secrets: Mapping[str, Any],
    problems: _Problems,
    fanout: bool,
    body: dict[str, Any],
) -> Any:
    """A step's fields; a fan-out step is checked as its first host's child would be (the
    children are interpolated per host after validation) and its `hosts:` resolved first."""
    path: tuple[str | int, ...] = ("steps", index)
    if not isinstance(step, dict):
        return _interpolate_tree(step, path, values, secrets, problems)
    for name in fanout_expand.INTERNAL_FIELDS:
        if name in step:
            problems.add(path + (name,), f"{name!r} is set by the loader; remove it", key=True)
    if not fanout:
        return _interpolate_tree(step, path, values, secrets, problems)
    hosts = fanout_expand.parse_hosts(
        _interpolate_tree(step["hosts"], path + ("hosts",), values, secrets, problems)
    )
    if hosts is None:
        problems.add(path + ("hosts",), "`hosts:` is a list of host names (or one string of them)")
        return step
    if not hosts:
        problems.add(path + ("hosts",), "`hosts:` needs at least one host")
        return step
    first = {**values, **fanout_expand.host_values(hosts[0], 0, len(hosts), body.get("hosts"))}
    out = _interpolate_tree(
        {k: v for k, v in step.items() if k != "hosts"}, path, first, secrets, problems
    )
    return {**out, "hosts": hosts}


def _expand_fanouts(
    rb: Runbook,
    raw: dict[int, Any],
    values: Mapping[str, str],
    secrets: Mapping[str, Any],
    problems: _Problems,
    body: dict[str, Any],
) -> Runbook:
    from runbook.schema import Step

    def interpolate(data: Any, path: tuple[str | int, ...], extra: dict[str, str]) -> Any:
        data.pop("hosts", None)
        return _interpolate_tree(data, path, {**values, **extra}, secrets, problems)

    def validate(data: Any, path: tuple[str | int, ...]) -> Step | None:
        try:
            return Step.model_validate(data)
        except ValidationError as exc:
            for err in exc.errors():
                sub, _ = _data_path(data, err["loc"])
                problems.add(path + sub, _friendly(err, body, path + sub))
            return None

    return fanout_expand.expand(
        rb, raw, interpolate, validate, lambda p, m: problems.add(p, m), body.get("hosts")
    )


def _cross_checks(rb: Runbook, problems: _Problems) -> None:
    ids: dict[str, int] = {}
    for i, step in enumerate(rb.steps):
        if step.id in ids:
            problems.add(
                ("steps", i, "id"),
                f"duplicate step id {step.id!r} (first at steps[{ids[step.id]}])",
            )
        else:
            ids[step.id] = i
    for i, step in enumerate(rb.steps):
        for j, req in enumerate(step.requires):
            if req not in ids:
                problems.add(("steps", i, "requires", j), _unknown_step(req, ids))
            elif req == step.id:
                problems.add(("steps", i, "requires", j), "a step cannot require itself")
            elif ids[req] > i:  # plan.ordered_steps runs it first: say so, the file reads otherwise
                problems.warn(
                    ("steps", i, "requires", j),
                    f"{req!r} comes later in the file but runs before {step.id!r}, which "
                    f"requires it (steps run in file order, each after what it requires); "
                    f"move {req!r} above {step.id!r} so the file reads as it runs",
                )
        for field in _CHECK_LISTS:
            for j, check in enumerate(getattr(step, field)):
                if isinstance(check, StepSucceeded) and check.step not in ids:
                    problems.add(("steps", i, field, j, "step"), _unknown_step(check.step, ids))
    for i, step in enumerate(rb.steps):
        _refuse_shell_deletes(step, i, problems)
    for i, step in enumerate(rb.steps):
        if step.stop is not None:
            target = rb.steps[ids[step.stop]] if step.stop in ids else None
            if target is None:
                problems.add(("steps", i, "stop"), _unknown_step(step.stop, ids))
            elif target.service is None:
                problems.add(
                    ("steps", i, "stop"),
                    f"step {step.stop!r} is not a service (it has no `service:`)",
                )
        for j, used in enumerate(step.uses):
            target = rb.steps[ids[used]] if used in ids else None
            if target is None or target.service is None:
                what = "unknown step" if target is None else "not a service step"
                problems.add(("steps", i, "uses", j), f"{what} {used!r} (`uses:` names services)")
            elif used not in _upstream(rb, step.id):
                problems.add(
                    ("steps", i, "uses", j),
                    f"{used!r} must be among the steps this one requires (directly or not)",
                )
        if step.service is not None and isinstance(step.service.ready, StepSucceeded):
            problems.add(
                ("steps", i, "service", "ready"),
                "a service's readiness must be observed on the box "
                "(e.g. http_ok), not step_succeeded",
            )
    for j, sid in enumerate(rb.auto_confirm):
        if sid not in ids:
            problems.add(("auto_confirm", j), _unknown_step(sid, ids))
        elif not rb.steps[ids[sid]].destructive:
            problems.add(
                ("auto_confirm", j),
                f"step {sid!r} is not destructive; auto_confirm lists destructive steps only",
            )
    cycle = _find_cycle(rb)
    if cycle:
        i = ids[cycle[0]]
        problems.add(("steps", i, "requires"), "requires form a cycle: " + " -> ".join(cycle))


def _unknown_step(name: str, ids: Mapping[str, int]) -> str:
    """`unknown step 'trian'; did you mean 'train'?` (the ids are the runbook's steps)."""
    import difflib

    close = difflib.get_close_matches(name, list(ids), n=1)
    return f"unknown step {name!r}" + (f"; did you mean {close[0]!r}?" if close else "")


def _refuse_shell_deletes(step: Step, i: int, problems: _Problems) -> None:
    """A command that deletes a path is refused wherever it runs (runbook/delete_lint.py)."""
    if step.run is not None and (why := shell_deletion(step.run)):
        problems.add(("steps", i, "run"), why)
    for field in _CHECK_LISTS:
        for j, check in enumerate(getattr(step, field)):
            run = getattr(check, "run", None)
            if getattr(check, "check", None) == "command" and run and (why := shell_deletion(run)):
                problems.add(("steps", i, field, j, "run"), f"a guard must not delete: {why}")


def _find_cycle(rb: Runbook) -> list[str] | None:
    """One cycle of `requires`, in requires order (a -> b: a requires b), or None."""
    graph = {s.id: [r for r in s.requires if r != s.id] for s in rb.steps}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(reversed(exc.args[1]))  # graphlib lists it in "required by" order
    return None


def load_runbook(
    path: Path | str,
    overrides: Mapping[str, str] | None = None,
    run_id: str = "RUN_ID",
    state_dir: Path | str = "STATE_DIR",
) -> LoadedRunbook:
    path = Path(path)
    return load_text(read_runbook_text(path), str(path), overrides, run_id, str(state_dir))


def read_runbook_text(path: Path | str) -> str:
    """The runbook file's text; RunbookError when it cannot be read or is not UTF-8."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RunbookError([f"{path}: cannot read runbook: {exc.strerror or exc}"]) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunbookError([f"{path}:1:1: not UTF-8 text ({exc.reason})"]) from None


def read_secrets(rb: Runbook, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Secret values from the local environment; a missing required one is an error."""
    environ = os.environ if environ is None else environ
    values, missing = {}, []
    for name, ref in rb.secrets.items():
        if ref.env in environ:
            values[name] = environ[ref.env]
        elif ref.required:
            missing.append(f"secret {name!r}: set the environment variable {ref.env}")
    if missing:
        raise RunbookError(missing)
    return values


def _upstream(rb: Runbook, step_id: str) -> set[str]:
    """Every step `step_id` requires, directly or through others (safe on cycles)."""
    by_id = {s.id: s for s in rb.steps}
    seen: set[str] = set()
    todo = list(by_id[step_id].requires)
    while todo:
        sid = todo.pop()
        if sid not in seen and sid in by_id:
            seen.add(sid)
            todo.extend(by_id[sid].requires)
    return seen
