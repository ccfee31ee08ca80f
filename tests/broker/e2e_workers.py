"""Code that end-to-end tests run in separate client processes (importable under ``spawn``),
and the small helpers the tests share to start, wait for and read back those processes.

Each worker writes what it saw as JSON lines to its own file, one line per event, written as
it happens, so the test can check the record even of a worker that was cut short.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from spoolmq import Consumer, Position, Publisher
from spoolmq.testing import wait_until

SPAWN = multiprocessing.get_context("spawn")


class _Lines:
    """Append-only JSON lines, each written with one ``write`` and no buffering."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def add(self, **fields: Any) -> None:
        os.write(self._fd, orjson.dumps(fields) + b"\n")

    def close(self) -> None:
        os.close(self._fd)


def read_lines(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def publish_worker(
    data: str,
    topic: str,
    worker: int,
    count: int,
    out: str,
    keys: int = 0,
    acks: str = "all",
    delivery_timeout: float = 120.0,
    pause: float = 0.0,
    in_flight: int = 1,
    stop_on_error: bool = False,
) -> None:
    """Publish ``{"w": worker, "i": n}``, ``in_flight`` at a time (``publish()`` when 1,
    else ``publish_async`` and wait for the group), optionally keyed ``k<n % keys>``. Each
    line in ``out`` is a message the broker ACKed, or the error its publish raised."""
    lines = _Lines(out)
    publisher = Publisher(data=data, acks=acks, delivery_timeout=delivery_timeout)
    failed = False
    for first in range(0, count, in_flight):
        numbers = range(first, min(count, first + in_flight))
        futures = [
            publisher.publish_async(
                topic, {"w": worker, "i": n}, key=f"k{n % keys}" if keys else None
            )
            for n in numbers
        ]
        for n, future in zip(numbers, futures, strict=True):
            try:
                position = future.result()
            except Exception as exc:
                lines.add(w=worker, i=n, error=type(exc).__name__, message=str(exc))
                failed = True
                continue
            lines.add(
                w=worker,
                i=n,
                partition=position.partition,
                offset=position.offset,
                duplicate=position.duplicate,
            )
        if failed and stop_on_error:
            break
        if pause:
            time.sleep(pause)  # pacing the workload, not waiting for anything
    publisher.close()
    lines.close()


def consume_worker(
    data: str,
    topics: Sequence[str],
    group: str,
    out: str,
    idle_timeout: float,
    options: dict[str, Any] | None = None,
    work_seconds: float = 0.0,
    max_messages: int | None = None,
    subscribed: Any = None,
) -> None:
    """Receive until ``idle_timeout`` seconds pass with nothing new; for each message write
    when it was received and when its ACK was sent (monotonic clock, system-wide on Linux).
    With a ``subscribed`` barrier, start receiving only once every worker has subscribed, so
    that the first one up cannot take all the work."""
    lines = _Lines(out)
    handled = 0
    with Consumer(list(topics), group, data=data, **(options or {})) as consumer:
        if subscribed is not None:
            subscribed.wait(120)
        while max_messages is None or handled < max_messages:
            message = consumer.receive(timeout=idle_timeout)
            if message is None:
                break
            received = time.monotonic()
            if work_seconds:
                time.sleep(work_seconds)  # the handler's work
            acked = time.monotonic()
            message.ack()
            handled += 1
            lines.add(
                pid=os.getpid(),
                topic=message.topic,
                partition=message.partition,
                offset=message.offset,
                key=message.key,
                value=message.value,
                attempt=message.attempt,
                received=received,
                acked=acked,
            )
    lines.close()


def publish_all(data: str | Path, topic: str, values: Sequence[Any]) -> list[Position]:
    """Publish each value with ``publish()`` (stored and ACKed one by one)."""
    with Publisher(data=data) as publisher:
        return [publisher.publish(topic, value) for value in values]


def start(target: Callable[..., None], *args: Any) -> Any:
    process = SPAWN.Process(target=target, args=args)
    process.start()
    return process


def join_all(processes: Sequence[Any], timeout: float) -> None:
    """Wait for every process until a common deadline; fail naming the ones still running."""
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    running = [p.pid for p in processes if p.is_alive()]
    assert not running, f"client processes {running} did not finish within {timeout} s"
    failed = [(p.pid, p.exitcode) for p in processes if p.exitcode != 0]
    assert not failed, f"client processes failed: {failed}"


@contextmanager
def client_processes() -> Iterator[list[Any]]:
    """A list to put started processes in; any still alive at the end are terminated (by
    their own pid) so that a failed test leaves nothing running."""
    processes: list[Any] = []
    try:
        yield processes
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)


def flaky_handler(message: Any) -> None:
    """A handler for ``run_workers``: record each call in ``$E2E_OUT/<pid>``; fail the first
    attempt of every value divisible by 5 (so the worker NACKs it and it comes back). The
    first call of each worker waits until ``$E2E_WORKERS`` workers have one, so that the
    work is spread whatever the order the processes started in."""
    out = Path(os.environ["E2E_OUT"])
    first_call = not (out / str(os.getpid())).exists()
    lines = _Lines(str(out / str(os.getpid())))
    lines.add(value=message.value, attempt=message.attempt, pid=os.getpid())
    lines.close()
    if first_call:
        wanted = int(os.environ["E2E_WORKERS"])
        wait_until(lambda: len(list(out.iterdir())) >= wanted, 60, f"{wanted} busy workers")
    if message.value % 5 == 0 and message.attempt == 1:
        raise RuntimeError(f"value {message.value} fails once")
