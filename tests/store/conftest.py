"""Fixtures for the store tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from store_helpers import FakeClock

from spoolmq import Store
from spoolmq.store import partition as partition_module


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(partition_module, "now_ms", fake)
    return fake


@pytest.fixture
def small_store(data_dir: Path) -> Iterator[Store]:
    """A store whose index has an entry every 64 bytes, for seeking tests."""
    with Store(data_dir, config={"index_interval_bytes": 64}) as opened:
        yield opened
