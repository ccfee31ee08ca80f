"""What a worker process does with a task's life: heartbeats, death, time limits, stops,
concurrency (points 3 and 4), with real ``spoolmq worker`` processes and a real broker."""

from __future__ import annotations

import importlib
import os
import signal
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tasks_helpers import count_marks

import spoolmq.tasks.worker as worker_module
from spoolmq import Consumer
from spoolmq.errors import TaskFailed
from spoolmq.testing import BrokerProcess, process_alive, wait_until


def _running_in(app: ModuleType, task_id: str, marks: Path, name: str) -> int:
    """The pid of the worker process running the task, once the function itself runs (its
    mark), not only once a process claimed it: a process stopped between claiming the task
    and calling it never ran it at all."""
    pid = int(wait_until(lambda: count_marks(marks, name)[:1], 60, "the task to run")[0])
    row = app.tasks.get(task_id)
    assert row is not None and row.state == "running" and (row.worker or "").endswith(f":{pid}")
    return pid


def test_a_task_longer_than_its_lease_runs_once(
    broker: BrokerProcess, app: ModuleType, start_worker: Any, marks: Path
) -> None:
    # A 2 s lease and a 7 s task: without the heartbeat the broker would redeliver it to
    # the second process after 2 s and it would run twice.
    start_worker("--processes", "2", **{"TASKS_LEASE": "2"})
    handle = app.slow.send("long", 7)
    pid = handle.result(timeout=90)
    assert count_marks(marks, "long") == [str(pid)]
    row = app.tasks.get(handle.id)
    assert row is not None and row.attempts == 1


def test_a_dead_workers_task_is_redelivered_at_once(
    broker: BrokerProcess, app: ModuleType, start_worker: Any, marks: Path
) -> None:
    # A 120 s lease: a redelivery within the 60 s bound below came from the death, not
    # from the lease running out.
    start_worker("--processes", "2", TASKS_LEASE="120")
    handle = app.slow.send("victim", 3)
    victim = _running_in(app, handle.id, marks, "victim")
    os.kill(victim, signal.SIGKILL)
    survivor = handle.result(timeout=60)
    assert survivor != victim
    runs = count_marks(marks, "victim")
    assert runs[0] == str(victim) and runs[-1] == str(survivor) and len(runs) == 2
    row = app.tasks.get(handle.id)
    assert row is not None and row.attempts == 2


def test_worker_processes_stop_when_their_supervisor_is_killed(
    broker: BrokerProcess, app: ModuleType, start_worker: Any, marks: Path
) -> None:
    """A supervisor killed with SIGKILL cannot stop its processes: they went on taking
    tasks, with nothing to stop them but a kill by pid. Now each stops as on SIGTERM:
    it finishes the task in hand, then exits."""
    worker = start_worker("--processes", "1")
    handle = app.slow.send("orphan", 3)
    child = _running_in(app, handle.id, marks, "orphan")
    try:
        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.wait(30)
        assert handle.result(timeout=60) == child  # the task in hand was finished
        wait_until(lambda: not process_alive(child) or None, 60, "the orphaned worker to exit")
    finally:
        if process_alive(child):
            os.kill(child, signal.SIGKILL)
    row = app.tasks.get(handle.id)
    assert row is not None and (row.state, row.attempts) == ("succeeded", 1)


def test_a_time_limit_fails_the_attempt_and_replaces_the_process(
    broker: BrokerProcess, app: ModuleType, start_worker: Any, marks: Path
) -> None:
    worker = start_worker("--processes", "1")
    handle = app.stuck.send("stuck")
    with pytest.raises(TaskFailed, match="TimeLimitExceeded: ran more than 1 s"):
        handle.result(timeout=60)
    stuck_pid = int(count_marks(marks, "stuck")[0])
    # The next task runs in the process that replaced the stuck one.
    assert app.worker_pid.send().result(timeout=60) != stuck_pid
    assert f"worker process {stuck_pid} exited with 75" in worker.log_text()
    # An async task past its limit is cancelled in place: the process stays.
    before = app.worker_pid.send().result(timeout=60)
    with pytest.raises(TaskFailed, match="TimeLimitExceeded"):
        app.async_stuck.send().result(timeout=60)
    assert app.worker_pid.send().result(timeout=60) == before


