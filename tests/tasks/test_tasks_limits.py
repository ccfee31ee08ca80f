"""Rate and concurrency limits per task (point 8), across every worker process: the
broker applies them to the task's topic, so two worker processes of four concurrent tasks
each still run a ``rate_limit="5/s"`` task at most 5 times in any second and a
``concurrency=2`` task at most twice at once."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from tasks_helpers import count_marks

from event_shapes import events_of
from spoolmq.testing import BrokerProcess, wait_until


def _delivered_at(data_dir: Path, topic: str) -> list[int]:
    """When the broker sent each delivery of ``topic`` (its events, ms)."""
    return sorted(e["ts"] for e in events_of(data_dir, "delivered") if e["topic"] == topic)


def test_a_rate_limit_holds_across_worker_processes(
    broker: BrokerProcess, app: ModuleType, start_worker: Any, data_dir: Path
) -> None:
    start_worker("--processes", "2", "--concurrency", "4", "--topics", "t.rate")
    handles = [app.paced.send(i) for i in range(20)]
    assert [h.result(timeout=120) for h in handles] == list(range(20))
    sent = wait_until(
        lambda: (times := _delivered_at(data_dir, "t.rate")) and len(times) >= 20 and times,
        60,
        "the broker's delivery events",
    )
    # Never more than 5 in any one-second window, by the broker's clock...
    assert all(sum(1 for t in sent if start <= t < start + 1000) <= 5 for start in sent)
    # ... and the worker processes saw it: 20 runs at 5 per second took 3 s and more.
    rows = [app.tasks.get(h.id) for h in handles]
    starts = sorted(row.started_ms for row in rows if row is not None and row.started_ms)
    assert len(starts) == 20 and starts[-1] - starts[0] >= 2_500


def test_a_concurrency_cap_holds_across_worker_processes(
    broker: BrokerProcess, app: ModuleType, start_worker: Any, marks: Path
) -> None:
    start_worker("--processes", "2", "--concurrency", "4", "--topics", "t.capped")
    handles = [app.capped.send("spans", 0.3) for _ in range(8)]
    for handle in handles:
        handle.result(timeout=120)
    spans = [tuple(map(float, line.split(","))) for line in count_marks(marks, "spans")]
    assert len(spans) == 8
    # At any run's start, how many runs were going on (itself included): never above 2.
    running = [sum(1 for s, e in spans if s <= start < e) for start, _ in spans]
    assert max(running) <= 2, spans
    # Eight runs of 0.3 s, two at a time: at least four rounds.
    assert max(e for _, e in spans) - min(s for s, _ in spans) >= 4 * 0.3
