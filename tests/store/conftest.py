"""Fixtures for the store tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from store_helpers import START_MS

from spoolmq import Store
from spoolmq.clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    """The time the store tests run at; it moves only when a test moves it."""
    return ManualClock(START_MS)


@pytest.fixture
def store(data_dir: Path, clock: ManualClock) -> Iterator[Store]:
    """A store on the manual ``clock`` (record timestamps, segment age, retention)."""
    with Store(data_dir, clock=clock) as opened:
        yield opened
