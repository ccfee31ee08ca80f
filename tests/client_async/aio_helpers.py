"""Helpers of the asyncio client tests, which run their coroutines with
``asyncio.run`` (no pytest plugin), against real broker processes (the ``broker`` fixture of
tests/conftest.py)."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spoolmq import Store


def stored_ids(data_dir: Path, topic: str) -> list[Any]:
    """The ``id`` of every stored message of ``topic``, read from the files."""
    ids: list[Any] = []
    with Store(data_dir) as store:
        if topic not in store.topics():
            return ids
        for partition in range(store.topic_config(topic).partitions):
            ids.extend(record.value["id"] for record in store.reader(topic, partition))
    return ids


def repeated(ids: list[Any]) -> list[Any]:
    return [value for value, count in collections.Counter(ids).items() if count > 1]


async def eventually(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Wait (without blocking the loop) until ``predicate()`` is truthy; TimeoutError
    naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)  # polling another process's progress: nothing to await
