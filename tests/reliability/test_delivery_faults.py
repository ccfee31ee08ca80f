"""Points 2-4: a consumer killed mid-task, a consumer too slow for its lease, a poison
message. Each message ends with exactly one final outcome (one ACK, or the DLQ)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fault_workers
import orjson
import pytest
from fault_checks import pid_alive, start_process, stop_processes

from event_shapes import per_message
from spoolmq import Consumer, Publisher, Store
from spoolmq.client.consumer import ReceivedMessage
from spoolmq.errors import LeaseExpiredError
from spoolmq.testing import BrokerProcess, wait_until


def delivery_events(data_dir: Path, topic: str, offset: int) -> list[dict[str, Any]]:
    """The events/ records of one message, oldest first (read after the broker stopped)."""
    events = []
    for path in sorted((data_dir / "events").rglob("*.jsonl")):
        lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
        for event in per_message(lines):
            if event.get("topic") == topic and event.get("offset") == offset:
                events.append(event)
    return sorted(events, key=lambda e: e["ts"])


def wait_for_file(path: Path, timeout: float) -> str:
    wait_until(path.exists, timeout, str(path))  # another process writes it (whole)
    return path.read_text()


def test_consumer_killed_mid_task_is_redelivered_at_once(
    broker: BrokerProcess, data_dir: Path, tmp_path: Path, figure: Callable[[str], None]
) -> None:
    lease = 300.0  # far longer than the test: only the disconnect can free the message
    with Publisher(data=data_dir) as pub:
        stored = pub.publish("tasks", {"job": 1})
    out = tmp_path / "taken"
    worker = start_process(
        fault_workers.take_one_and_hang, str(data_dir), "tasks", "g", str(out), lease
    )
    try:
        offset, attempt = map(int, wait_for_file(out, 60).split())
        assert (offset, attempt) == (stored.offset, 1)
        with Consumer("tasks", group="g", data=data_dir, lease=lease) as other:
            assert other.receive(timeout=0.5) is None  # still leased to the worker
            worker.kill()  # SIGKILL, mid-task
            killed = time.monotonic()
            message = other.receive(timeout=60)
            waited = time.monotonic() - killed
            assert message is not None
            assert (message.offset, message.attempt) == (stored.offset, 2)
            message.ack()
            assert other.receive(timeout=1.0) is None
    finally:
        stop_processes([worker], timeout=5)
    broker.stop()
    events = delivery_events(data_dir, "tasks", stored.offset)
    kinds = [e["type"] for e in events]
    assert kinds.count("acked") == 1
    assert kinds.count("delivered") == 2
    assert [e["attempt"] for e in events if e["type"] == "delivered"] == [1, 2]
    figure(
        f"redelivered {waited:.2f} s after the SIGKILL (lease {lease:.0f} s); "
        f"attempt 1 -> 2; final ACKs: {kinds.count('acked')}"
    )
    assert waited < lease / 2


def test_late_ack_after_lease_expiry_is_refused(
    broker: BrokerProcess, data_dir: Path, figure: Callable[[str], None]
) -> None:
    lease = 2.0
    with Publisher(data=data_dir) as pub:
        stored = pub.publish("slow", {"job": 1})
    with Consumer("slow", group="g", data=data_dir, lease=lease) as consumer:
        first = consumer.receive(timeout=30)
        assert first is not None and first.attempt == 1
        # The handler is slower than its lease. The broker judges an ACK by the clock when
        # it arrives, so this sleep alone makes it late, however busy the machine.
        time.sleep(lease * 1.25)
        with pytest.raises(LeaseExpiredError) as refused:
            first.ack()
        second = consumer.receive(timeout=30)
        assert second is not None
        assert (second.offset, second.attempt) == (stored.offset, 2)
        second.ack()
        assert consumer.receive(timeout=1.0) is None
    broker.stop()
    kinds = [e["type"] for e in delivery_events(data_dir, "slow", stored.offset)]
    assert kinds.count("acked") == 1
    assert kinds.count("lease_expired") == 1
    figure(
        f"late ACK refused: {type(refused.value).__name__} ({refused.value}); "
        f"final ACKs: {kinds.count('acked')}"
    )


def test_poison_message_goes_to_the_dlq_and_the_topic_keeps_flowing(
    broker: BrokerProcess, data_dir: Path, figure: Callable[[str], None]
) -> None:
    max_deliveries = 4
    with Publisher(data=data_dir) as pub:
        for i in range(100):
            pub.publish_async("jobs", {"i": i})
        poison = pub.publish("jobs", {"poison": True})
        for i in range(100, 300):
            pub.publish_async("jobs", {"i": i})
    handled: list[Any] = []
    poison_attempts: list[int] = []

    def handle(message: ReceivedMessage) -> None:
        if message.value.get("poison"):
            poison_attempts.append(message.attempt)
            handled.append("poison")
            raise ValueError(f"cannot process, attempt {message.attempt}")
        handled.append(message.value["i"])

    with Consumer(
        "jobs",
        group="workers",
        data=data_dir,
        prefetch=10,
        max_deliveries=max_deliveries,
        retry_backoff=0.05,
    ) as consumer:
        # Every message once, and the poison message each time it is allowed; a generous
        # idle bound, since an idle stop would end the test early on a slow machine.
        consumer.run(handle, max_messages=300 + max_deliveries, idle_timeout=60)
    assert pid_alive(broker.pid)
    broker.stop()
    assert poison_attempts == list(range(1, max_deliveries + 1))
    assert sorted(h for h in handled if h != "poison") == list(range(300))
    first, last = handled.index("poison"), len(handled) - handled[::-1].index("poison")
    flowed = sum(1 for h in handled[first:last] if h != "poison")
    with Store(data_dir) as store:
        dead = list(store.reader("jobs.dlq", 0))
    assert len(dead) == 1
    headers = dict(dead[0].headers)
    assert dead[0].value == {"poison": True}
    assert headers["x-dlq-attempts"] == str(max_deliveries)
    assert headers["x-dlq-reason"] == f"ValueError: cannot process, attempt {max_deliveries}"
    assert headers["x-dlq-offset"] == str(poison.offset)
    figure(
        f"poison dead-lettered after {len(poison_attempts)} attempts (max_deliveries "
        f"{max_deliveries}), reason {headers['x-dlq-reason']!r}; 300 of 300 others handled, "
        f"{flowed} of them between its first and last attempt"
    )
    assert flowed > 0


def test_a_consumer_that_stops_reading_holds_up_no_one_else(
    broker: BrokerProcess, data_dir: Path, figure: Callable[[str], None]
) -> None:
    """A consumer busy with a long task leaves a pushed batch (far more than a socket
    buffer holds) unread. The broker must go on serving every other consumer, and the
    busy one still gets the whole batch once it reads."""
    value = "x" * 20_000
    with Publisher(data=data_dir) as pub:
        for _ in range(200):
            pub.publish_async("bulk", value)
        pub.flush()
        for i in range(3):
            pub.publish("small", i)
    with Consumer("bulk", group="busy", data=data_dir, prefetch=200) as busy:
        # The broker pushes about 4 MB that `busy` does not read yet.
        wait_until(
            lambda: broker.stats()["consumer"].get("in_flight") == 200,
            60,
            "200 deliveries pushed to the busy consumer",
        )
        started = time.monotonic()
        with Consumer("small", group="others", data=data_dir) as other:
            got = []
            for _ in range(3):
                message = other.receive(timeout=20)
                assert message is not None
                got.append(message.value)
                message.ack()
        served = time.monotonic() - started
        assert got == [0, 1, 2]
        for _ in range(200):
            message = busy.receive(timeout=20)
            assert message is not None and message.value == value
            message.ack()
    assert pid_alive(broker.pid)
    figure(
        f"a consumer leaving 200 x 20 KB pushed messages unread: another group's consumer "
        f"subscribed and got its 3 messages in {served:.2f} s; the busy one then read 200 of 200"
    )
