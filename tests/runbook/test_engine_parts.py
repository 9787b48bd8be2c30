"""The engine stays composed of parts (docs/ARCHITECTURE.md "The engine's parts", issue 29).

No mixins: `Engine` inherits nothing, and no class of runbook/engine/ extends another product
class (a part that needs another takes it at construction). No part writes into another's
attributes behind its back (`__dict__`), and no `TYPE_CHECKING` stubs tell the type checker
what parts give one another.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil

import runbook.engine
from runbook.engine import Engine
from tests.support.paths import REPO


def engine_modules() -> list:
    return [
        importlib.import_module(f"runbook.engine.{m.name}")
        for m in pkgutil.iter_modules(runbook.engine.__path__)
    ]


def test_engine_is_not_built_from_mixins():
    assert Engine.__mro__ == (Engine, object)


def test_no_engine_class_extends_a_product_class():
    for module in engine_modules():
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue  # imported, checked where it is defined
            bases = [b for b in cls.__mro__[1:] if b.__module__.split(".")[0] == "runbook"]
            assert not bases, f"{module.__name__}.{name} extends {bases}: compose, do not inherit"


def test_no_dict_writes_in_runbook_and_no_type_checking_stubs_in_the_engine():
    for path in sorted((REPO / "runbook").rglob("*.py")):
        in_engine = path.parent == REPO / "runbook" / "engine"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            assert not (isinstance(node, ast.Attribute) and node.attr == "__dict__"), where
            if in_engine:
                assert not (isinstance(node, ast.Name) and node.id == "TYPE_CHECKING"), where


def test_a_close_cancelled_in_its_head_push_still_closes_and_unlocks(tmp_path, monkeypatch):
    """A cancel landing in close()'s audit-head push (the cockpit's quit worker cut short) must
    still close the host sessions (no agent left running) and release the run's lock (the next
    driver opens the run)."""
    import asyncio

    from runbook.loader import load_runbook
    from runbook.transports.factory import make_transport_factory
    from tests.support.leaks import recording_agents, running

    rb = tmp_path / "rb.yaml"
    rb.write_text('name: closing\ndescription: d\nsteps:\n  - {id: a, title: A, run: "true"}\n')
    state = tmp_path / "state"
    agents = recording_agents(monkeypatch)

    async def main() -> None:
        engine = Engine(
            load_runbook(rb, state_dir=state), state, make_transport_factory(state), None
        )
        await engine.open("closing-run")
        stuck = asyncio.Event()

        async def push_never_ends(*_a, **_k) -> None:
            await stuck.wait()

        monkeypatch.setattr(engine, "_push_head", push_never_ends)
        closing = asyncio.ensure_future(engine.close())
        await asyncio.sleep(0.2)
        closing.cancel()
        await asyncio.gather(closing, return_exceptions=True)
        assert agents and not running(agents), "the close left the agent running"
        again = Engine(
            load_runbook(rb, state_dir=state), state, make_transport_factory(state), None
        )
        await again.open("closing-run")  # refused while the first still held the lock
        await again.close()

    asyncio.run(main())
