"""How ``Tasks.result`` waits: woken by the write of the result to ``tasks.db`` (inotify on
its directory), not by a timer; polling where inotify is not available; no descriptor
left behind per call.

No broker is needed: the task's row is added and finished through ``ResultStore`` as a
sender and a worker do, the finish through a connection of its own, as another process's.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from spoolmq.errors import ResultTimeoutError
from spoolmq.inotify import open_inotify
from spoolmq.tasks import Tasks
from spoolmq.tasks import app as app_module
from spoolmq.tasks.results import SUCCEEDED, ResultStore


def _add(tasks: Tasks, task_id: str) -> None:
    tasks.store.add(
        task_id,
        name="work",
        topic="tasks",
        args={"args": [], "kwargs": {}},
        key=None,
        priority=0,
        eta_ms=None,
        result_ttl_ms=None,
    )


def _finish_once_waiting(data: Path, task_id: str, waiting: threading.Event) -> threading.Thread:
    """A 'worker' that records the result once the reader is inside a wait."""

    def finish() -> None:
        assert waiting.wait(60)
        worker_store = ResultStore(data)
        try:
            worker_store.finish(task_id, SUCCEEDED, result={"answer": 42})
        finally:
            worker_store.close()

    thread = threading.Thread(target=finish, daemon=True)
    thread.start()
    return thread


def _signal_waits(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    waiting = threading.Event()
    real_wait = app_module._Changes.wait

    def wait(self: Any, seconds: float) -> bool:
        waiting.set()
        return bool(real_wait(self, seconds))

    monkeypatch.setattr(app_module._Changes, "wait", wait)
    return waiting


@pytest.mark.skipif(open_inotify() is None, reason="inotify is Linux's")
def test_a_result_wakes_the_waiter_when_it_is_written_not_on_a_timer(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each wait for a write may last 10 minutes: only the write's own wake-up can end
    # this one within the 60 s the test gives it.
    monkeypatch.setattr(app_module, "WATCHED_CAP_S", 600.0)
    waiting = _signal_waits(monkeypatch)
    with Tasks(data_dir) as tasks:
        assert tasks._watcher().watching  # else it would poll, and prove nothing here
        _add(tasks, "t-wake")
        finisher = _finish_once_waiting(data_dir, "t-wake", waiting)
        results: list[Any] = []
        reader = threading.Thread(
            target=lambda: results.append(tasks.result("t-wake")), daemon=True
        )
        reader.start()
        reader.join(60)
        assert results == [{"answer": 42}], "result() was not woken by the write"
        finisher.join(30)


def test_without_inotify_a_result_is_found_by_polling(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app_module, "open_inotify", lambda: None)
    waiting = _signal_waits(monkeypatch)
    with Tasks(data_dir) as tasks:
        _add(tasks, "t-poll")
        finisher = _finish_once_waiting(data_dir, "t-poll", waiting)
        assert tasks.result("t-poll", timeout=60) == {"answer": 42}
        finisher.join(30)
        _add(tasks, "t-never")
        with pytest.raises(ResultTimeoutError, match=r"t-never is queued after 0\.2 s"):
            tasks.result("t-never", timeout=0.2)


def _inotify_descriptors() -> int:
    fds = Path("/proc/self/fd")
    found = 0
    for fd in fds.iterdir():
        try:
            found += os.readlink(fd) == "anon_inode:inotify"
        except FileNotFoundError:  # the listing's own descriptor, closed since
            continue
    return found


@pytest.mark.skipif(open_inotify() is None, reason="inotify is Linux's")
def test_waiting_many_times_keeps_one_watch_per_thread_until_close(data_dir: Path) -> None:
    at_start = _inotify_descriptors()
    with Tasks(data_dir) as tasks:
        _add(tasks, "t-done")
        _add(tasks, "t-open")
        worker_store = ResultStore(data_dir)
        worker_store.finish("t-done", SUCCEEDED, result=1)
        worker_store.close()
        for _ in range(50):
            assert tasks.result("t-done", timeout=5) == 1
            with pytest.raises(ResultTimeoutError):
                tasks.result("t-open", timeout=0.01)
        assert _inotify_descriptors() == at_start + 1
        other = threading.Thread(target=lambda: tasks.result("t-done", timeout=5))
        other.start()
        other.join(30)
        assert _inotify_descriptors() == at_start + 2  # the other thread's own watch
    assert _inotify_descriptors() == at_start


def test_a_dead_lettered_task_ends_for_result_and_runs_again_when_redriven(
    data_dir: Path,
) -> None:
    from spoolmq.tasks.results import ResultStore

    store = ResultStore(data_dir)
    try:
        row = {"name": "jobs.x", "topic": "jobs", "args": {"args": [], "kwargs": {}}}
        store.add("t1", **row, key=None, priority=0, eta_ms=None, result_ttl_ms=60_000)
        store.claim("t1", 1, "w:1", row)
        assert store.dead_lettered("t1", "dead-lettered to jobs.dlq after 5 deliveries: x")
        ended = store.get("t1")
        assert ended is not None and ended.state == "dead_lettered"
        assert ended.error == "dead-lettered to jobs.dlq after 5 deliveries: x"
        assert ended.expires_ms is not None  # kept as long as a result
        # A replayed letter reaches a worker: the task runs again, its row unexpired.
        assert store.claim("t1", 1, "w:2", row) == "dead_lettered"
        again = store.get("t1")
        assert again is not None and again.state == "running" and again.expires_ms is None
        # A task that ended otherwise stays as it ended.
        store.finish("t1", "succeeded", result=3)
        assert not store.dead_lettered("t1", "late letter")
        done = store.get("t1")
        assert done is not None and done.state == "succeeded" and done.result == 3
        assert not store.dead_lettered("unknown-id", "no row")
    finally:
        store.close()


def test_a_cancel_says_whether_the_task_had_run(data_dir: Path) -> None:
    """A task waiting for its retry was recorded "cancelled before it started", though
    its first attempt had run."""
    from spoolmq.tasks.results import ResultStore

    store = ResultStore(data_dir)
    try:
        row = {"name": "jobs.x", "topic": "jobs", "args": {"args": [], "kwargs": {}}}
        for task_id in ("fresh", "retried"):
            store.add(task_id, **row, key=None, priority=0, eta_ms=None, result_ttl_ms=60_000)
        store.claim("retried", 1, "w:1", row)
        store.finish("retried", "retrying", error="ValueError: x", traceback="...")
        assert store.cancel("fresh") and store.cancel("retried")
        fresh, retried = store.get("fresh"), store.get("retried")
        assert fresh is not None and fresh.error == "cancelled before it started"
        assert retried is not None and retried.error == "cancelled while waiting for a retry"
        assert (fresh.state, retried.state) == ("cancelled", "cancelled")
    finally:
        store.close()
