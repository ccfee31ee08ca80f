"""The tasks the tests/tasks suite runs in real ``spoolmq worker`` processes.

Its ``Tasks`` is built from the environment each process inherits: ``SPOOLMQ_DATA`` (the
data directory), ``TASKS_LEASE`` (the workers' lease, seconds) and ``TASKS_MARKS`` (a
directory where a task appends a line per run, so a test can count runs across processes).
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from pathlib import Path

from spoolmq import Tasks

tasks = Tasks(lease=float(os.environ.get("TASKS_LEASE", "30")))


def mark(name: str) -> None:
    """One line (this process's pid) per run in ``$TASKS_MARKS/<name>``."""
    with open(Path(os.environ["TASKS_MARKS"]) / name, "a") as marks:
        marks.write(f"{os.getpid()}\n")


@tasks.task(topic="t.math")
def add(a: int, b: int) -> int:
    return a + b


_NOT_GIVEN = object()  # a default JSON cannot carry


@tasks.task(topic="t.math")
def scaled(
    n: int, factor: int = 2, extra: object = _NOT_GIVEN, table: object = {1: "a", "big": 2**70}
) -> int:
    return n * factor


@tasks.task(topic="t.math")
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    return a + b


@tasks.task(topic="t.math", max_deliveries=2, retry_backoff=0.1)
def boom(text: str) -> None:
    raise ValueError(text)


@tasks.task(topic="t.math", result_ttl=1)
def short_lived() -> str:
    return "soon gone"


@tasks.task(topic="t.math")
def worker_pid() -> int:
    return os.getpid()


@tasks.task(topic="t.math", retry_backoff=0.1)
def not_json() -> object:
    mark("not_json")
    return {1, 2}


@tasks.task(topic="t.slow")
def slow(name: str, seconds: float) -> int:
    mark(name)
    time.sleep(seconds)
    return os.getpid()


@tasks.task(topic="t.slow")
async def async_span(seconds: float) -> list[float]:
    started = time.time()
    await asyncio.sleep(seconds)
    return [started, time.time()]


@tasks.task(topic="t.slow", time_limit=1.0, max_deliveries=1)
def stuck(name: str) -> None:
    mark(name)
    time.sleep(3600)


@tasks.task(topic="t.slow", time_limit=1.0, max_deliveries=1)
async def async_stuck() -> None:
    await asyncio.sleep(3600)


@tasks.task(topic="t.order")
def gate(path: str) -> None:
    """Hold the worker until ``path`` exists (a test opens the gate), at most 120 s."""
    deadline = time.monotonic() + 120
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


@tasks.task(topic="t.order")
def in_order(name: str, label: str) -> None:
    """Append ``label`` to ``$TASKS_MARKS/<name>``: the order tasks ran in."""
    with open(Path(os.environ["TASKS_MARKS"]) / name, "a") as marks:
        marks.write(f"{label}\n")


@tasks.task(topic="t.rate", rate_limit="5/s")
def paced(i: int) -> int:
    return i


@tasks.task(topic="t.capped", concurrency=2)
def capped(name: str, seconds: float) -> None:
    """Append when it ran, ``start end`` (epoch seconds), to ``$TASKS_MARKS/<name>``."""
    start = time.time()
    time.sleep(seconds)
    with open(Path(os.environ["TASKS_MARKS"]) / name, "a") as marks:
        marks.write(f"{start},{time.time()}\n")


@tasks.task(topic="t.periodic")
def tick(name: str) -> int:
    mark(name)
    return 1


if os.environ.get("TASKS_EXTRA"):
    # A task that allows more deliveries than the others, on a topic of its own.
    @tasks.task(topic="t.extra", max_deliveries=7)
    def extra() -> str:
        return "extra"


if os.environ.get("TASKS_PERIODIC"):
    tasks.periodic(None, tick, every=timedelta(seconds=2), args=["every2"], name="every2")
