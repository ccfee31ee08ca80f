"""``Tasks``: declare functions as tasks, send them, read their results.

A task is a message on a topic whose value names the task and carries its JSON arguments
(``{"task": ..., "id": ..., "args": [...], "kwargs": {...}}``); ``spoolmq worker`` runs it
(spoolmq.tasks.worker). Sending publishes through the ordinary :class:`Publisher` (ACK
level ``all``: ``send`` returns once the message is fsynced), and the task's row in
``tasks.db`` (spoolmq.tasks.results) records its state and, later, its result. Delivery,
leases, retries with backoff, delays, per-key order and the DLQ are the broker's, exactly
as for any consumer: the task layer adds no second delivery engine.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import re
import select
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Generic, ParamSpec, TypeVar, overload

import orjson

from spoolmq.client import Admin, Publisher
from spoolmq.client.common import amount
from spoolmq.client.connection import Address
from spoolmq.config import resolve_data_dir
from spoolmq.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    ResultTimeoutError,
    SerializationError,
    SpoolError,
    TaskFailed,
)
from spoolmq.files import make_private_dirs
from spoolmq.inotify import open_inotify
from spoolmq.protocol.limits import MAX_DELIVERIES, check_concurrency, parse_rate
from spoolmq.store.message import check_at_most_max_delay, check_priority
from spoolmq.store.names import check_topic
from spoolmq.tasks.codec import check_json
from spoolmq.tasks.results import ENDED_STATES, SUCCEEDED, ResultStore, TaskRow
from spoolmq.tasks.schedule import Periodic

P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger("spoolmq.tasks")

DEFAULT_TOPIC = "tasks"
DEFAULT_GROUP = "spoolmq-tasks"
_NOT_IN_TOPIC_NAMES = re.compile(r"[^A-Za-z0-9._-]")
# Tasks.result: without inotify, tasks.db is polled, backing off up to POLL_CAP_S seconds;
# with it, each wait for a write ends after WATCHED_CAP_S at most (a safety net), and a
# write is followed by reads after AFTER_WRITE_S, twice that, ... (see Tasks.result).
POLL_CAP_S = 0.25
WATCHED_CAP_S = 1.0
AFTER_WRITE_S = 0.001


def _type_name(value: Any) -> str:
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def _seconds(value: float | timedelta | None, what: str, *, positive: bool = False) -> float | None:
    """None, or ``value`` (seconds or a timedelta) as finite seconds, not negative (more
    than 0 if ``positive``) and at most a thousand years (what tasks.db's 64-bit times
    hold once added to the clock); InvalidArgumentError naming ``what`` otherwise (text,
    a bool, NaN and infinity included)."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    return _bounded(value, what, positive=positive)


def _bounded(value: Any, what: str, *, positive: bool = False) -> float:
    """``value`` as finite seconds from 0 (more than 0 if ``positive``) to a thousand
    years; InvalidArgumentError naming ``what`` otherwise."""
    seconds = amount(value, what, positive=positive)
    check_at_most_max_delay(seconds, what)
    return seconds


class _Changes:
    """Wakes a thread waiting for a result when a file in the directory of ``tasks.db`` is
    written (a commit writes its WAL), through inotify; where inotify is not available,
    ``wait`` sleeps. One per thread and process (``_watcher``), kept open until
    ``Tasks.close``: closing an inotify descriptor waits for the kernel (10-20 ms here)."""

    def __init__(self, path: Path) -> None:
        self.pid = os.getpid()
        self._inotify = open_inotify()
        if self._inotify is not None and self._inotify.watch(path.parent) < 0:
            self._inotify.close()  # out of watches: poll
            self._inotify = None

    @property
    def watching(self) -> bool:
        return self._inotify is not None

    def forget(self) -> None:
        """Drop the writes seen so far (before the caller's first read)."""
        if self._inotify is not None:
            self._inotify.drain()

    def wait(self, seconds: float) -> bool:
        """Until a file of the directory is written (tasks.db, or another: the caller
        reads again and waits again) or ``seconds`` pass; True if a write ended it. A
        write since the last wait ends it at once."""
        if self._inotify is None:
            time.sleep(max(seconds, 0.0))
            return False
        readable, _, _ = select.select([self._inotify.fd], [], [], max(seconds, 0.0))
        self._inotify.drain()
        return bool(readable)

    def close(self) -> None:
        if self._inotify is not None and self.pid == os.getpid():
            self._inotify.close()
        self._inotify = None


