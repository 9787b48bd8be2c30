"""A declared secret's value enters nothing but a step's `env` (runbook/loader.py moves it to
`secret_env`, which the agent hands the job over a pipe and never writes down).

Redaction at every write boundary would have to find every boundary (state.json's vars and
commands, `status`, the box's job spec, errors, the audit...). Instead a run is refused, before
anything is written, when a secret's value appears anywhere else in the loaded runbook: a
`--set` value, a variable's default, a command, a path, a host. The message names the place and
the secret, never the value. So the raw value never enters those structures at all."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from runbook.loader import LoadedRunbook, RunbookError


def _strings(obj: Any, where: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], str]]:
    if isinstance(obj, str):
        yield where, obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _strings(k, where)
            yield from _strings(v, (*where, str(k)))
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for i, v in enumerate(obj):
            yield from _strings(v, (*where, str(i)))


def raw_secret_problems(
    loaded: LoadedRunbook, secrets: Mapping[str, str], overrides: Mapping[str, str] = {}
) -> list[str]:
    """Every place outside `env: {VAR: ${SECRET}}` that holds a declared secret's value."""
    values = {name: v for name, v in secrets.items() if v}
    if not values:
        return []
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    places: list[tuple[tuple[str, ...], str]] = [(("vars", k), v) for k, v in loaded.vars.items()]
    places += list(_strings(loaded.runbook.model_dump(mode="json", exclude={"secrets"}), ()))
    for where, text in places:
        for name, value in values.items():
            if value not in text:
                continue
            head, rest = (where[0], list(where[1:])) if where else ("", [])
            if head == "vars" and rest and rest[0] in overrides:
                place = f"--set {rest[0]}"
            elif head == "vars" and rest:
                place = f"variable {rest[0]!r}"
            elif head == "steps" and rest:
                step = loaded.runbook.steps[int(rest[0])].id
                place = f"step {step!r} ({'.'.join(rest[1:]) or 'its fields'})"
            else:
                place = ".".join(where) or "the runbook"
            if (place, name) in seen:
                continue
            seen.add((place, name))
            problems.append(
                f"{place}: holds the value of secret {name!r}; a secret reaches a step only "
                f"through its env (env: {{VAR: ${{{name}}}}}), so that it is never written to "
                "the state, the audit, `status` or the box's job spec"
            )
    return problems


def refuse_raw_secrets(
    loaded: LoadedRunbook, secrets: Mapping[str, str], overrides: Mapping[str, str] = {}
) -> None:
    problems = raw_secret_problems(loaded, secrets, overrides)
    if problems:
        raise RunbookError(problems)