def test_sigterm_lets_the_running_task_finish(
    broker: BrokerProcess, app: ModuleType, start_worker: Any, marks: Path
) -> None:
    worker = start_worker()
    handle = app.slow.send("graceful", 3)
    _running_in(app, handle.id, marks, "graceful")
    assert worker.stop() == 0
    row = app.tasks.get(handle.id)
    assert row is not None and row.state == "succeeded" and row.attempts == 1
    assert len(count_marks(marks, "graceful")) == 1


def test_async_tasks_run_concurrently_in_one_process(
    broker: BrokerProcess, app: ModuleType, start_worker: Any
) -> None:
    start_worker("--processes", "1", "--concurrency", "4")
    handles = [app.async_span.send(3) for _ in range(4)]
    spans = [h.result(timeout=90) for h in handles]
    # All four were running at one moment: the last start is before the first end.
    assert max(start for start, _ in spans) < min(end for _, end in spans)


def test_a_stop_hands_back_a_task_that_does_not_finish_in_time(
    broker: BrokerProcess, app: ModuleType, start_worker: Any, marks: Path
) -> None:
    first = start_worker("--shutdown-timeout", "1")
    handle = app.slow.send("handed", 6)
    stopped_pid = _running_in(app, handle.id, marks, "handed")
    assert first.stop() == 0
    row = app.tasks.get(handle.id)
    assert row is not None and row.state == "retrying" and "handed back" in (row.error or "")
    # Another worker gets it at once and runs it to the end.
    start_worker()
    assert handle.result(timeout=90) != stopped_pid
    assert len(count_marks(marks, "handed")) == 2


def test_sigterm_stops_a_worker_whose_broker_has_gone(
    broker: BrokerProcess, app: ModuleType, start_worker: Any
) -> None:
    """A worker waiting to reconnect to a stopped broker still stops on SIGTERM at once,
    not after its reconnect timeout (60 s) or the parent's kill (shutdown timeout + 15 s)."""
    worker = start_worker()
    app.worker_pid.send().result(timeout=60)  # the worker is connected and serving
    assert broker.stop() == 0
    # The broker has gone for the worker too: its connection saw the end.
    wait_until(lambda: "lost the broker" in worker.log_text(), 60, "the worker to see the loss")
    started = time.monotonic()
    assert worker.stop() == 0
    took = time.monotonic() - started
    assert "did not stop" not in worker.log_text()
    assert took < 15, f"the worker took {took:.1f} s to stop"