class TaskHandle:
    """A sent task: its id, and a way to wait for its result or cancel it."""

    def __init__(self, tasks: Tasks, task_id: str, *, created: bool = True) -> None:
        self.tasks = tasks
        self.id = task_id
        self.created = created  # False: a unique task's earlier send, returned again

    def result(self, timeout: float | None = None) -> Any:
        """The task's return value, waiting up to ``timeout`` seconds (None: forever).
        TaskFailed if it failed (its ``error`` and ``traceback`` say why) or was
        cancelled; ResultTimeoutError if it has not finished in time."""
        return self.tasks.result(self.id, timeout=timeout)

    def cancel(self) -> bool:
        """Cancel the task if it has not started: True if it will never run."""
        return self.tasks.cancel(self.id)

    def state(self) -> str | None:
        row = self.tasks.get(self.id)
        return None if row is None else row.state

    def __repr__(self) -> str:
        return f"TaskHandle({self.id!r})"


class Task(Generic[P, R]):
    """A function declared with ``@tasks.task``. Calling it runs it here, now;
    ``send`` enqueues it for a worker."""

    def __init__(
        self,
        tasks: Tasks,
        fn: Callable[P, R],
        *,
        name: str,
        topic: str,
        max_deliveries: int,
        retry_backoff: float,
        retry_backoff_max: float,
        time_limit: float | None,
        rate_limit: str | None,
        concurrency: int | None,
        priority: int,
        result_ttl: float | None,
    ) -> None:
        self.tasks = tasks
        self.fn = fn
        self.name = name
        self.topic = topic
        self.max_deliveries = max_deliveries
        self.retry_backoff = retry_backoff
        self.retry_backoff_max = retry_backoff_max
        self.time_limit = time_limit
        # Enforced by the broker, across every worker: the limits of the task's topic.
        self.rate_limit = rate_limit
        self.concurrency = concurrency
        self.priority = priority
        self.result_ttl = result_ttl
        self.is_async = inspect.iscoroutinefunction(fn)
        # What send() checks its arguments against (None: a callable with no signature to
        # read, such as some builtins: anything goes, as for a call).
        # The function's own signature, not the one functools.wraps points at: a decorator
        # that supplies an argument itself (a session, a connection) takes fewer.
        try:
            self.signature: inspect.Signature | None = inspect.signature(fn, follow_wrapped=False)
        except (TypeError, ValueError):
            self.signature = None
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def check_call(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The call's arguments by parameter name, defaults filled in (so ``f(1)``,
        ``f(n=1)`` and ``f(1, b=2)`` with ``b=2`` the default are one call); an
        InvalidArgumentError for arguments the function cannot take: a call the worker
        could only fail, on every retry (or every tick of a periodic job). Without a
        signature to read (a builtin), the arguments as given."""
        if self.signature is None:
            return {"args": list(args), "kwargs": dict(kwargs)}
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidArgumentError(
                f"{self.name}{self.signature} cannot take these arguments: {exc}"
            ) from None
        given = set(bound.arguments)
        bound.apply_defaults()
        call = dict(bound.arguments)
        for name in call.keys() - given:
            try:  # a default JSON cannot carry (a sentinel, a set) is named by its type
                check_json(call[name], name)
            except SerializationError:
                call[name] = _type_name(call[name])
        return call

    def send(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle:
        """Enqueue a run with these arguments; returns once the message is stored."""
        return self.send_with(args=args, kwargs=kwargs)

    def send_with(
        self,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        delay: float | timedelta | None = None,
        key: str | None = None,
        priority: int | None = None,
        unique_for: float | timedelta | None = None,
        unique_key: str | None = None,
    ) -> TaskHandle:
        """Enqueue with options: ``args`` (a list or tuple) and ``kwargs`` (a mapping) for
        the call, ``delay`` (seconds or timedelta), ``key`` (runs of one key go in order,
        one at a time), ``priority`` 0-9 (9 first), ``unique_for`` (seconds: a second send
        of the same task and arguments, or of the same ``unique_key``, within that window
        returns the first one's handle)."""
        if not isinstance(args, list | tuple):
            raise InvalidArgumentError(
                f"args must be a list or tuple of the call's positional arguments, "
                f"not {type(args).__name__} {args!r:.60}"
            )
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise InvalidArgumentError(
                f"kwargs must be a mapping of the call's keyword arguments, "
                f"not {type(kwargs).__name__} {kwargs!r:.60}"
            )
        if unique_key is not None and not isinstance(unique_key, str):
            raise InvalidArgumentError(f"unique_key must be text, not {unique_key!r:.60}")
        return self.tasks._send(
            self,
            list(args),
            dict(kwargs or {}),
            delay=_seconds(delay, "delay"),
            key=key,
            priority=self.priority if priority is None else check_priority(priority),
            unique_for=_seconds(unique_for, "unique_for"),
            unique_key=unique_key,
        )

    def __repr__(self) -> str:
        return f"Task({self.name!r}, topic={self.topic!r})"


class Tasks:
    """The registry of a program's tasks and its way to the queue.

    Args:
        data: the data directory (default ``$SPOOLMQ_DATA`` or ``./queue_data``); results
            are kept in ``<data>/tasks.db``.
        group: the consumer group the workers share.
        lease: seconds a worker holds a task before the broker would redeliver it; a worker
            renews it every third of that while the task runs (the heartbeat).
        address, authkey: a broker's TCP listener instead of the Unix socket.
    """

    def __init__(
        self,
        data: str | os.PathLike[str] | None = None,
        *,
        group: str = DEFAULT_GROUP,
        lease: float = 30.0,
        address: Address | None = None,
        authkey: bytes | None = None,
    ) -> None:
        lease = _bounded(lease, "lease", positive=True)
        if not isinstance(group, str) or not group:
            raise InvalidArgumentError(f"group must be a non-empty name, not {group!r}")
        self.data: Path = resolve_data_dir(data)
        self.group = group
        self.lease = lease
        self.address = address
        self.authkey = authkey
        self.registry: dict[str, Task[Any, Any]] = {}
        self.periodics: dict[str, Periodic] = {}
        self.store = ResultStore(self.data)
        self._publisher: Publisher | None = None
        self._publisher_pid = -1
        self._lock = threading.Lock()
        self._local = threading.local()  # this thread's _Changes
        self._watchers: list[_Changes] = []
        self._closed = False

    # -- declaring ----------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        topic: str | None = None,
        max_deliveries: int = 5,
        retry_backoff: float = 1.0,
        retry_backoff_max: float = 300.0,
        time_limit: float | None = None,
        rate_limit: str | None = None,
        concurrency: int | None = None,
        priority: int = 0,
        result_ttl: float | None = 86400.0,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        topic: str | None = None,
        max_deliveries: int = 5,
        retry_backoff: float = 1.0,
        retry_backoff_max: float = 300.0,
        time_limit: float | None = None,
        rate_limit: str | None = None,
        concurrency: int | None = None,
        priority: int = 0,
        result_ttl: float | None = 86400.0,
    ) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
        """Declare a task (``@tasks.task`` or ``@tasks.task(topic=..., ...)``).

        ``max_deliveries`` attempts in all (a worker's death counts as one);
        ``retry_backoff`` seconds before the first retry, doubling up to
        ``retry_backoff_max``; ``time_limit`` seconds per attempt; ``result_ttl`` seconds
        a finished task's result is kept (None: forever); ``priority`` 0-9 is the default
        of its sends. ``rate_limit`` (``"50/s"``: runs started in any one second; ``/m``,
        ``/h``) and ``concurrency`` (runs at once) hold across every worker: the broker
        applies them to the task's topic, so a task with either has a topic of its own
        (by default ``tasks.<name>``; the default topic of the others is ``tasks``).
        """
        limited = rate_limit is not None or concurrency is not None
        if topic is not None:
            check_topic(topic)
        if (
            isinstance(max_deliveries, bool)
            or not isinstance(max_deliveries, int)
            or not 1 <= max_deliveries <= MAX_DELIVERIES
        ):
            raise InvalidArgumentError(
                f"max_deliveries must be a whole number from 1 to {MAX_DELIVERIES}, "
                f"not {max_deliveries!r}"
            )
        # A negative backoff would be a NACK delay the broker refuses, at every failure.
        backoff = _bounded(retry_backoff, "retry_backoff")
        backoff_max = _bounded(retry_backoff_max, "retry_backoff_max")
        limit = _seconds(time_limit, "time_limit", positive=True)
        ttl = _seconds(result_ttl, "result_ttl")
        if rate_limit is not None:
            parse_rate(rate_limit)
        if concurrency is not None:
            check_concurrency(concurrency)
        check_priority(priority)

        def declare(function: Callable[P, R]) -> Task[P, R]:
            task_name = name or f"{function.__module__}.{function.__qualname__}"
            if task_name in self.registry:
                raise InvalidArgumentError(f"a task named {task_name!r} is already declared")
            task_topic = topic
            if task_topic is None:
                own = f"{DEFAULT_TOPIC}.{_NOT_IN_TOPIC_NAMES.sub('_', task_name)}"[:128]
                task_topic = own if limited else DEFAULT_TOPIC
            self._check_topic_sharing(task_name, task_topic, limited)
            declared = Task(
                self,
                function,
                name=task_name,
                topic=task_topic,
                max_deliveries=max_deliveries,
                retry_backoff=backoff,
                retry_backoff_max=backoff_max,
                time_limit=limit,
                rate_limit=rate_limit,
                concurrency=concurrency,
                priority=priority,
                result_ttl=ttl,
            )
            self.registry[task_name] = declared
            return declared

        return declare(fn) if fn is not None else declare

    def _check_topic_sharing(self, name: str, topic: str, limited: bool) -> None:
        """A task with limits is alone on its topic: the broker limits a topic, not a task."""
        for other in self.registry.values():
            if other.topic != topic:
                continue
            if limited or other.rate_limit is not None or other.concurrency is not None:
                has_limits = name if limited else other.name
                raise InvalidArgumentError(
                    f"tasks {other.name!r} and {name!r} share topic {topic!r}, and "
                    f"{has_limits!r} has a rate limit or a concurrency cap, which the broker "
                    "applies to the whole topic: give it a topic of its own"
                )

    def limits(self) -> dict[str, dict[str, Any]]:
        """The broker limits of the declared tasks, by topic (the workers' Consumer
        ``limits``)."""
        limits: dict[str, dict[str, Any]] = {}
        for task in self.registry.values():
            limit: dict[str, Any] = {}
            if task.rate_limit is not None:
                limit["rate"] = task.rate_limit
            if task.concurrency is not None:
                limit["concurrency"] = task.concurrency
            if limit:
                limits[task.topic] = limit
        return limits

    def periodic(
        self,
        cron: str | None = None,
        fn: Task[Any, Any] | None = None,
        *,
        every: timedelta | float | None = None,
        tz: str | None = None,
        catch_up: bool = True,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> Periodic:
        """Send ``fn`` on a schedule: a cron expression (``"*/5 * * * *"``, in time zone
        ``tz``, default UTC) or ``every`` (a timedelta or seconds). Each tick is sent
        once across every worker that runs the scheduler; ticks missed while nothing ran
        are sent once on return (``catch_up=False``: skipped)."""
        if not isinstance(fn, Task) or self.registry.get(fn.name) is not fn:
            raise InvalidArgumentError("periodic() needs a task declared on these Tasks")
        check_json(list(args), "args")
        check_json(dict(kwargs or {}), "kwargs")
        fn.check_call(list(args), dict(kwargs or {}))
        job = Periodic.build(
            fn.name,
            cron=cron,
            every=_seconds(every, "every"),
            tz=tz,
            catch_up=catch_up,
            args=list(args),
            kwargs=dict(kwargs or {}),
            name=name,
        )
        if job.name in self.periodics:
            raise InvalidArgumentError(f"a periodic job named {job.name!r} is already declared")
        self.periodics[job.name] = job
        return job

    # -- sending ------------------------------------------------------------------------

    def publisher(self) -> Publisher:
        """This process's Publisher, opened on first use (a forked child opens its own)."""
        with self._lock:
            if self._publisher is None or self._publisher_pid != os.getpid():
                self._publisher = Publisher(
                    self.data, address=self.address, authkey=self.authkey, name="tasks"
                )
                self._publisher_pid = os.getpid()
            return self._publisher

    def _send(
        self,
        task: Task[Any, Any],
        args: list[Any],
        kwargs: dict[str, Any],
        *,
        delay: float | None,
        key: str | None,
        priority: int,
        unique_for: float | None,
        unique_key: str | None,
        task_id: str | None = None,
    ) -> TaskHandle:
        if self._closed:
            raise SpoolError("these Tasks are closed (tasks.close() was called): nothing is sent")
        check_json(args, "args")
        check_json(kwargs, "kwargs")
        call = task.check_call(args, kwargs)
        if key is not None and not isinstance(key, str):
            raise InvalidArgumentError("a task's key must be text")
        if unique_key is not None and unique_for is None:
            raise InvalidArgumentError("unique_key needs unique_for (the window, in seconds)")
        if unique_for is not None and unique_key is None:
            # The same task with the same arguments, however they were passed (by
            # position or by name, a default left out or given): the call bound to the
            # function's parameters, as canonical JSON (sorted keys), hashed.
            canonical = orjson.dumps([task.name, call], option=orjson.OPT_SORT_KEYS)
            unique_key = f"{task.name}:{hashlib.sha256(canonical).hexdigest()}"
        elif unique_key is not None:
            # A key names a call of this task: another task's send with the same key is
            # another call (it got that task's handle, and never ran).
            unique_key = f"{task.name}:key:{unique_key}"
        task_id = task_id or uuid.uuid4().hex
        eta_ms = None if not delay else time.time_ns() // 1_000_000 + int(delay * 1000)
        task_id, created = self.store.add(
            task_id,
            name=task.name,
            topic=task.topic,
            args={"args": args, "kwargs": kwargs},
            key=key,
            priority=priority,
            eta_ms=eta_ms,
            result_ttl_ms=None if task.result_ttl is None else int(task.result_ttl * 1000),
            unique_key=unique_key,
            unique_for_ms=None if unique_for is None else int(unique_for * 1000),
        )
        if not created and unique_key is not None:
            return TaskHandle(self, task_id, created=False)
        try:
            position = self.publisher().publish(
                task.topic,
                task_message(task, task_id, args, kwargs, priority),
                key=key,
                delay=delay or None,
                priority=priority,
            )
        except BaseException:
            self.store.forget(task_id)  # never a row for a task that was not stored
            raise
        try:
            self.store.set_position(task_id, position.partition, position.offset)
        except (sqlite3.Error, SpoolError) as exc:
            # The task is stored and will run: only a cancel of it cannot reach the broker
            # then (a worker drops it instead), so the sender is not told it failed.
            logger.warning("task %s: could not record where its message is: %s", task_id, exc)
        return TaskHandle(self, task_id)

    # -- reading ------------------------------------------------------------------------

    def get(self, task_id: str) -> TaskRow | None:
        """The task's row (state, attempts, result or error), None if unknown or expired."""
        return self.store.get(task_id)

    def handle(self, task_id: str) -> TaskHandle:
        return TaskHandle(self, task_id)

    def result(self, task_id: str, timeout: float | None = None) -> Any:
        """The result of task ``task_id``, from any process (see TaskHandle.result).

        Waits for ``tasks.db`` to change (a worker records the result there), through
        inotify on its directory, and reads the task's row again each time: the result
        is seen as soon as it is committed. Where inotify is not available, polls, backing
        off to every POLL_CAP_S."""
        if not isinstance(task_id, str):
            raise InvalidArgumentError(f"a task id is text, not {task_id!r:.60}")
        if timeout is not None:
            timeout = amount(timeout, "timeout")
        deadline = None if timeout is None else time.monotonic() + timeout
        changes = self._watcher()
        changes.forget()
        pause = POLL_CAP_S if changes.watching else 0.01
        while True:
            row = self.store.get(task_id)
            if row is not None and row.state == SUCCEEDED:
                return row.result
            if row is not None and row.state in ENDED_STATES:
                raise TaskFailed(
                    f"task {task_id} {row.state}: {row.error}",
                    error=row.error or row.state,
                    traceback=row.traceback or "",
                    state=row.state,
                )
            if deadline is not None and time.monotonic() >= deadline:
                state = "unknown (or its result expired)" if row is None else row.state
                raise ResultTimeoutError(f"task {task_id} is {state} after {timeout:g} s")
            # Watching and no write lately: wait for the next one (up to the safety net).
            wait = WATCHED_CAP_S if changes.watching and pause >= POLL_CAP_S else pause
            woken = changes.wait(
                wait if deadline is None else min(wait, deadline - time.monotonic())
            )
            # A write wakes this before its commit is visible (SQLite makes it visible
            # in shared memory after writing the WAL, and that is no file event): after
            # one, look again after 1, 2, 4, ... ms until the next write or the cap.
            pause = AFTER_WRITE_S if woken else min(pause * 2, POLL_CAP_S)

    def cancel(self, task_id: str) -> bool:
        """Cancel a task that has not started; True if it will never run. Its message is
        cancelled in the broker too (never delivered; a ``cancelled`` event records it);
        with no broker running, a worker that receives it later acknowledges it without
        running it."""
        return cancel_task(
            self.store, task_id, self.data, address=self.address, authkey=self.authkey
        )

    def _watcher(self) -> _Changes:
        changes: _Changes | None = getattr(self._local, "changes", None)
        if changes is None or changes.pid != os.getpid():  # new thread, or a forked child
            make_private_dirs(self.store.path.parent)  # as the store does: it is watched
            changes = self._local.changes = _Changes(self.store.path)
            with self._lock:
                self._watchers.append(changes)
        return changes

    def close(self) -> None:
        """Close this process's Publisher, result watches and ``tasks.db``; sending after
        this is an error (reading results still works, reopening ``tasks.db``)."""
        with self._lock:
            self._closed = True
            for changes in self._watchers:
                changes.close()
            self._watchers.clear()
            if self._publisher is not None and self._publisher_pid == os.getpid():
                self._publisher.close()
            self._publisher = None
        self.store.close()

    def __enter__(self) -> Tasks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cancel_task(
    store: ResultStore,
    task_id: str,
    data: Path,
    *,
    address: Address | None = None,
    authkey: bytes | None = None,
) -> bool:
    """Cancel a task that has not started (``Tasks.cancel``, ``spoolmq tasks cancel``):
    in ``tasks.db``, then its message in the broker, if one runs (else a worker that
    receives it acknowledges it without running it). True if it will never run."""
    if not store.cancel(task_id):
        return False
    position = store.position(task_id)
    if position is not None:
        topic, partition, offset = position
        try:
            with Admin(data, address=address, authkey=authkey) as admin:
                admin.cancel_message(topic, partition, offset, reason=f"task {task_id} cancelled")
        except BrokerUnavailableError:
            logger.info("no broker to cancel task %s in: a worker will drop it", task_id)
    return True


def task_message(
    task: Task[Any, Any], task_id: str, args: list[Any], kwargs: dict[str, Any], priority: int
) -> dict[str, Any]:
    """The message value a worker runs: the task's name, id, arguments, priority."""
    return {"task": task.name, "id": task_id, "args": args, "kwargs": kwargs, "priority": priority}
