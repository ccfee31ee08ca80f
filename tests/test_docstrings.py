"""The examples in docstrings (``>>>``) are run, so the documentation cannot drift from the
code."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import spoolmq

# `spoolmq.__main__` runs the CLI when imported; it has no examples.
MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(spoolmq.__path__, "spoolmq.")
    if info.name != "spoolmq.__main__"
)


def test_every_module_is_found() -> None:
    assert {"spoolmq.store.retention", "spoolmq.broker.manager", "spoolmq.protocol"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"
