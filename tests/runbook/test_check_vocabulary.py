"""The check vocabulary has one definition (remote_agent/wire/check_vocabulary.py): the runbook
schema's check models, the loader's error message and the agent's probes all follow it."""

from __future__ import annotations

import typing

import pytest

from remote_agent.agent.probes import CHECKS, run_probe
from remote_agent.wire import check_vocabulary as vocab
from runbook import schema
from runbook.engine.targets import DeleteTarget
from runbook.loader import RunbookError, load_text


def _schema_check_names() -> list[str]:
    union = typing.get_args(schema.Check)[0]  # Annotated[Union[...], Field(discriminator)]
    names = []
    for model in typing.get_args(union):
        (literal,) = typing.get_args(model.model_fields["check"].annotation)
        names.append(literal)
    return names


def test_the_schema_models_are_the_runbook_checks() -> None:
    assert schema.CHECK_TYPES is vocab.RUNBOOK_CHECKS
    names = _schema_check_names()
    assert sorted(names) == sorted(vocab.RUNBOOK_CHECKS) and len(names) == len(set(names))


def test_the_agent_probes_exactly_the_box_checks() -> None:
    assert sorted(CHECKS) == sorted(vocab.BOX_CHECKS)
    assert set(vocab.ENGINE_CHECKS) <= set(vocab.RUNBOOK_CHECKS)
    assert not set(vocab.ENGINE_CHECKS) & set(CHECKS)  # the engine answers these itself
    assert not set(vocab.DERIVED_CHECKS) & set(vocab.RUNBOOK_CHECKS)


def test_the_engine_derived_guard_is_a_box_check() -> None:
    assert DeleteTarget("/x", None, set()).check in vocab.DERIVED_CHECKS


@pytest.mark.parametrize("name", [c for c in vocab.RUNBOOK_CHECKS if c not in vocab.ENGINE_CHECKS])
def test_every_runbook_box_check_reaches_a_probe(name: str) -> None:
    """Not "unknown check": the agent has a function for it (its answer for a bare dict is a
    field error or a verdict, whichever the check gives)."""
    answer = run_probe({"check": name})
    assert "unknown check" not in (answer.get("message") or "")


def test_the_loader_names_every_runbook_check() -> None:
    text = "name: t\nsteps:\n  - id: a\n    title: A\n    run: 'true'\n    preconditions:\n      - check: nope\n"
    with pytest.raises(RunbookError) as err:
        load_text(text, "rb.yaml")
    (msg,) = err.value.problems
    assert "unknown check type 'nope'" in msg
    assert msg.endswith(", ".join(vocab.RUNBOOK_CHECKS))
