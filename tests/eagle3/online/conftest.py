"""Fixtures for the online-training tests: the attack tally, a dataset and its offline dump
(the HF reference extractor, one sample per forward) once per module."""

from __future__ import annotations

import pytest

from tests.faults.tally import TALLY, Tally, write_if_asked


@pytest.fixture
def tally() -> Tally:
    """The fault suite's attack tally (tests/faults/tally.py): these trials count there too."""
    return TALLY


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001
    table = TALLY.table()
    faults = any(  # tests/faults/conftest.py prints the same table when it is loaded too
        getattr(p, "__name__", "").endswith("faults.conftest")
        for p in config.pluginmanager.get_plugins()
    )
    if table and not faults:
        terminalreporter.section("attack tally (class, trials, promise held)")
        terminalreporter.write_line(table)
        write_if_asked()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models run fastest (and steadiest on a shared 2-core box) on one thread."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def inputs(tiny_target, tmp_path_factory) -> dict:
    """A 16-sample dataset and its offline reference dump."""
    from remote_agent.eagle3.online import compare

    root = tmp_path_factory.mktemp("online-inputs")
    lengths = [12 + (i * 11) % 40 for i in range(16)]
    data = compare.write_dataset(root / "data.jsonl", lengths, vocab=2048, seed=1)
    compare.offline_dump(tiny_target, data, root / "dump")
    return {"target": tiny_target, "data": data, "dump": root / "dump", "root": root}
