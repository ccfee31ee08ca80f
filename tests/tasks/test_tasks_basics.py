"""Tasks sent, run by a real ``spoolmq worker`` and their results read back (points 2, 3, 5)."""

from __future__ import annotations

import sqlite3
import stat
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tasks_helpers import count_marks

from spoolmq.errors import (
    InvalidArgumentError,
    ResultTimeoutError,
    SerializationError,
    SpoolError,
    TaskFailed,
)
from spoolmq.tasks import Tasks
from spoolmq.testing import BrokerProcess, wait_until


def test_results_of_plain_and_async_tasks(
    broker: BrokerProcess, app: ModuleType, start_worker: Any
) -> None:
    start_worker("--processes", "2", "--concurrency", "2")
    handles = [
        app.add.send(2, 3),
        app.async_add.send(a=4, b=5),
        app.add.send_with(args=[1], kwargs={"b": 1}),
    ]
    assert [h.result(timeout=60) for h in handles] == [5, 9, 2]
    row = app.tasks.get(handles[0].id)
    assert row is not None and row.state == "succeeded" and row.attempts == 1
    assert row.args == {"args": [2, 3], "kwargs": {}}


def test_a_failure_carries_the_remote_error_and_traceback(
    broker: BrokerProcess, app: ModuleType, start_worker: Any
) -> None:
    worker = start_worker()
    handle = app.boom.send("no such address")
    with pytest.raises(TaskFailed) as failed:
        handle.result(timeout=60)
    assert failed.value.error == "ValueError: no such address"
    assert "raise ValueError(text)" in failed.value.traceback
    row = app.tasks.get(handle.id)
    assert row is not None and row.state == "failed" and row.attempts == 2  # max_deliveries=2
    # Each failed attempt is logged with its traceback.
    log = wait_until(
        lambda: worker.log_text().count("ValueError: no such address") >= 2 and worker.log_text(),
        30,
        "the log",
    )
    assert "attempt 1 of 2; will retry" in log and "Traceback (most recent call last)" in log


def test_a_result_that_is_not_json_fails_the_task_without_running_it_again(
    broker: BrokerProcess, app: ModuleType, start_worker: Any, marks: Path
) -> None:
    """The function ran to its end: a retry would repeat its effects for a result that
    can never be stored (it ran max_deliveries times)."""
    start_worker()
    handle = app.not_json.send()
    with pytest.raises(TaskFailed, match="cannot travel as JSON"):
        handle.result(timeout=60)
    row = app.tasks.get(handle.id)
    assert row is not None and (row.state, row.attempts) == ("failed", 1)
    assert len(count_marks(marks, "not_json")) == 1


def test_arguments_json_cannot_carry_are_refused_at_send(data_dir: Path, app: ModuleType) -> None:
    # No broker is needed to be told: nothing is stored, no row is made.
    with pytest.raises(SerializationError, match=r"args\[0\]: a datetime"):
        app.add.send(datetime.now(), 1)
    with pytest.raises(SerializationError, match=r"kwargs\['b'\]\[0\]: a set"):
        app.add.send(1, b=[{1}])
    with pytest.raises(SerializationError, match="key 1 is a int"):
        app.add.send(1, {1: 2})
    with pytest.raises(SerializationError, match="nan"):
        app.add.send(float("nan"), 1)
    assert not (data_dir / "tasks.db").exists() or app.tasks.store.recent() == []


def test_arguments_the_function_cannot_take_are_refused_at_send(
    data_dir: Path, app: ModuleType
) -> None:
    """A call the worker could only fail (after every retry) is refused before anything is
    stored, as calling the function here would be."""
    for send, wrong in [
        (lambda: app.add.send(1, 2, bogus=3), "unexpected keyword argument 'bogus'"),
        (lambda: app.add.send(1), "missing a required argument: 'b'"),
        (lambda: app.add.send(1, 2, 3), "too many positional arguments"),
        (lambda: app.async_add.send_with(args=[1], kwargs={"a": 2}), "multiple values"),
    ]:
        with pytest.raises(InvalidArgumentError, match="cannot take these arguments") as refused:
            send()
        assert wrong in str(refused.value)
    assert not (data_dir / "tasks.db").exists() or app.tasks.store.recent() == []


