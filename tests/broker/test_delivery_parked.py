"""Parked messages in a group's delivery state: a keyless message due later than
``PARK_AFTER_MS`` leaves the window (a row for state.db, the committed offset passes it), and
comes back through the partition's lane when the broker reads it back, where it is
delivered, ACKed, retried, dead-lettered, expired and cancelled as any other, under its
real offset. Pure state, a fake clock, no processes."""

from __future__ import annotations

from typing import Any

import orjson

from spoolmq.broker.checkpoint import collect_checkpoint, mark_saved
from spoolmq.broker.delivery import (
    PARK_AFTER_MS,
    Group,
    GroupSettings,
    PartitionState,
    Revived,
    record_extra,
)
from spoolmq.store.state import DeliveryKey, ParkedRow
from spoolmq.types import EventType, TopicPartition

LATER = PARK_AFTER_MS + 1


def fields_of(offset: int, **extra: Any) -> dict[str, Any]:
    return {"offset": offset, "timestamp": 0, "key": None, "headers": [], **extra}


def line_of(fields: dict[str, Any]) -> bytes:
    return orjson.dumps({**fields, "value": fields["offset"]}) + b"\n"


def read(group: Group, state: PartitionState, count: int = 1, **extra: Any) -> None:
    """``count`` records read at the next offsets, each with these extra fields."""
    for _ in range(count):
        fields = fields_of(state.next_fetch, **extra)
        group.add_record(state, fields, line_of(fields), now=0)


def parked_back(
    offset: int, due_at: int, attempt: int = 0, reason: str | None = None, **extra: Any
) -> Revived:
    """What the broker hands the group for a parked row once it has read its record."""
    fields = fields_of(offset, deliver_at=due_at, **extra)
    return (offset, due_at, attempt, reason, line_of(fields), record_extra(fields))


def take(group: Group, now: int, consumer: str = "w") -> list[tuple[int, int]]:
    """(real offset, tag) of what one dispatch sends ``consumer``: the offsets as the
    deliver frame names them (each record's own), read from the lines."""
    batch = group.dispatch(now).get(consumer)
    if batch is None:
        return []
    offsets = [orjson.loads(line)["offset"] for line in batch.lines]
    return list(zip(offsets, batch.tags(), strict=True))


def one_partition(**settings: Any) -> tuple[Group, PartitionState]:
    group = Group("g", GroupSettings(**settings))
    state = group.add_partition("jobs", 0, 0)
    group.add_consumer("w", prefetch=100, topics=["jobs"])
    return group, state


def events(group: Group, kind: str) -> list[int]:
    """Offsets of the group's events of ``kind`` (run events expanded)."""
    found: list[int] = []
    for event in group.events:
        if event.type != kind:
            continue
        runs = getattr(event, "runs", None)
        if runs is None:
            found.append(event.offset)  # type: ignore[union-attr]
        else:
            found += [first + i for _, first, count, _ in runs for i in range(count)]
    return found


def test_a_keyless_message_due_past_the_horizon_leaves_the_window() -> None:
    group, state = one_partition()
    read(group, state, deliver_at=LATER)  # 0: parked
    read(group, state, deliver_at=PARK_AFTER_MS)  # 1: due soon enough to stay
    fields = {**fields_of(2), "key": "k", "deliver_at": LATER}
    group.add_record(state, fields, line_of(fields), now=0)  # 2: keyed: stays (its order)
    read(group, state)  # 3: due now
    assert group.parking == {("jobs", 0, 0): (LATER, 0, None)}
    assert state.open_count == 3  # 1, 2 and 3 are held; 0 is not
    assert [offset for offset, _ in take(group, 0)] == [3]
    assert state.committed() == 1  # past the parked one
    checkpoint = collect_checkpoint([group], now=0)
    assert checkpoint.parked == [ParkedRow("g", "jobs", 0, 0, LATER, 0, None)]
    assert checkpoint.committed == {"g": {TopicPartition("jobs", 0): 1}}
    mark_saved(checkpoint, {"g": group})
    assert group.parking == {}


def test_a_revived_message_is_delivered_at_its_time_under_its_real_offset() -> None:
    group, state = one_partition()
    read(group, state, 10)  # 0..9, due now
    assert len(take(group, 0)) == 10
    group.revive(state, [parked_back(900, 5_000), parked_back(400, 4_000)], now=3_000)
    assert take(group, 3_000) == []  # not due yet
    group.run_timers(4_000)
    ((offset, tag),) = take(group, 4_000)
    assert offset == 400
    group.run_timers(5_000)
    ((later, later_tag),) = take(group, 5_000)
    assert later == 900
    assert events(group, EventType.DELIVERED)[-2:] == [400, 900]
    group.ack(tag, "w", now=4_100)
    group.ack(later_tag, "w", now=5_100)
    assert events(group, EventType.ACKED) == [400, 900]
    # Finished: their rows go, and the lane holds nothing.
    assert group.parking == {("jobs", 0, 400): None, ("jobs", 0, 900): None}
    assert state.lane is not None and state.lane.open_count == 0
    checkpoint = collect_checkpoint([group], now=5_100)
    assert sorted(checkpoint.unparked) == [
        DeliveryKey("g", "jobs", 0, 400),
        DeliveryKey("g", "jobs", 0, 900),
    ]


