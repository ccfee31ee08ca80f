"""Fixtures for the store tests."""

from __future__ import annotations

import pytest
from store_helpers import FakeClock

from spoolmq.store import partition as partition_module


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(partition_module, "now_ms", fake)
    return fake
