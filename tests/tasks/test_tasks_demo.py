"""The tasks part of ``spoolmq demo`` (point 11), on a real broker and worker process."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from spoolmq.tasks.demo import run_tasks_demo
from spoolmq.testing import BrokerProcess


def test_the_tasks_demo_shows_results_a_failure_a_cancel_priorities_and_ticks(
    broker: BrokerProcess, data_dir: Path
) -> None:
    out = io.StringIO()
    figures = run_tasks_demo(data_dir, Console(file=out, width=200))
    # 8 resizes + a thumbnail + a checksum + the unique resize succeed; the .bmp fails;
    # the delayed one was cancelled.
    assert figures["states"] == {"succeeded": 11, "failed": 1, "cancelled": 1}
    assert figures["ticks"] >= 1
    text = out.getvalue()
    assert "ValueError: b.bmp: unsupported format" in text
    assert "sent twice: one task" in text
    # Sent after img0 and before img4 and the others, yet the priority-9 resizes start
    # first: the worker claims them (in the order the broker sent them) before any other.
    started = figures["started_at"]
    urgent = [started[f"resize img{i}.jpg (priority 9)"] for i in (0, 4)]
    others = [started[f"resize img{i}.jpg (priority 0)"] for i in (1, 2, 3, 5, 6, 7)]
    assert max(urgent) <= min(others), started