def test_revived_messages_are_acked_as_a_run_of_tags() -> None:
    group, state = one_partition()
    group.revive(state, [parked_back(offset, 0) for offset in (7, 3, 90)], now=0)
    sent = take(group, 0)
    assert [offset for offset, _ in sent] == [7, 3, 90]
    tags = [tag for _, tag in sent]
    assert tags == list(range(tags[0], tags[0] + 3))  # consecutive, though the offsets are not
    assert group.ack_runs([(tags[0], 3)], "w", now=10) == []
    assert events(group, EventType.ACKED) == [7, 3, 90]


def test_a_long_backoff_parks_a_message_again_with_its_attempts() -> None:
    group, state = one_partition(retry_backoff_ms=LATER, max_deliveries=5)
    read(group, state)
    ((_, tag),) = take(group, 0)
    state.saved[0] = (1, 0)  # an earlier checkpoint wrote its delivery row
    group.nack(tag, "w", now=100, delay_ms=None, reason="busy")
    assert group.parking == {("jobs", 0, 0): (100 + LATER, 1, "busy")}
    checkpoint = collect_checkpoint([group], now=100)
    assert checkpoint.finished == [DeliveryKey("g", "jobs", 0, 0)]  # its delivery row goes
    assert checkpoint.committed == {"g": {TopicPartition("jobs", 0): 1}}
    mark_saved(checkpoint, {"g": group})
    # Read back when due, with its attempt: the next failure is its second.
    group.revive(state, [parked_back(0, 100 + LATER, 1, "busy")], now=100 + LATER)
    ((offset, tag),) = take(group, 100 + LATER)
    assert offset == 0
    group.nack(tag, "w", now=200 + LATER, delay_ms=None, reason="still busy")
    assert group.parking == {("jobs", 0, 0): (200 + 3 * LATER, 2, "still busy")}


def test_a_short_retry_stays_in_the_lane_and_its_row_counts_the_attempt() -> None:
    group, state = one_partition()
    group.revive(state, [parked_back(42, 0)], now=0)
    ((_, tag),) = take(group, 0)
    group.nack(tag, "w", now=10, delay_ms=1_000, reason="flaky")
    assert group.parking == {("jobs", 0, 42): (1_010, 1, "flaky")}
    assert take(group, 500) == []
    group.run_timers(1_010)
    ((offset, tag),) = take(group, 1_010)
    assert offset == 42
    group.ack(tag, "w", now=1_020)
    assert group.parking == {("jobs", 0, 42): None}


def test_a_revived_message_out_of_attempts_is_dead_lettered_under_its_offset() -> None:
    group, state = one_partition(max_deliveries=1)
    group.revive(state, [parked_back(77, 0)], now=0)
    ((_, tag),) = take(group, 0)
    group.nack(tag, "w", now=10, delay_ms=0, reason="bad")
    (pending,) = group.dead
    assert (pending.offset, pending.attempt, pending.last_reason) == (77, 1, "bad")
    assert orjson.loads(pending.line)["offset"] == 77
    group.dead.clear()
    group.dead_lettered(pending, now=20)
    assert events(group, EventType.DEAD_LETTERED) == [77]
    assert group.parking == {("jobs", 0, 77): None}


def test_an_expired_lease_and_a_lost_consumer_give_a_revived_message_back() -> None:
    group, state = one_partition(lease_ms=1_000)
    group.add_consumer("v", prefetch=100, topics=["jobs"])
    group.revive(state, [parked_back(5, 0), parked_back(6, 0)], now=0)
    assert len(group.dispatch(0)) == 1
    group.run_timers(1_000)  # the lease ran out
    assert sorted(events(group, EventType.LEASE_EXPIRED)) == [5, 6]
    ((holder, batch),) = group.dispatch(1_000).items()
    assert [orjson.loads(line)["offset"] for line in batch.lines] == [5, 6]
    group.remove_consumer(holder, now=1_100)
    assert sorted(events(group, EventType.RELEASED)) == [5, 6]
    ((other, batch),) = group.dispatch(1_100).items()
    assert other != holder
    assert [orjson.loads(line)["offset"] for line in batch.lines] == [5, 6]


def test_a_revived_message_past_its_ttl_expires() -> None:
    group, state = one_partition()
    group.revive(state, [parked_back(3, 1_000, expires_at=1_500)], now=0)
    group.run_timers(2_000)
    assert take(group, 2_000) == []
    assert events(group, EventType.EXPIRED) == [3]
    assert group.parking == {("jobs", 0, 3): None}


