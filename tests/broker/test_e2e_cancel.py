"""Cancelling a stored message through a real broker (``Admin.cancel_message``): no group
delivers it, each records a ``cancelled`` event, a held message is not delivered again once
it comes back, a group that starts later passes over it, and the cancel holds across a
broker restart."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from event_shapes import events_of
from spoolmq import Admin, Consumer, Publisher
from spoolmq.errors import InvalidArgumentError, UnknownPartitionError, UnknownTopicError
from spoolmq.testing import BrokerProcess, wait_until


def _cancelled(data_dir: Path, group: str) -> dict[int, str]:
    return {
        e["offset"]: e["reason"] for e in events_of(data_dir, "cancelled") if e["group"] == group
    }


def test_a_cancelled_message_is_never_delivered_and_is_recorded(
    broker: BrokerProcess, data_dir: Path
) -> None:
    due = time.time_ns() // 1_000_000 + 3_000
    with Publisher(data=data_dir) as publisher:
        doomed = publisher.publish("jobs", "doomed", partition=0, deliver_at=due)
        kept = publisher.publish("jobs", "kept", partition=0, deliver_at=due)
        held = publisher.publish("jobs", "held", partition=0)
    with Consumer("jobs", group="g", data=data_dir, prefetch=5) as consumer:
        first = consumer.receive(timeout=60)
        assert first is not None and first.offset == held.offset
        with Admin(data_dir) as admin:
            assert admin.cancel_message("jobs", 0, doomed.offset, reason="not needed") == {
                "g": "cancelled"
            }
            # The one the consumer holds stays with it; given back, it does not come again.
            assert admin.cancel_message("jobs", 0, held.offset) == {"g": "in_flight"}
        first.nack(delay=0)
        second = consumer.receive(timeout=60)
        assert second is not None and second.offset == kept.offset
        second.ack()
        # Both were due at the same millisecond: the cancelled one would have come with it.
        assert consumer.receive(timeout=1.0) is None
    assert wait_until(lambda: len(_cancelled(data_dir, "g")) == 2, 30, "the events")
    assert _cancelled(data_dir, "g") == {doomed.offset: "not needed", held.offset: "cancelled"}
    # A group that starts afterwards passes over both.
    with Consumer("jobs", group="late", data=data_dir, prefetch=5) as late:
        values = []
        while (message := late.receive(timeout=60 if not values else 1.0)) is not None:
            values.append(message.value)
            message.ack()
    assert values == ["kept"]


def test_a_cancel_holds_across_a_broker_restart(broker: BrokerProcess, data_dir: Path) -> None:
    with Publisher(data=data_dir) as publisher:
        doomed = publisher.publish("later", "doomed", partition=0)
        publisher.publish("later", "kept", partition=0)
    with Admin(data_dir) as admin:
        assert admin.cancel_message("later", 0, doomed.offset) == {}  # no group yet
    broker.stop()
    broker.start()
    with Consumer("later", group="g", data=data_dir) as consumer:
        message = consumer.receive(timeout=60)
        assert message is not None and message.value == "kept"
        message.ack()
        assert consumer.receive(timeout=1.0) is None
    assert wait_until(lambda: _cancelled(data_dir, "g"), 30, "the event") == {
        doomed.offset: "cancelled"
    }


def test_what_cannot_be_cancelled_is_refused(broker: BrokerProcess, data_dir: Path) -> None:
    with Publisher(data=data_dir) as publisher:
        publisher.publish("one", "x", partition=0)
    with Admin(data_dir) as admin:
        with pytest.raises(UnknownTopicError):
            admin.cancel_message("nowhere", 0, 0)
        with pytest.raises(UnknownPartitionError):
            admin.cancel_message("one", 7, 0)
        with pytest.raises(InvalidArgumentError, match="no message at offset 1"):
            admin.cancel_message("one", 0, 1)
        with pytest.raises(InvalidArgumentError, match="whole"):
            admin.cancel_message("one", 0, -1)


def test_the_answer_names_the_groups_that_read_the_topic_only(
    broker: BrokerProcess, data_dir: Path
) -> None:
    """A group that reads other topics is not in the answer (it was said to be ``pending``);
    one that read the topic and has no consumer now is (it was left out), from its
    committed offset."""
    with Publisher(data=data_dir) as publisher:
        first = publisher.publish("work", "a", partition=0)
        publisher.publish("work", "b", partition=0)
        last = publisher.publish("work", "c", partition=0)
        publisher.publish("elsewhere", "x", partition=0)
    with Consumer("work", group="done", data=data_dir) as consumer:
        message = consumer.receive(timeout=60)
        assert message is not None and message.offset == first.offset
        message.ack()
    broker.stop()  # "done" is now only its committed offset in state.db
    broker.start()
    with Consumer("elsewhere", group="other", data=data_dir) as other:
        message = other.receive(timeout=60)
        assert message is not None
        message.ack()
        with Admin(data_dir) as admin:
            assert admin.cancel_message("work", 0, first.offset) == {"done": "finished"}
            assert admin.cancel_message("work", 0, last.offset) == {"done": "pending"}
            assert admin.cancel_message("elsewhere", 0, 0) == {"other": "finished"}
