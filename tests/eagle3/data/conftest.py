"""Fixtures for the data-command tests (helpers live in eagle3_data_helpers.py: a module named
`conftest` is not importable reliably when several test directories have one)."""

from __future__ import annotations

import pytest
from eagle3_data_helpers import run_cli


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def tok(tiny_target):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_target))


@pytest.fixture(scope="session")
def kimi_tok(tmp_path_factory):
    from kimi_fixture import build_kimi_tokenizer

    return build_kimi_tokenizer(tmp_path_factory.mktemp("kimi-tokenizer"))
