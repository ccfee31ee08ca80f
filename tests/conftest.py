"""Shared fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import spoolmq.store.reader as reader_module
from spoolmq import Store
from spoolmq.testing import BrokerProcess

# The `figure` and `long_run` fixtures, and the figures section of the terminal summary.
pytest_plugins = ["figures_plugin"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long", action="store_true", default=False, help="run the long variants of slow tests"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="long variant: run with --long")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """spoolmq's cache (the Spark JVM's class archive) in a directory of this test session,
    shared by its analytics runs, never the user's ~/.cache."""
    os.environ["SPOOLMQ_CACHE"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "queue_data"


@pytest.fixture
def store(data_dir: Path) -> Iterator[Store]:
    with Store(data_dir) as opened:
        yield opened


@pytest.fixture
def verified_lines(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every record line the store's readers in this process verify (whose CRC is good),
    in order: a test sees which lines were read (and read again). A reader verifies a
    chunk's lines inline, parsing each through ``_parse_line``, and one line alone
    (``read_many``) through ``verified_fields``."""
    lines: list[bytes] = []
    verify = reader_module.verified_fields
    parse = reader_module._parse_line

    def counting(line: bytes) -> dict[str, Any] | None:
        lines.append(line)
        return verify(line)

    def counting_parse(line: bytes) -> Any:
        lines.append(line)
        return parse(line)

    monkeypatch.setattr(reader_module, "verified_fields", counting)
    monkeypatch.setattr(reader_module, "_parse_line", counting_parse)
    return lines


@pytest.fixture
def broker(data_dir: Path, tmp_path: Path) -> Iterator[BrokerProcess]:
    """A real `spoolmq broker` subprocess on `data_dir`, stopped (by pid) after the test."""
    process = BrokerProcess(data_dir, log_file=tmp_path / "broker.log")
    process.start()
    try:
        yield process
    finally:
        process.stop()
