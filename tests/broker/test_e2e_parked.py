"""Delayed messages held outside the group's window (parked in state.db) with a real
broker and real clients: the group's committed offset passes them at once, they are
delivered at their time and never before, exactly once, also across a broker restart, and
also when the restart reads the parked records again (a message held by a consumer kept
the committed offset below them)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from event_shapes import events_of
from spoolmq import Admin, Consumer, Publisher
from spoolmq.broker.delivery import PARK_AFTER_MS
from spoolmq.store.state import StateDB
from spoolmq.testing import BrokerProcess, wait_until
from spoolmq.types import TopicPartition

TOPIC = "later"
# Far enough past the horizon that a busy machine still reads them with time to spare.
SOON_MS = 3 * PARK_AFTER_MS


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def group_figures(data_dir: Path, group: str) -> tuple[int, int]:
    """(committed offset of partition 0, messages parked) as state.db has them."""
    state = StateDB(data_dir / "state.db")
    try:
        committed = state.committed_offsets(group, TOPIC).get(TopicPartition(TOPIC, 0), -1)
        return committed, state.parked_counts().get(group, 0)
    finally:
        state.close()


def publish_delayed(publisher: Publisher, count: int, spread_ms: int, seed: int) -> list[int]:
    """``count`` keyless messages ``[number, due]`` due over ``spread_ms`` from
    ``SOON_MS`` on, published in random order to partition 0; their due times by number."""
    rng = random.Random(seed)
    start = now_ms() + SOON_MS
    dues = [start + rng.randrange(spread_ms) for _ in range(count)]
    order = list(range(count))
    rng.shuffle(order)
    futures = [
        publisher.publish_async(TOPIC, [n, dues[n]], partition=0, deliver_at=dues[n]) for n in order
    ]
    publisher.flush()
    assert all(f.result().partition == 0 for f in futures)
    return dues


def drain(consumer: Consumer, received: list[tuple[Any, int]], done: Any, what: str) -> None:
    """Receive and ACK, recording (value, receive time), until ``done()``."""

    def step() -> bool:
        message = consumer.receive(timeout=0.2)
        if message is not None:
            received.append((message.value, now_ms()))
            message.ack()
        return bool(done())

    wait_until(step, 120, what)


def receive_all(data_dir: Path, count: int, end: int, what: str) -> list[tuple[Any, int]]:
    """A new consumer of group g receives and ACKs until it has ``count`` messages and
    the group has finished all ``end`` of them (committed at the end, none parked)."""
    received: list[tuple[Any, int]] = []
    with Consumer(TOPIC, group="g", data=data_dir, prefetch=100) as consumer:
        drain(
            consumer,
            received,
            lambda: len(received) >= count and group_figures(data_dir, "g") == (end, 0),
            what,
        )
    return received


def check_on_time(received: list[tuple[Any, int]], dues: list[int]) -> None:
    """Each delayed message came once, and not before its time."""
    numbers = [value[0] for value, _ in received if isinstance(value, list)]
    assert sorted(numbers) == list(range(len(dues)))
    early = [(value, at) for value, at in received if isinstance(value, list) and at < value[1]]
    assert early == []


def test_delayed_messages_are_parked_and_delivered_at_their_time(
    broker: BrokerProcess, data_dir: Path
) -> None:
    with (
        Consumer(TOPIC, group="g", data=data_dir, prefetch=100) as consumer,
        Publisher(data=data_dir) as publisher,
    ):
        publisher.publish(TOPIC, "now", partition=0)
        first = consumer.receive(timeout=60)  # the group reads the partition
        assert first is not None and first.value == "now"
        first.ack()
        dues = publish_delayed(publisher, 150, 4_000, seed=1)
        # None of them is held by the group: all parked, its committed offset at the end
        # (nothing is ACKed meanwhile, so this holds until the test ACKs them).
        wait_until(lambda: group_figures(data_dir, "g") == (151, 150), 60, "all parked")
        received: list[tuple[Any, int]] = []
        drain(consumer, received, lambda: len(received) == 150, "the delayed messages")
        check_on_time(received, dues)
        wait_until(lambda: group_figures(data_dir, "g") == (151, 0), 60, "rows deleted")


def test_parked_messages_survive_a_broker_restart(broker: BrokerProcess, data_dir: Path) -> None:
    with (
        Publisher(data=data_dir) as publisher,
        Consumer(TOPIC, group="g", data=data_dir) as consumer,
    ):
        publisher.publish(TOPIC, "now", partition=0)
        first = consumer.receive(timeout=60)
        assert first is not None
        first.ack()
        dues = publish_delayed(publisher, 100, 2_000, seed=2)
        wait_until(lambda: group_figures(data_dir, "g") == (101, 100), 60, "all parked")
    broker.stop()
    broker.start()
    received = receive_all(data_dir, 100, 101, "the delayed messages after the restart")
    check_on_time(received, dues)


def test_a_restart_that_reads_parked_records_again_delivers_them_once(
    broker: BrokerProcess, data_dir: Path
) -> None:
    with (
        Publisher(data=data_dir) as publisher,
        Consumer(TOPIC, group="g", data=data_dir) as consumer,
    ):
        publisher.publish(TOPIC, "held", partition=0)
        held = consumer.receive(timeout=60)  # never ACKed: the committed offset stays 0
        assert held is not None
        dues = publish_delayed(publisher, 50, 1_000, seed=3)
        wait_until(lambda: group_figures(data_dir, "g") == (0, 50), 60, "all parked")
    broker.stop()
    # Restarted once they are all due: the group reads offsets 0-50 again, their delays
    # over; state.db says 1-50 are parked, so only the loader hands them out.
    wait_until(lambda: now_ms() > max(dues), 60, "every message to be due")
    broker.start()
    received = receive_all(data_dir, 51, 51, "everything, once")
    assert [value for value, _ in received].count("held") == 1
    check_on_time(received, dues)
    assert len(received) == 51


def test_a_parked_message_cancelled_is_never_delivered(
    broker: BrokerProcess, data_dir: Path
) -> None:
    with (
        Consumer(TOPIC, group="g", data=data_dir) as consumer,
        Publisher(data=data_dir) as publisher,
        Admin(data_dir) as admin,
    ):
        publisher.publish(TOPIC, "now", partition=0)
        first = consumer.receive(timeout=60)
        assert first is not None
        first.ack()
        due = now_ms() + SOON_MS
        doomed = publisher.publish(TOPIC, "doomed", partition=0, deliver_at=due)
        after = publisher.publish(TOPIC, "after", partition=0, deliver_at=due + 500)
        wait_until(lambda: group_figures(data_dir, "g") == (3, 2), 60, "both parked")
        assert admin.cancel_message(TOPIC, 0, doomed.offset, reason="no") == {"g": "pending"}
        message = consumer.receive(timeout=120)
        assert message is not None and message.offset == after.offset  # not the cancelled one
        message.ack()
        wait_until(lambda: group_figures(data_dir, "g") == (3, 0), 60, "both rows gone")
    cancelled = wait_until(lambda: events_of(data_dir, "cancelled"), 60, "the cancel event")
    assert [(e["offset"], e["reason"]) for e in cancelled] == [(doomed.offset, "no")]
