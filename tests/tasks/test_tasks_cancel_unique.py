"""Cancelling a task before it starts (point 10: never delivered, a ``cancelled`` event)
and unique tasks (point 9)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tasks_helpers import count_marks

from event_shapes import events_of
from spoolmq.errors import TaskFailed
from spoolmq.testing import BrokerProcess, wait_until


def test_a_cancelled_task_never_runs(
    broker: BrokerProcess, app: ModuleType, start_worker: Any, marks: Path, data_dir: Path
) -> None:
    start_worker()
    cancelled = app.slow.send_with(args=["cancelled", 0], delay=2, key="k")
    assert cancelled.cancel() is True
    assert cancelled.cancel() is True  # asking again: still cancelled
    # Sent after it, with the same key: the broker delivers per key in order, so once
    # this one has run the broker has passed over the cancelled one.
    after = app.slow.send_with(args=["after", 0], delay=2, key="k")
    after.result(timeout=60)
    assert count_marks(marks, "cancelled") == []
    # Cancelled in the broker: never delivered, and the group's events say so.
    position = app.tasks.store.position(cancelled.id)
    assert position is not None
    topic, _, offset = position

    def of_it(kind: str) -> list[dict[str, Any]]:
        return [
            e for e in events_of(data_dir, kind) if (e["topic"], e["offset"]) == (topic, offset)
        ]

    (event,) = wait_until(lambda: of_it("cancelled"), 30, "the cancelled event")
    assert event["group"] == app.tasks.group and event["reason"] == f"task {cancelled.id} cancelled"
    assert of_it("delivered") == []
    with pytest.raises(TaskFailed) as failed:
        cancelled.result(timeout=5)
    assert failed.value.state == "cancelled"
    # A running or finished task cannot be cancelled.
    running = app.slow.send("running", 3)
    wait_until(lambda: count_marks(marks, "running"), 60, "the task to start")
    assert running.cancel() is False
    assert after.cancel() is False
    running.result(timeout=60)


def test_a_unique_task_sent_twice_in_its_window_is_one_task(
    broker: BrokerProcess, app: ModuleType, start_worker: Any
) -> None:
    start_worker()
    first = app.add.send_with(args=[1, 2], unique_for=60)
    second = app.add.send_with(args=[1, 2], unique_for=60)
    other = app.add.send_with(args=[2, 1], unique_for=60)
    assert second.id == first.id and second.created is False
    assert other.id != first.id
    # The same call however its arguments are passed (by name, a default given or not).
    by_name = app.add.send_with(kwargs={"b": 2, "a": 1}, unique_for=60)
    mixed = app.add.send_with(args=[1], kwargs={"b": 2}, unique_for=60)
    assert (by_name.id, mixed.id) == (first.id, first.id) and not by_name.created
    scaled = app.scaled.send_with(args=[3], unique_for=60)
    assert app.scaled.send_with(args=[3, 2], unique_for=60).id == scaled.id
    assert app.scaled.send_with(kwargs={"n": 3, "factor": 2}, unique_for=60).id == scaled.id
    assert app.scaled.send_with(args=[3, 3], unique_for=60).id != scaled.id
    keyed = app.add.send_with(args=[5, 5], unique_for=60, unique_key="report-7")
    again = app.add.send_with(args=[6, 6], unique_for=60, unique_key="report-7")
    assert again.id == keyed.id
    # A key names a call of its task: another task's send with it is its own task (it got
    # add's handle, and never ran).
    elsewhere = app.scaled.send_with(args=[4], unique_for=60, unique_key="report-7")
    assert elsewhere.id != keyed.id and elsewhere.created
    assert elsewhere.result(timeout=60) == 8
    assert first.result(timeout=60) == 3 and again.result(timeout=60) == 10
    assert len(app.tasks.store.recent(name="task_app.add")) == 3
    # The window closes: the same send is a new task.
    short = app.add.send_with(args=[7, 7], unique_for=0.5)
    wait_until(
        lambda: app.add.send_with(args=[7, 7], unique_for=0.5).id != short.id,
        30,
        "the unique window to close",
    )


def test_a_send_stands_when_where_its_message_is_cannot_be_recorded(
    broker: BrokerProcess,
    app: ModuleType,
    start_worker: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The message is stored before its position is written to tasks.db: a failure there
    is logged, not raised (the task runs; only a cancel could not reach the broker)."""

    def locked(*args: object) -> None:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(app.tasks.store, "set_position", locked)
    handle = app.add.send(1, 2)
    assert "could not record where its message is: database is locked" in caplog.text
    start_worker()
    assert handle.result(timeout=60) == 3
