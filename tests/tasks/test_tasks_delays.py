"""Delays that scale (point 12) with a real ``spoolmq worker`` process: tasks sent with a
delay past the broker's horizon are parked in state.db, not held in the broker's memory
(the group's committed offset passes them at once), and each runs once, not before its
time, also when the broker restarts while they wait."""

from __future__ import annotations

import time
from pathlib import Path
from types import ModuleType
from typing import Any

from spoolmq.broker.delivery import PARK_AFTER_MS
from spoolmq.store.state import StateDB
from spoolmq.testing import BrokerProcess, wait_until

DELAY_S = 3 * PARK_AFTER_MS / 1000  # read by the broker long before it is due, even when busy


def _parked_and_committed(data_dir: Path, group: str) -> tuple[int, int]:
    """(messages ``group`` has parked, its committed offsets summed) in state.db."""
    state = StateDB(data_dir / "state.db")
    try:
        committed = sum(state.committed_offsets(group, "t.math").values())
        return state.parked_counts().get(group, 0), committed
    finally:
        state.close()


def test_delayed_tasks_wait_outside_memory_and_run_once_on_time(
    broker: BrokerProcess, app: ModuleType, start_worker: Any, data_dir: Path
) -> None:
    start_worker("--processes", "1", "--concurrency", "4", "--topics", "t.math")
    warm = app.add.send(0, 0)  # the worker's group reads the topic before the delayed ones
    assert warm.result(timeout=120) == 0
    sent_ms = time.time_ns() // 1_000_000
    handles = [app.add.send_with(args=[i, 0], delay=DELAY_S + (i % 10) / 10) for i in range(40)]
    # All 40 out of the broker's memory: parked, the committed offset past them.
    wait_until(
        lambda: _parked_and_committed(data_dir, app.tasks.group) == (40, 41),
        60,
        "the delayed tasks to be parked",
    )
    broker.stop()
    broker.start()
    assert [h.result(timeout=120) for h in handles] == list(range(40))
    for i, handle in enumerate(handles):
        row = app.tasks.get(handle.id)
        assert row is not None and row.started_ms is not None
        assert row.started_ms >= sent_ms + (DELAY_S + (i % 10) / 10) * 1000
        assert row.attempts == 1  # ran once: not again from the log after the restart
    wait_until(
        lambda: _parked_and_committed(data_dir, app.tasks.group)[0] == 0,
        60,
        "their rows to be deleted",
    )
