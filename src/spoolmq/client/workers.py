"""Running a handler in N worker processes, each with its own Consumer."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any

from spoolmq.allocator import tune_allocator
from spoolmq.client.consumer import Consumer, ReceivedMessage


def _worker(
    topics: Sequence[str],
    group: str,
    handler: Callable[[ReceivedMessage], Any],
    options: dict[str, Any],
    max_messages: int | None,
    idle_timeout: float | None,
) -> None:
    tune_allocator()  # a process of ours that only consumes: see spoolmq.allocator
    with Consumer(topics, group, **options) as consumer:
        consumer.run(handler, max_messages=max_messages, idle_timeout=idle_timeout)


def run_workers(
    topics: str | Sequence[str],
    group: str,
    handler: Callable[[ReceivedMessage], Any],
    *,
    processes: int = 2,
    max_messages: int | None = None,
    idle_timeout: float | None = None,
    **consumer_options: Any,
) -> list[int | None]:
    """Run ``handler`` (a module-level function) in ``processes`` worker processes of one
    group until each has handled ``max_messages`` or been idle for ``idle_timeout``
    seconds. Returns the workers' exit codes."""
    names = [topics] if isinstance(topics, str) else list(topics)
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(
            target=_worker,
            args=(names, group, handler, consumer_options, max_messages, idle_timeout),
            name=f"spoolmq-worker-{i}",
        )
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    try:
        for worker in workers:
            worker.join()
    except KeyboardInterrupt:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.join(5)
        raise
    return [worker.exitcode for worker in workers]
