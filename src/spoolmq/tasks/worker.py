"""``spoolmq worker``: run tasks in N processes, M at a time each.

The supervisor (the process ``spoolmq worker`` starts) spawns N worker processes, runs the
periodic scheduler in a thread, marks the tasks the broker dead-letters (``dead_letters.py``,
another thread), replaces a worker that exits (a crash, or one that had to
be replaced after a time limit), and on SIGTERM/SIGINT asks every worker to stop.

A worker process owns one :class:`Consumer` of the tasks' topics (prefetch M) in its main
thread; it runs plain functions in a pool of M threads and ``async def`` tasks on an event
loop in one more thread. The main thread alone talks to the broker (the Consumer is not
thread-safe), and between waits it:

- settles what finished: the result goes to ``tasks.db`` first, then the ACK (a worker
  that dies in between leaves a redelivery that finds the result and does not run again);
  a failure NACKs with the task's backoff until its last attempt, which is recorded
  ``failed`` and ACKed (the result says why, with the traceback);
- renews the lease of every running task every third of the lease (the heartbeat), so a
  long task is never redelivered while its worker lives, and a dead worker's tasks are
  redelivered at once by the broker (its connection closes);
- stops a task past its ``time_limit``: an ``async def`` one is cancelled; a thread cannot
  be stopped, so the attempt is recorded as failed, the worker takes no more work, and
  exits (code 75) once its other tasks are done, and the supervisor starts a new one.

A stop (SIGTERM), or a replacement after a time limit, first hands back the messages pushed
ahead and never started (``Consumer.pause``: unattempted, at once, for the other workers,
rather than waiting out their leases behind the stop); a stop then lets running tasks finish
for ``shutdown_timeout`` seconds, hands back the rest (NACK) and closes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from spoolmq.client import Consumer, ReceivedMessage
from spoolmq.client.workers import watch_parent
from spoolmq.errors import InvalidArgumentError, SerializationError, SpoolError
from spoolmq.tasks.app import Task, Tasks
from spoolmq.tasks.codec import check_json
from spoolmq.tasks.dead_letters import DeadLetterWatch
from spoolmq.tasks.results import FAILED, FINAL_STATES, RETRYING, SUCCEEDED
from spoolmq.tasks.scheduler import Scheduler

logger = logging.getLogger("spoolmq.tasks")

EXIT_REPLACE = 75  # EX_TEMPFAIL: "start another one in my place"
EXIT_CONFIG = 78  # EX_CONFIG: the group refused this worker's settings (retried, backing off)
PURGE_EVERY = 60.0  # seconds between deletions of expired results


def load_tasks(spec: str) -> Tasks:
    """``"package.module:tasks"`` -> that module's Tasks object (the current directory is
    importable, as with ``python -m``)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise InvalidArgumentError(f"expected MODULE:TASKS (e.g. myapp.jobs:tasks), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgumentError(f"cannot import {module_name!r}: {exc}") from None
    tasks = getattr(module, attribute, None)
    if not isinstance(tasks, Tasks):
        raise InvalidArgumentError(f"{spec} is not a spoolmq Tasks object")
    return tasks


def topics_of(tasks: Tasks, only: Sequence[str] | None = None) -> list[str]:
    topics = sorted({task.topic for task in tasks.registry.values()})
    if only:
        unknown = set(only) - set(topics)
        if unknown:
            raise InvalidArgumentError(f"no task uses topic(s): {', '.join(sorted(unknown))}")
        topics = [topic for topic in topics if topic in only]
    if not topics:
        raise InvalidArgumentError("there are no tasks to run")
    return topics


@dataclass
class _Running:
    message: ReceivedMessage
    task: Task[Any, Any]
    task_id: str
    future: concurrent.futures.Future[Any]
    started: float
    deadline: float | None
    abandoned: bool = field(default=False)


class WorkerProcess:
    """One worker process's loop (see the module docstring)."""

    def __init__(
        self,
        tasks: Tasks,
        topics: Sequence[str],
        *,
        concurrency: int = 1,
        shutdown_timeout: float = 30.0,
    ) -> None:
        if concurrency < 1:
            raise InvalidArgumentError("concurrency must be at least 1")
        self.tasks = tasks
        self.topics = list(topics)
        self.concurrency = concurrency
        self.shutdown_timeout = shutdown_timeout
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.stopping = threading.Event()
        self.replace = False
        self._running: dict[int, _Running] = {}
        self._threads = concurrent.futures.ThreadPoolExecutor(
            concurrency, thread_name_prefix="spoolmq-task"
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: Callable[[], None] = lambda: None  # the consumer's, while it runs

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(
                target=self._loop.run_forever, name="spoolmq-async", daemon=True
            ).start()
        return self._loop

    def run(self) -> int:
        """Serve until stopped; the process's exit code (75: replace this process)."""
        try:
            consumer = Consumer(
                self.topics,
                self.tasks.group,
                data=self.tasks.data,
                address=self.tasks.address,
                authkey=self.tasks.authkey,
                prefetch=self.concurrency,
                lease=self.tasks.lease,
                # The broker's count: a worker's death is an attempt too, and past the most
                # any task allows the message goes to <topic>.dlq. A task's own, lower
                # limit is applied here (its last failure is recorded and ACKed). Every
                # task's, as for the limits, not only those served here: the group's
                # consumers must agree, also workers started with other --topics.
                max_deliveries=max(t.max_deliveries for t in self.tasks.registry.values()),
                limits=self.tasks.limits() or None,
                name=f"worker {self.name}",
            )
        except InvalidArgumentError as exc:  # the broker refused the group's settings
            logger.error(
                "cannot join the workers' group: %s. Tasks apps that share a data directory "
                "and a group need the same lease and task settings; give each its own "
                "(Tasks(group=...))",
                exc,
            )
            return EXIT_CONFIG
        self._wakeup = consumer.wakeup
        beat_every = self.tasks.lease / 3
        next_beat = time.monotonic() + beat_every
        stop_deadline: float | None = None
        paused = False
        try:
            while True:
                self._settle_finished()
                self._enforce_time_limits()
                if time.monotonic() >= next_beat:
                    self._heartbeat()
                    next_beat = time.monotonic() + beat_every
                live = [r for r in self._running.values() if not r.abandoned]
                if self.stopping.is_set() or self.replace:
                    if not paused:
                        # Messages pushed ahead would wait behind this stop with their
                        # leases running (a stuck thread can outlast them): another
                        # worker takes them now, without an attempt counted.
                        paused = True
                        self._pause(consumer)
                    if not live:
                        break
                    if stop_deadline is None:
                        stop_deadline = time.monotonic() + self.shutdown_timeout
                    elif time.monotonic() >= stop_deadline and self.stopping.is_set():
                        self._hand_back()
                        break
                    concurrent.futures.wait([r.future for r in live], timeout=0.1)
                    continue
                if len(live) >= self.concurrency:
                    concurrent.futures.wait(
                        [r.future for r in live],
                        timeout=self._wait_for(live, next_beat),
                        return_when=concurrent.futures.FIRST_COMPLETED,
                    )
                    continue
                # A task that finishes ends the wait (its done-callback calls wakeup).
                message = consumer.receive(self._wait_for(live, next_beat))
                if message is not None:
                    try:
                        self._start(message)
                    except SpoolError as exc:  # a damaged record, tasks.db unavailable
                        logger.error("could not start %s (giving it back): %s", message, exc)
                        if not message.settled:
                            self._settle(message, "nack", reason=str(exc)[:500])
        finally:
            consumer.close()
            self._threads.shutdown(wait=False, cancel_futures=True)
        return EXIT_REPLACE if self.replace else 0

    @staticmethod
    def _pause(consumer: Consumer) -> None:
        try:
            released = consumer.pause()
        except SpoolError as exc:  # closing hands them back all the same
            logger.warning("could not hand back the messages pushed ahead: %s", exc)
        else:
            if released:
                logger.info("handed back %d message(s) pushed ahead and not started", released)

    @staticmethod
    def _wait_for(live: list[_Running], next_beat: float) -> float:
        """How long the loop may wait for a message or a task to finish: until the next
        heartbeat or the nearest time limit of a running task, and at most 0.5 s (a stop
        is a flag the loop looks at)."""
        now = time.monotonic()
        pause = 0.5
        if live:
            pause = min(pause, next_beat - now)
            for running in live:
                if running.deadline is not None:
                    pause = min(pause, running.deadline - now)
        return max(0.0, pause)

    # -- one task -------------------------------------------------------------------------

    def _start(self, message: ReceivedMessage) -> None:
        value = message.value
        name = value.get("task") if isinstance(value, dict) else None
        task_id = value.get("id") if isinstance(value, dict) else None
        task = self.tasks.registry.get(name) if isinstance(name, str) else None
        if task is None or not isinstance(task_id, str):
            logger.error(
                "%s/%d@%d is not a task this worker knows (%r); giving it back",
                message.topic,
                message.partition,
                message.offset,
                name,
            )
            message.nack(reason=f"unknown task {name!r}", wait=False)
            return
        args = value.get("args") or []
        kwargs = value.get("kwargs") or {}
        fallback = {
            "name": task.name,
            "topic": task.topic,
            "args": {"args": args, "kwargs": kwargs},
            "priority": value.get("priority", 0),
            "result_ttl_ms": None if task.result_ttl is None else int(task.result_ttl * 1000),
        }
        state = self.tasks.store.claim(task_id, message.attempt, self.name, fallback)
        if state in FINAL_STATES:
            # Cancelled before it started, or already done (its ACK was lost): not again.
            logger.info("task %s is %s: acknowledged without running it", task_id, state)
            message.ack(wait=False)
            return
        if message.attempt > task.max_deliveries:
            error = f"gave up after {message.attempt - 1} deliveries (its workers stopped)"
            self.tasks.store.finish(task_id, FAILED, error=error)
            message.ack(wait=False)
            return
        # The call itself happens in the task's thread or on the loop: arguments that do
        # not fit the function fail the task there, never this loop.
        fn = task.fn
        future: concurrent.futures.Future[Any]
        if task.is_async:

            async def call_async() -> Any:
                return await fn(*args, **kwargs)

            future = asyncio.run_coroutine_threadsafe(call_async(), self._event_loop())
        else:

            def call() -> Any:
                return fn(*args, **kwargs)

            future = self._threads.submit(call)
        # Its result is recorded and ACKed as soon as it is done, not after the loop's
        # wait for the next message ends.
        future.add_done_callback(lambda _: self._wakeup())
        now = time.monotonic()
        deadline = None if task.time_limit is None else now + task.time_limit
        self._running[message.tag] = _Running(message, task, task_id, future, now, deadline)

    def _settle_finished(self) -> None:
        for tag, running in list(self._running.items()):
            if not running.future.done():
                continue
            del self._running[tag]
            if running.abandoned:
                continue  # already settled when its time limit passed
            try:
                result = running.future.result()
            except BaseException as exc:  # the task's failure, whatever it was
                self._failed(running, exc)
                continue
            try:
                check_json(result, "the result")
            except SerializationError as exc:
                # The function ran to its end: another attempt would repeat its effects
                # for a result that can never be stored.
                self._failed(running, exc, retry=False)
                continue
            self.tasks.store.finish(running.task_id, SUCCEEDED, result=result)
            self._settle(running.message, "ack")

    def _failed(
        self,
        running: _Running,
        exc: BaseException,
        *,
        error: str | None = None,
        retry: bool = True,
    ) -> None:
        error = error or f"{type(exc).__name__}: {exc}"
        text = "".join(traceback.format_exception(exc))
        message, task = running.message, running.task
        final = not retry or message.attempt >= task.max_deliveries
        logger.error(
            "task %s (%s) failed on attempt %d of %d%s:\n%s",
            task.name,
            running.task_id,
            message.attempt,
            task.max_deliveries,
            "; not retried: its result cannot be stored"
            if not retry
            else ""
            if final
            else "; will retry",
            text.rstrip(),
        )
        self.tasks.store.finish(
            running.task_id, FAILED if final else RETRYING, error=error, traceback=text
        )
        if final:
            self._settle(message, "ack")
        else:
            backoff = min(task.retry_backoff_max, task.retry_backoff * 2 ** (message.attempt - 1))
            self._settle(message, "nack", delay=backoff, reason=error[:500])

    def _settle(self, message: ReceivedMessage, op: str, **options: Any) -> None:
        try:
            if op == "ack":
                message.ack(wait=False)
            else:
                message.nack(wait=False, **options)
        except SpoolError as exc:  # the broker will redelivery it; the result is stored
            logger.warning("could not %s task message %s: %s", op, message, exc)

    def _enforce_time_limits(self) -> None:
        now = time.monotonic()
        for running in list(self._running.values()):
            if running.abandoned or running.deadline is None or now < running.deadline:
                continue
            running.abandoned = True
            limit = running.task.time_limit
            error = f"TimeLimitExceeded: ran more than {limit:g} s"
            if running.task.is_async:
                running.future.cancel()  # the coroutine gets CancelledError at its next await
            else:
                # A thread cannot be stopped from outside: this process is replaced once
                # its other tasks are done, which ends the thread with it.
                self.replace = True
            self._failed(running, TimeoutError(error), error=error)

    def _heartbeat(self) -> None:
        for running in list(self._running.values()):
            if running.abandoned:
                continue
            try:
                running.message.extend_lease(self.tasks.lease)
            except SpoolError as exc:
                logger.warning("could not renew the lease of task %s: %s", running.task_id, exc)

    def _hand_back(self) -> None:
        """Stopping and out of time: give the unfinished tasks back for another worker."""
        for running in list(self._running.values()):
            if running.abandoned:
                continue
            logger.warning(
                "task %s did not finish before the stop; handing it back", running.task_id
            )
            self.tasks.store.finish(running.task_id, RETRYING, error="handed back at a worker stop")
            self._settle(running.message, "nack", delay=0, reason="worker stopped")
            running.future.cancel()


# -- processes ---------------------------------------------------------------------------


def _child(spec: str, topics: list[str], concurrency: int, shutdown_timeout: float) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s worker[%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    tasks = load_tasks(spec)
    worker = WorkerProcess(
        tasks, topics, concurrency=concurrency, shutdown_timeout=shutdown_timeout
    )

    def stop(signum: int, frame: object) -> None:
        worker.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)  # Ctrl-C reaches the whole process group
    # A supervisor killed with SIGKILL cannot stop this process: it stops as on SIGTERM.
    watch_parent(worker.stopping.set)
    code = worker.run()
    tasks.close()
    # A thread stuck in a task past its time limit would keep a normal exit waiting.
    logging.shutdown()
    os._exit(code)


def run_worker(
    spec: str,
    *,
    processes: int = 1,
    concurrency: int = 1,
    topics: Sequence[str] | None = None,
    scheduler: bool = True,
    shutdown_timeout: float = 30.0,
) -> int:
    """Run ``spec``'s tasks (``"module:tasks"``) in ``processes`` worker processes until
    SIGTERM or SIGINT; returns the exit code."""
    if processes < 1 or concurrency < 1:
        raise InvalidArgumentError("--processes and --concurrency must be at least 1")
    tasks = load_tasks(spec)
    names = topics_of(tasks, topics)
    context = multiprocessing.get_context("spawn")
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def start() -> multiprocessing.process.BaseProcess:
        process = context.Process(
            target=_child,
            args=(spec, names, concurrency, shutdown_timeout),
            name="spoolmq-worker",
        )
        process.start()
        logger.info("worker process %d started (topics %s)", process.pid, ",".join(names))
        return process

    children = [start() for _ in range(processes)]
    started_at = [time.monotonic()] * processes
    # A process that dies soon after starting (a task module that fails to import in the
    # child, a broker that is gone) is restarted after a pause that doubles up to 30 s,
    # not in a tight loop; one that ran a while, or asked to be replaced, at once.
    pauses = [0.0] * processes
    restart_at = [0.0] * processes
    schedule_thread = None
    periodic = Scheduler(tasks) if scheduler and tasks.periodics else None
    if periodic is not None:
        schedule_thread = threading.Thread(
            target=periodic.run, args=(stop,), name="spoolmq-scheduler", daemon=True
        )
        schedule_thread.start()
    letters = DeadLetterWatch(tasks, names)
    letters_thread = threading.Thread(
        target=letters.run, args=(stop,), name="spoolmq-dead-letters", daemon=True
    )
    letters_thread.start()
    next_purge = 0.0
    try:
        while not stop.is_set():
            for i, child in enumerate(children):
                if child.exitcode is None:
                    continue
                now = time.monotonic()
                if not restart_at[i]:
                    quick = now - started_at[i] < 10 and child.exitcode != EXIT_REPLACE
                    pauses[i] = min(30.0, max(0.5, pauses[i] * 2)) if quick else 0.0
                    restart_at[i] = now + pauses[i]
                    if child.exitcode == EXIT_CONFIG:
                        # Refused by the group (its log above says why): during a rolling
                        # upgrade the old workers leave, and a later try joins.
                        logger.error(
                            "worker process %d could not join group %r with these tasks' "
                            "settings; trying again in %g s",
                            child.pid,
                            tasks.group,
                            pauses[i],
                        )
                    else:
                        logger.warning(
                            "worker process %d exited with %s; starting another%s",
                            child.pid,
                            child.exitcode,
                            f" in {pauses[i]:g} s" if pauses[i] else "",
                        )
                if now >= restart_at[i]:
                    children[i] = start()
                    started_at[i] = now
                    restart_at[i] = 0.0
            if time.monotonic() >= next_purge:
                try:
                    purged = tasks.store.purge_expired()
                    if purged:
                        logger.info("deleted %d expired task result(s)", purged)
                except SpoolError as exc:
                    logger.warning("could not delete expired results: %s", exc)
                next_purge = time.monotonic() + PURGE_EVERY
            stop.wait(0.5)
    finally:
        stop.set()
        for child in children:
            if child.exitcode is None and child.pid is not None:
                os.kill(child.pid, signal.SIGTERM)
        for child in children:
            child.join(shutdown_timeout + 15)
            if child.exitcode is None:
                logger.error("worker process %d did not stop; killing it", child.pid)
                child.kill()
                child.join(5)
        if schedule_thread is not None:
            schedule_thread.join(10)
        letters_thread.join(10)
        if periodic is not None:
            periodic.close()
        tasks.close()
    return 0
