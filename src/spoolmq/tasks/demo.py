"""The tasks part of ``spoolmq demo``: tasks with results, a retry, a failure, a unique
send, a cancelled one, priorities and a periodic job, run by a real worker process on the
demo's broker (``run_tasks_demo``, called by spoolmq.demo while its broker runs)."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from spoolmq.errors import ResultTimeoutError, TaskFailed
from spoolmq.tasks.app import TaskHandle, Tasks
from spoolmq.tasks.results import TaskRow
from spoolmq.tasks.scheduler import Scheduler
from spoolmq.tasks.worker import WorkerProcess


def build_tasks(data: str | os.PathLike[str]) -> Tasks:
    """The demo's tasks, declared the same way in the demo and in its worker process."""
    tasks = Tasks(data, lease=10)

    @tasks.task(topic="demo.images", name="resize", priority=0)
    def resize(image: str, width: int) -> dict[str, Any]:
        time.sleep(0.05)  # the work itself
        return {"image": image, "width": width, "bytes": width * 97}

    @tasks.task(topic="demo.images", name="thumbnail", max_deliveries=3, retry_backoff=0.2)
    def thumbnail(image: str) -> str:
        if image.endswith(".bmp"):
            raise ValueError(f"{image}: unsupported format")
        return f"{image}.thumb.png"

    @tasks.task(topic="demo.images", name="checksum")
    async def checksum(image: str) -> int:
        await asyncio.sleep(0.02)
        return sum(image.encode()) % 65521

    @tasks.task(topic="demo.images", name="report")
    def report() -> str:
        return "report sent"

    tasks.periodic(None, report, every=timedelta(seconds=1), name="report-every-second")
    return tasks


def _worker(data: str) -> None:
    # The failing thumbnail's tracebacks would be logged on the demo's terminal; the
    # demo's table shows each failure, and `spoolmq tasks inspect` its traceback.
    logging.getLogger("spoolmq.tasks").setLevel(logging.CRITICAL)
    tasks = build_tasks(data)
    worker = WorkerProcess(tasks, ["demo.images"], concurrency=4)
    signal.signal(signal.SIGTERM, lambda signum, frame: worker.stopping.set())
    signal.signal(signal.SIGINT, lambda signum, frame: worker.stopping.set())
    worker.run()
    tasks.close()


def run_tasks_demo(data: str | os.PathLike[str], console: Any) -> dict[str, Any]:
    """Send the demo's tasks, run them in a worker process, print what came back; return
    the figures shown (for tests)."""
    from rich.table import Table

    tasks = build_tasks(data)
    console.print("[bold]tasks[/bold]: sending, running in a worker process, reading results")
    registry = tasks.registry
    handles: list[tuple[str, TaskHandle]] = []
    for i in range(8):
        priority = 9 if i % 4 == 0 else 0
        handle = registry["resize"].send_with(args=[f"img{i}.jpg", 320], priority=priority)
        handles.append((f"resize img{i}.jpg (priority {priority})", handle))
    handles.append(("thumbnail a.png", registry["thumbnail"].send("a.png")))
    handles.append(("thumbnail b.bmp (fails 3 times)", registry["thumbnail"].send("b.bmp")))
    handles.append(("checksum (async def)", registry["checksum"].send("a.png")))
    first = registry["resize"].send_with(args=["big.jpg", 2048], unique_for=60)
    again = registry["resize"].send_with(args=["big.jpg", 2048], unique_for=60)
    handles.append(
        (f"resize big.jpg, sent twice: {'one task' if first.id == again.id else 'two'}", first)
    )
    cancelled = registry["resize"].send_with(args=["late.jpg", 64], delay=1)
    cancelled.cancel()
    handles.append(("resize late.jpg (delayed, cancelled)", cancelled))

    process = multiprocessing.get_context("spawn").Process(
        target=_worker, args=(str(data),), name="demo-task-worker"
    )
    process.start()
    stop = threading.Event()
    scheduler = Scheduler(tasks)
    ticker = threading.Thread(target=scheduler.run, args=(stop,), daemon=True)
    ticker.start()
    table = Table(title="tasks and their results (all sent before the worker started)")
    for column in ("task", "state", "attempts", "started", "result or error"):
        table.add_column(column)
    states: dict[str, int] = {}
    started_at: dict[str, int] = {}
    try:
        outcomes: list[tuple[str, TaskRow | None, str]] = []
        for label, handle in handles:
            try:
                outcome = repr(handle.result(timeout=60))
            except TaskFailed as exc:
                outcome = exc.error
            except ResultTimeoutError as exc:
                outcome = str(exc)
            outcomes.append((label, tasks.get(handle.id), outcome))
        # When each started, in ms after the first: the priority-9 resizes go first.
        starts = [row.started_ms for _, row, _ in outcomes if row and row.started_ms]
        first_start = min(starts, default=0)
        for label, row, outcome in outcomes:
            state = row.state if row is not None else "?"
            states[state] = states.get(state, 0) + 1
            if row is not None and row.started_ms:
                started_at[label] = row.started_ms - first_start
            started = (
                f"+{row.started_ms - first_start} ms" if row is not None and row.started_ms else "-"
            )
            table.add_row(label, state, str(row.attempts if row else ""), started, outcome)
        time.sleep(2.5)  # let the periodic job tick a few times: that is what it shows
    finally:
        stop.set()
        ticker.join(5)
        scheduler.close()
        if process.pid is not None and process.exitcode is None:
            os.kill(process.pid, signal.SIGTERM)
        process.join(30)
        tasks.close()
    console.print(table)
    ticks = len(scheduler.fired)
    console.print(
        f"periodic job 'report-every-second': {ticks} tick(s) sent; "
        f"`spoolmq tasks list --data {Path(data)}` lists them all"
    )
    return {"states": states, "ticks": ticks, "started_at": started_at}