def test_the_signature_checked_is_the_functions_own(data_dir: Path) -> None:
    """A functools.wraps decorator that supplies an argument takes fewer than the function
    it wraps: its own signature is checked. A periodic job's arguments are checked when it
    is declared (each tick would fail). A value JSON cannot carry stays a
    SerializationError, whatever the signature says."""
    import functools

    tasks = Tasks(data_dir)

    def with_session(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return fn("session", *args, **kwargs)

        return wrapper

    @tasks.task
    @with_session
    def uses_session(session: str, x: int) -> str:
        return f"{session}:{x}"

    @tasks.task
    def pair(a: int, b: int) -> int:
        return a + b

    uses_session.check_call([1], {})  # what calling it here takes
    assert uses_session(1) == "session:1"
    with pytest.raises(InvalidArgumentError, match="missing a required argument: 'b'"):
        tasks.periodic("* * * * *", pair, args=[1])
    assert tasks.periodics == {}
    with pytest.raises(SerializationError):
        pair.send_with(kwargs={1: 2})  # type: ignore[dict-item]
    tasks.close()


def test_bad_declarations_and_options_are_refused(data_dir: Path) -> None:
    tasks = Tasks(data_dir)

    def f() -> None: ...

    with pytest.raises(InvalidArgumentError, match="a rate limit is a whole number"):
        tasks.task(rate_limit="fast")(f)
    with pytest.raises(InvalidArgumentError, match="a rate limit is a whole number"):
        tasks.task(rate_limit="2.5/s")(f)
    with pytest.raises(InvalidArgumentError, match="concurrency"):
        tasks.task(concurrency=0)(f)
    with pytest.raises(InvalidArgumentError, match="priority"):
        tasks.task(priority=10)(f)
    declared = tasks.task(rate_limit="50/s", priority=3)(f)
    assert declared.priority == 3
    # A task with limits gets a topic of its own: the broker limits topics.
    assert declared.topic == (
        "tasks.test_tasks_basics.test_bad_declarations_and_options_are_refused._locals_.f"
    )
    assert tasks.limits() == {declared.topic: {"rate": "50/s"}}
    tasks.task(topic="shared", name="plain")(f)
    with pytest.raises(InvalidArgumentError, match="share topic 'shared'"):
        tasks.task(topic="shared", name="capped", concurrency=2)(f)
    with pytest.raises(InvalidArgumentError, match="already declared"):
        tasks.task(f)
    with pytest.raises(InvalidArgumentError, match="priority"):
        declared.send_with(priority=-1)
    with pytest.raises(InvalidArgumentError, match="cron"):
        tasks.periodic("every now and then", declared)
    with pytest.raises(InvalidArgumentError, match="time zone"):
        tasks.periodic("* * * * *", declared, tz="Mars/Olympus")


def test_results_outlive_a_broker_restart_and_expire_after_their_ttl(
    broker: BrokerProcess, app: ModuleType, start_worker: Any, data_dir: Path
) -> None:
    start_worker()
    kept = app.add.send_with(args=[20, 22], priority=9)
    brief = app.short_lived.send()
    assert kept.result(timeout=60) == 42
    assert brief.result(timeout=60) == "soon gone"
    broker.stop()
    # Another process's view (a fresh Tasks on the directory) while the broker is down.
    reader = Tasks(data_dir)
    assert reader.result(kept.id, timeout=5) == 42
    row = reader.get(kept.id)
    assert row is not None and row.priority == 9
    broker.start()
    assert reader.result(kept.id, timeout=5) == 42
    # result_ttl=1: gone from every reader once it has passed.
    wait_until(lambda: reader.get(brief.id) is None, 30, "the short-lived result to expire")
    with pytest.raises(ResultTimeoutError):
        reader.result(brief.id, timeout=0.2)
    mode = stat.S_IMODE((data_dir / "tasks.db").stat().st_mode)
    assert mode == 0o600
    with sqlite3.connect(data_dir / "tasks.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    reader.close()


def test_arguments_that_do_not_fit_fail_the_task_not_the_worker(
    broker: BrokerProcess, app: ModuleType, start_worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """send() refuses such a call; a sender with another version of the function (here: no
    signature to check against) can still send one, and the worker must survive it."""
    start_worker()
    for task in (app.add, app.async_add):
        monkeypatch.setattr(task, "signature", None)
        with pytest.raises(TaskFailed, match="TypeError"):
            task.send(1, 2, 3).result(timeout=60)
    assert app.add.send(1, 2).result(timeout=60) == 3  # the same worker goes on


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retry_backoff": -1}, "retry_backoff must be a finite number of seconds, 0 or more"),
        ({"retry_backoff_max": -5.0}, "retry_backoff_max must be a finite number"),
        ({"retry_backoff": float("nan")}, "retry_backoff must be a finite number"),
        ({"time_limit": "30"}, "time_limit must be a finite number of seconds, more than 0"),
        ({"time_limit": 0}, "time_limit must be a finite number of seconds, more than 0"),
        ({"max_deliveries": "5"}, "max_deliveries must be a whole number from 1 to 1000"),
        ({"max_deliveries": 2.0}, "max_deliveries must be a whole number"),
        ({"result_ttl": float("inf")}, "result_ttl must be a finite number"),
    ],
)
def test_task_options_of_the_wrong_kind_are_refused_at_declaration(
    data_dir: Path, options: dict[str, Any], message: str
) -> None:
    tasks = Tasks(data_dir)
    try:
        with pytest.raises(InvalidArgumentError, match=message):
            tasks.task(**options)(lambda: None)
        assert tasks.registry == {}
    finally:
        tasks.close()


def test_tasks_settings_of_the_wrong_kind_are_refused(data_dir: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="lease must be a finite number"):
        Tasks(data_dir, lease="30")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="lease must be a finite number"):
        Tasks(data_dir, lease=0)
    with pytest.raises(InvalidArgumentError, match="lease must be at most 31536000000 seconds"):
        Tasks(data_dir, lease=1e30)
    with pytest.raises(InvalidArgumentError, match="group must be a non-empty name"):
        Tasks(data_dir, group="")


