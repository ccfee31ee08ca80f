"""The ``figure`` fixture: a test records the figure it measured ("acked lost: 0 of 20000").

The figures are printed in pytest's terminal summary (so they show in the `.ci/run` output)
and saved in the pytest cache (``.pytest_cache/v/spoolmq/figures``) with the variant that
produced them, for the table in README.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

_FIGURES: list[tuple[str, str]] = []


@pytest.fixture
def long_run(request: pytest.FixtureRequest) -> bool:
    """True under ``--long``: tests that scale with it run their long variant."""
    return bool(request.config.getoption("--long"))


@pytest.fixture
def figure(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Record one line of what the test measured, e.g. ``figure("acked lost: 0 of 200")``."""

    def record(line: str) -> None:
        _FIGURES.append((request.node.nodeid, line))

    return record


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    if not _FIGURES:
        return
    variant = "long" if config.getoption("--long") else "short"
    terminalreporter.section(f"figures ({variant} variants)")
    for nodeid, line in _FIGURES:
        terminalreporter.write_line(f"{nodeid}: {line}")
    if getattr(config, "cache", None) is not None:  # absent under -p no:cacheprovider
        assert config.cache is not None
        saved = config.cache.get("spoolmq/figures", {})
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for nodeid in {n for n, _ in _FIGURES}:
            lines = [line for n, line in _FIGURES if n == nodeid]
            saved[nodeid] = {"variant": variant, "at": stamp, "figures": lines}
        config.cache.set("spoolmq/figures", saved)