def test_the_worker_loop_sleeps_while_a_task_runs(
    broker: BrokerProcess, app: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a task without a time limit runs, the loop waits for it to finish (its
    done-callback wakes the loop) or for the next look at the stop flag (0.5 s), not in
    short steps; a task with a limit is stopped at it (the test above)."""
    waits: list[float] = []

    class CountingConsumer(Consumer):
        def receive(self, timeout: float | None = None) -> Any:
            waits.append(-1.0 if timeout is None else timeout)
            return super().receive(timeout)

    monkeypatch.setattr(worker_module, "Consumer", CountingConsumer)
    # Room for two: the loop waits in receive() while the one task runs.
    worker = worker_module.WorkerProcess(app.tasks, ["t.slow"], concurrency=2)
    loop = threading.Thread(target=worker.run)
    loop.start()
    try:
        handle = app.slow.send("sleepy", 3)
        wait_until(lambda: waits, 60, "the loop to wait for a message")
        started = time.monotonic()
        assert handle.result(timeout=60) == os.getpid()
        ran = time.monotonic() - started
    finally:
        worker.stopping.set()
        loop.join(60)
    assert not loop.is_alive()
    short = [w for w in waits if 0 <= w < 0.4]
    # 3 s of running: one look at the stop flag each 0.5 s is ~6; steps of 50 ms were 60.
    assert ran >= 2.5 and len(short) <= 4, f"{len(waits)} waits, {len(short)} short: {waits}"


def test_a_process_being_replaced_hands_back_what_was_pushed_ahead(
    broker: BrokerProcess, app: ModuleType, start_worker: Any, marks: Path
) -> None:
    # Two at a time and a 2 s lease. A stuck thread past its time limit has the process
    # replaced once its other task (6 s) is done; the slot the stuck one freed is pushed
    # a third task meanwhile. That one must go back at once, not wait out its lease behind
    # the replacement (each lapse an attempt: three, and the message went to the DLQ).
    start_worker("--processes", "1", "--concurrency", "2", TASKS_LEASE="2")
    stuck = app.stuck.send("pushed-stuck")
    long = app.slow.send("pushed-long", 6)
    wait_until(
        lambda: count_marks(marks, "pushed-stuck") and count_marks(marks, "pushed-long"),
        60,
        "both running",
    )
    stuck_pid = int(count_marks(marks, "pushed-stuck")[0])
    behind = app.worker_pid.send()
    assert behind.result(timeout=90) != stuck_pid
    row = app.tasks.get(behind.id)
    assert row is not None and row.attempts == 1
    assert long.result(timeout=60) == stuck_pid
    with pytest.raises(TaskFailed, match="TimeLimitExceeded"):
        stuck.result(timeout=5)


def test_a_task_no_worker_knows_ends_dead_lettered_and_says_why(
    broker: BrokerProcess, app: ModuleType, start_worker: Any, data_dir: Path
) -> None:
    # Declared in this process only: the workers' task_app has no such task, so each NACKs
    # it (backoff 1, 2, 4, 8 s) until the broker dead-letters it after 5 deliveries.
    @app.tasks.task(name="task_app.renamed_since", topic="t.math")
    def renamed_since() -> int:
        return 1

    start_worker("--processes", "1")
    handle = renamed_since.send()
    with pytest.raises(TaskFailed) as failure:
        handle.result(timeout=120)
    assert failure.value.state == "dead_lettered"
    assert "dead-lettered to t.math.dlq after 5 deliveries" in failure.value.error
    assert "unknown task 'task_app.renamed_since'" in failure.value.error
    # The letter itself stays for an operator to look at (and to replay).
    from spoolmq import Store
    from spoolmq.operations import dead_letters

    with Store(data_dir) as store:
        letters = dead_letters(store, "t.math")
    assert [letter.record.value["id"] for letter in letters] == [handle.id]


def test_workers_split_by_topics_share_the_group(
    broker: BrokerProcess,
    app: ModuleType,
    start_worker: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # t.extra allows 7 deliveries, t.math's tasks 5: a worker serving only t.math once
    # asked the group for 5 and one serving t.extra for 7, and the second was refused.
    monkeypatch.setenv("TASKS_EXTRA", "1")
    extra_app = importlib.reload(app)
    math = start_worker("--topics", "t.math", "--no-scheduler")
    assert extra_app.add.send(1, 2).result(timeout=60) == 3
    extra = start_worker("--topics", "t.extra", "--no-scheduler")
    assert extra_app.extra.send().result(timeout=60) == "extra"
    assert math.process.poll() is None and extra.process.poll() is None


def test_a_worker_whose_settings_the_group_refuses_says_why_and_joins_once_it_can(
    broker: BrokerProcess, app: ModuleType, start_worker: Any
) -> None:
    first = start_worker("--no-scheduler", TASKS_LEASE="30")
    assert app.add.send(1, 2).result(timeout=60) == 3  # its group runs with a 30 s lease
    other = start_worker("--no-scheduler", TASKS_LEASE="2")
    wait_until(lambda: "could not join group" in other.log_text(), 60, "the refusal")
    log = other.log_text()
    assert "already runs with other settings" in log and "Tasks(group=...)" in log
    assert first.process.poll() is None and other.process.poll() is None
    # As in a rolling upgrade: the old workers leave and the new settings' worker joins.
    assert first.stop() == 0
    assert app.worker_pid.send().result(timeout=90) != first.process.pid