def test_send_options_of_the_wrong_kind_are_refused_before_anything_is_stored(
    broker: BrokerProcess, data_dir: Path, app: ModuleType
) -> None:
    refused: list[tuple[dict[str, Any], str]] = [
        ({"args": "12"}, "args must be a list or tuple .* not str '12'"),
        ({"args": [1, 2], "kwargs": [("a", 1)]}, "kwargs must be a mapping .* not list"),
        ({"args": [1, 2], "delay": "soon"}, "delay must be a finite number of seconds"),
        ({"args": [1, 2], "delay": float("nan")}, "delay must be a finite number"),
        ({"args": [1, 2], "delay": float("inf")}, "delay must be a finite number"),
        ({"args": [1, 2], "unique_for": 60, "unique_key": 7}, "unique_key must be text"),
        # Past what tasks.db's 64-bit times hold: an OverflowError from SQLite before.
        ({"args": [1, 2], "delay": 1e30}, "delay must be at most 31536000000 seconds"),
        ({"args": [1, 2], "unique_for": 1e30}, "unique_for must be at most 31536000000"),
        ({"args": [1, 2], "delay": timedelta(days=999_999_999)}, "delay must be at most"),
    ]
    for options, message in refused:
        with pytest.raises(InvalidArgumentError, match=message):
            app.add.send_with(**options)
    assert app.tasks.store.recent() == []  # nothing of them recorded
    with pytest.raises(InvalidArgumentError, match="timeout must be a finite number"):
        app.add.send(1, 2).result(timeout=-1)
    app.tasks.close()
    with pytest.raises(SpoolError, match="these Tasks are closed"):
        app.add.send(1, 2)