def test_a_revived_priority_message_goes_first() -> None:
    group, state = one_partition()
    group.consumers["w"].prefetch = 3
    read(group, state, 5)
    priority = [["x-spoolmq-priority", "9"]]
    group.revive(state, [parked_back(1_000, 0, headers=priority)], now=0)
    assert [offset for offset, _ in take(group, 0)] == [1_000, 0, 1]


def test_cancelling_a_parked_or_revived_message() -> None:
    group, state = one_partition()
    read(group, state, deliver_at=LATER)
    # Parked, its row not saved yet: it is stopped when it is read back.
    assert group.cancel(state, 0, now=0, reason=None) == "pending"
    group.revive(state, [parked_back(50, LATER)], now=0)
    assert group.cancel(state, 50, now=1, reason="not needed") == "cancelled"
    assert [(e.offset, e.reason) for e in group.events if e.type == "cancelled"] == [
        (50, "not needed")
    ]
    group.run_timers(LATER)
    assert take(group, LATER) == []
    assert group.parking[("jobs", 0, 50)] is None
    # Finished, its row not deleted yet: too late to cancel.
    assert group.cancel(state, 50, now=LATER, reason=None) == "finished"
    # One cancelled in the registry before it comes back is passed over as it does.
    group.cancelled = {TopicPartition("jobs", 0): {60: "old"}}
    group.revive(state, [parked_back(60, 0)], now=LATER)
    assert take(group, LATER) == []
    assert [e.offset for e in group.events if e.type == "cancelled"] == [50, 60]
    assert group.parking[("jobs", 0, 60)] is None


def test_reading_back_twice_or_after_it_finished_is_passed_over() -> None:
    group, state = one_partition()
    group.revive(state, [parked_back(8, 0)], now=0)
    group.revive(state, [parked_back(8, 0)], now=0)  # the lane holds it already
    ((_, tag),) = take(group, 0)
    group.ack(tag, "w", now=1)
    group.revive(state, [parked_back(8, 0)], now=2)  # finished; its row not deleted yet
    assert take(group, 2) == []
    assert events(group, EventType.DELIVERED) == [8]


def test_records_parked_by_an_earlier_broker_are_passed_over_when_read_again() -> None:
    group, state = one_partition()
    lines, offsets = [], range(4)
    for offset in offsets:
        lines.append(line_of(fields_of(offset)))
    group.add_batch(state, lines, None, None, now=0, parked={1, 2})
    assert [offset for offset, _ in take(group, 0)] == [0, 3]
    assert group.events == [group.events[0]]  # the delivery only: nothing about 1 and 2
    assert group.parking == {}


def test_dropping_a_topic_empties_its_lane() -> None:
    group, state = one_partition()
    group.revive(state, [parked_back(8, 0), parked_back(9, 10_000)], now=0)
    ((_, tag),) = take(group, 0)
    read(group, state, deliver_at=LATER)
    group.drop_topic("jobs")
    assert group.consumers["w"].held == 0
    assert group.parking == {}
    group.run_timers(10_000)
    assert group.dispatch(10_000) == {}
    group.ack(tag, "w", now=10_001)  # an answer for it is accepted and does nothing


def test_in_flight_figures_count_the_lane_with_its_partition() -> None:
    group, state = one_partition()
    read(group, state, 2)
    group.revive(state, [parked_back(100, 0)], now=0)
    assert len(take(group, 0)) == 3
    assert group.in_flight_by_partition() == {TopicPartition("jobs", 0): 3}
    assert group.consumers_by_partition() == {TopicPartition("jobs", 0): {"w"}}
    assert len(group.in_flight_tags("w")) == 3


def test_a_stale_row_of_a_message_parked_again_is_passed_over() -> None:
    """Failed in the lane with a long backoff, the message is parked again; until a
    checkpoint saves that, state.db still has its old row, due now: not taken back."""
    group, state = one_partition(retry_backoff_ms=LATER)
    group.revive(state, [parked_back(8, 0)], now=0)
    ((_, tag),) = take(group, 0)
    group.nack(tag, "w", now=10, delay_ms=None, reason="busy")
    assert group.parking == {("jobs", 0, 8): (10 + LATER, 1, "busy")}
    group.revive(state, [parked_back(8, 0)], now=20)  # the old row
    assert take(group, 20) == []
    group.revive(state, [parked_back(8, 10 + LATER, 1, "busy")], now=10 + LATER)
    assert take(group, 10 + LATER) == []  # still not saved: the change is what counts
    group.parking.clear()  # saved
    group.revive(state, [parked_back(8, 10 + LATER, 1, "busy")], now=10 + LATER)
    assert [offset for offset, _ in take(group, 10 + LATER)] == [8]
