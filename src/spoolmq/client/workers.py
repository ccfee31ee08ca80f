"""Running a handler in N worker processes, each with its own Consumer."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from spoolmq.allocator import tune_allocator
from spoolmq.client.common import check_run_limits
from spoolmq.client.consumer import Consumer, ReceivedMessage
from spoolmq.config import check_settings, setting_names
from spoolmq.errors import InvalidArgumentError, WorkersFailedError

logger = logging.getLogger(__name__)


# How often a worker process looks whether the process that started it is still there.
PARENT_CHECK_S = 0.5


def watch_parent(on_gone: Callable[[], None], every: float = PARENT_CHECK_S) -> None:
    """Call ``on_gone`` once, from a daemon thread, when the process that started this
    one has gone (killed with SIGKILL, say: it could not stop its workers). A worker
    process left behind would go on taking messages with nothing to stop it but a kill
    by pid, and run old code beside the workers started after it."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:  # a child whose parent ended has another
            time.sleep(every)
        logger.error("the process that started this worker (pid %d) is gone: stopping", parent)
        on_gone()

    threading.Thread(target=watch, name="spoolmq-parent-watch", daemon=True).start()


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
        # run() returns once the message in hand is settled (a waiting receive at once).
        watch_parent(consumer._request_stop)
        consumer.run(handler, max_messages=max_messages, idle_timeout=idle_timeout)


def _importable_by_name(handler: Any) -> bool:
    """Whether a spawned process can find ``handler`` the way pickle sends a function: by
    its module and qualified name (a lambda or a function defined inside another is not).
    Checked by looking the name up rather than by pickling, since this package keeps
    pickle out of its code altogether (tests/reliability/test_auth_and_files.py)."""
    found: Any = sys.modules.get(getattr(handler, "__module__", None) or "")
    for part in str(getattr(handler, "__qualname__", "")).split("."):
        found = getattr(found, part, None)
    return found is handler


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
    # Checked here, before any process starts: in a worker the mistake would only be a
    # traceback in that worker's stderr.
    check_settings("run_workers", consumer_options, setting_names(Consumer.__init__))
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise InvalidArgumentError(f"processes must be a whole number from 1, not {processes!r}")
    check_run_limits(max_messages, idle_timeout)
    if not _importable_by_name(handler):
        raise InvalidArgumentError(
            "run_workers' handler must be a module-level function (worker processes import "
            f"it by name): {handler!r} is not"
        )
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
    codes = [worker.exitcode for worker in workers]
    failed = [(worker.name, code) for worker, code in zip(workers, codes, strict=True) if code]
    if failed:
        # Loud, and an exception (a script that calls run_workers exits non-zero): a worker
        # that could not start (no broker, a handler it cannot import) or that died has
        # printed its traceback on stderr; this says which and how.
        shown = ", ".join(f"{name} exited with {code}" for name, code in failed)
        logger.error("run_workers: %s", shown)
        raise WorkersFailedError(
            f"{len(failed)} of {len(workers)} worker process(es) failed: {shown} "
            "(their tracebacks are on stderr above)"
        )
    return codes
