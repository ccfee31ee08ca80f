"""Priorities (point 7) with a real ``spoolmq worker`` process and a real broker: a
priority-9 task sent after a backlog runs before all of it but what the worker holds."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from tasks_helpers import count_marks

from spoolmq import Admin
from spoolmq.testing import BrokerProcess, wait_until


def _read_by_broker(data_dir: Path, group: str, topic: str) -> int:
    """Messages of ``topic`` the ConsumerBroker knows were stored, for ``group``."""
    with Admin(data_dir) as admin:
        rows = admin.describe_groups().get(group, {}).get("partitions", [])
    return sum(row["log_end_offset"] for row in rows if row["topic"] == topic)


def test_a_priority_task_runs_before_a_backlog_of_priority_0(
    broker: BrokerProcess,
    app: ModuleType,
    start_worker: Any,
    marks: Path,
    data_dir: Path,
    tmp_path: Path,
) -> None:
    # One process, one task at a time: while the gate task runs, the worker holds its one
    # delivery and has room for nothing else, so the backlog waits in the broker.
    start_worker("--processes", "1", "--concurrency", "1", "--topics", "t.order")
    opened = tmp_path / "open"
    gate = app.gate.send(str(opened))

    def gate_running() -> bool:
        row = app.tasks.get(gate.id)
        return row is not None and row.state == "running"

    wait_until(gate_running, 60, "the gate task to run")
    backlog = [app.in_order.send("order", f"low{i}") for i in range(300)]
    urgent = app.in_order.send_with(args=["order", "urgent"], priority=9)
    wait_until(
        lambda: _read_by_broker(data_dir, app.tasks.group, "t.order") == 302,
        60,
        "the broker to know of every task sent",
    )
    opened.touch()
    for handle in [gate, urgent, *backlog]:
        handle.result(timeout=120)
    order = count_marks(marks, "order")
    assert order[0] == "urgent"
    assert sorted(order[1:]) == sorted(f"low{i}" for i in range(300))
