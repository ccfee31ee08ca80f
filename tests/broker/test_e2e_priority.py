"""Message priorities from real clients of a real broker: ``priority=`` on every way to
publish, a priority message passing a backlog, and bad priorities refused before anything
is stored."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from spoolmq import Admin, AsyncPublisher, Consumer, Publisher, Store
from spoolmq.errors import InvalidArgumentError
from spoolmq.testing import BrokerProcess, wait_until


def _log_end(data_dir: Path, group: str, topic: str) -> int:
    """The log end of ``topic``'s partition 0 as the ConsumerBroker knows it for ``group``."""
    with Admin(data_dir) as admin:
        rows = admin.describe_groups().get(group, {}).get("partitions", [])
    return next((row["log_end_offset"] for row in rows if row["topic"] == topic), -1)


def test_a_priority_message_passes_a_backlog_of_ten_thousand(
    broker: BrokerProcess, data_dir: Path
) -> None:
    with (
        Consumer("jobs", group="g", data=data_dir, prefetch=5) as consumer,
        Publisher(data=data_dir) as publisher,
    ):
        publisher.publish("jobs", "first", partition=0)
        held = [consumer.receive(timeout=60)]  # the group is reading: it takes in what comes
        futures = [publisher.publish_async("jobs", i, partition=0) for i in range(10_000)]
        publisher.flush()
        assert all(f.result().partition == 0 for f in futures)
        urgent = publisher.publish("jobs", "urgent", partition=0, priority=9)
        wait_until(lambda: _log_end(data_dir, "g", "jobs") == 10_002, 60, "the broker to know")
        # Prefetched before the urgent one was published: four more of the backlog.
        while len(held) < 5:
            held.append(consumer.receive(timeout=60))
        assert [m.value for m in held if m is not None] == ["first", 0, 1, 2, 3]
        for message in held:
            assert message is not None
            message.ack()
        after = consumer.receive(timeout=60)
        assert after is not None and after.value == "urgent"
        assert after.offset == urgent.offset and after.priority == 9
        after.ack()
        following = consumer.receive(timeout=60)
        assert following is not None and following.value == 4 and following.priority == 0


def test_priority_from_the_async_publisher_and_the_store(
    broker: BrokerProcess, data_dir: Path
) -> None:
    async def publish() -> None:
        async with AsyncPublisher(data=data_dir) as publisher:
            await publisher.publish("mixed", "async", priority=3, headers={"trace": "t1"})

    asyncio.run(publish())
    with Consumer("mixed", group="g", data=data_dir) as consumer:
        message = consumer.receive(timeout=60)
        assert message is not None and message.priority == 3
        assert dict(message.headers) == {"trace": "t1", "x-spoolmq-priority": "3"}
        message.ack()


def test_priority_with_the_store_offline(data_dir: Path) -> None:
    with Store(data_dir) as store:
        store.append("offline", "x", priority=7, partition=0)
        store.append("offline", "y", priority=0, partition=0)  # the default: no header at all
        (first, second) = list(store.reader("offline", 0))
    assert first.headers == [("x-spoolmq-priority", "7")] and second.headers == []


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"priority": 10}, "priority must be a whole number 0-9, not 10"),
        ({"priority": True}, "priority must be a whole number 0-9, not True"),
        ({"priority": "9"}, "priority must be a whole number 0-9, not '9'"),
        ({"headers": {"x-spoolmq-priority": "high"}}, "must be one digit 0-9 as text"),
        ({"headers": {"x-spoolmq-priority": b"9"}}, "must be one digit 0-9 as text"),
        ({"priority": 2, "headers": {"x-spoolmq-priority": "2"}}, "not both"),
    ],
)
def test_a_bad_priority_is_refused_before_anything_is_stored(
    broker: BrokerProcess, data_dir: Path, options: dict[str, object], says: str
) -> None:
    with Publisher(data=data_dir) as publisher:
        publisher.publish("strict", "kept", partition=0)
        with pytest.raises(InvalidArgumentError, match=says):
            publisher.publish("strict", "refused", **options)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match=says):
            publisher.publish_async("strict", "refused", **options).result()  # type: ignore[arg-type]
        publisher.publish("strict", "kept too", partition=0)
    with Store(data_dir) as store:
        assert [r.value for r in store.reader("strict", 0)] == ["kept", "kept too"]
