"""Cancelling a stored message in a group's delivery state: finished with a ``cancelled``
event and never delivered, whether it is due, delayed, waiting for a retry or behind its
key (whose order still holds); a message a consumer holds is left alone; one not read yet
is passed over when it is read. Pure state, a fake clock, no processes."""

from __future__ import annotations

from typing import Any

import orjson

from spoolmq.broker.delivery import Group, GroupSettings, PartitionState, delivery_tag
from spoolmq.types import TopicPartition


def read(group: Group, state: PartitionState, specs: list[tuple[str | None, int | None]]) -> None:
    """Records read at the next offsets: (key, deliver_at or None) each."""
    for key, deliver_at in specs:
        fields: dict[str, Any] = {
            "offset": state.next_fetch,
            "timestamp": 0,
            "key": key,
            "headers": [],
        }
        if deliver_at is not None:
            fields["deliver_at"] = deliver_at
        line = orjson.dumps({**fields, "value": None}) + b"\n"
        group.add_record(state, fields, line, now=0)


def take(group: Group, now: int = 0) -> list[tuple[int, int]]:
    """(offset, tag) of each message dispatched to consumer ``w``."""
    batch = group.dispatch(now).get("w")
    if batch is None:
        return []
    return [
        (offset, delivery_tag(state.slot, offset, attempt))
        for state, first, count, attempt in batch.runs
        for offset in range(first, first + count)
    ]


def cancelled(group: Group) -> list[tuple[int, str | None]]:
    return [(e.offset, e.reason) for e in group.events if e.type == "cancelled"]


def one_partition(prefetch: int = 10, **settings: Any) -> tuple[Group, PartitionState]:
    group = Group("g", GroupSettings(**settings))
    state = group.add_partition("jobs", 0, 0)
    group.add_consumer("w", prefetch=prefetch, topics=["jobs"])
    return group, state


def test_a_due_message_is_cancelled_and_never_delivered() -> None:
    group, state = one_partition()
    read(group, state, [(None, None)] * 3)
    assert group.cancel(state, 1, now=5, reason="not needed") == "cancelled"
    assert [offset for offset, _ in take(group)] == [0, 2]
    assert cancelled(group) == [(1, "not needed")]


def test_a_delayed_message_is_cancelled_before_its_time() -> None:
    group, state = one_partition()
    read(group, state, [(None, 1_000), (None, None)])
    assert group.cancel(state, 0, now=10, reason=None) == "cancelled"
    assert [offset for offset, _ in take(group, 10)] == [1]
    group.run_timers(1_000)
    assert take(group, 1_000) == []
    assert cancelled(group) == [(0, "cancelled")]
    assert state.committed() == 1  # the delayed one is final: the offset moves past it


def test_a_message_waiting_for_a_retry_is_cancelled() -> None:
    group, state = one_partition(retry_backoff_ms=500)
    read(group, state, [(None, None)])
    ((_offset, tag),) = take(group)
    group.nack(tag, "w", now=0, delay_ms=None, reason="flaky")
    assert group.cancel(state, 0, now=100, reason="gave up") == "cancelled"
    group.run_timers(500)
    assert take(group, 500) == []
    assert state.committed() == 1


def test_a_held_or_finished_message_is_left_alone() -> None:
    group, state = one_partition()
    read(group, state, [(None, None)] * 2)
    (first, first_tag), (second, _) = take(group)
    group.ack(first_tag, "w", now=1)
    assert group.cancel(state, first, now=2, reason=None) == "finished"
    assert group.cancel(state, second, now=2, reason=None) == "in_flight"
    assert cancelled(group) == []


def test_cancelling_inside_a_key_keeps_the_keys_order() -> None:
    """Offsets 0, 1, 2 of key k: 0 in flight, 1 cancelled (behind 0), 2 still waits for
    0, then comes; a later message of k waits behind 2."""
    group, state = one_partition()
    read(group, state, [("k", None)] * 3)
    ((zero, zero_tag),) = take(group)
    assert zero == 0
    assert group.cancel(state, 1, now=1, reason=None) == "cancelled"
    assert take(group) == []  # 2 still waits for 0
    read(group, state, [("k", None)])  # offset 3
    group.ack(zero_tag, "w", now=2)
    ((two, two_tag),) = take(group)
    assert two == 2 and take(group) == []  # 3 waits for 2
    group.ack(two_tag, "w", now=3)
    assert [offset for offset, _ in take(group)] == [3]


def test_cancelling_the_newest_of_a_key_behind_another() -> None:
    group, state = one_partition()
    read(group, state, [("k", None)] * 2)
    ((_zero, zero_tag),) = take(group)
    assert group.cancel(state, 1, now=1, reason=None) == "cancelled"
    group.ack(zero_tag, "w", now=2)
    read(group, state, [("k", None)])  # offset 2: its key has nothing unfinished
    assert [offset for offset, _ in take(group)] == [2]


def test_cancelling_the_head_of_a_key_makes_its_next_due() -> None:
    group, state = one_partition()
    read(group, state, [("k", 1_000), ("k", None)])
    assert take(group) == []  # 0 is delayed, 1 waits behind it
    assert group.cancel(state, 0, now=5, reason=None) == "cancelled"
    assert [offset for offset, _ in take(group, 5)] == [1]


def test_a_message_not_read_yet_is_passed_over_when_it_is() -> None:
    group, state = one_partition()
    group.cancelled = {TopicPartition("jobs", 0): {1: "by id", 3: None}}
    assert group.cancel(state, 1, now=0, reason="by id") == "pending"
    read(group, state, [("k", None), ("k", None), ("k", 5_000), (None, None)])
    ((zero, zero_tag),) = take(group)  # 1 and 3 passed over; 2 waits behind 0
    assert zero == 0 and take(group) == []
    assert cancelled(group) == [(1, "by id"), (3, "cancelled")]
    group.ack(zero_tag, "w", now=10)  # 2 is next of its key, but delayed
    group.run_timers(5_000)
    assert [offset for offset, _ in take(group, 5_000)] == [2]


def test_a_held_message_cancelled_meanwhile_is_not_delivered_again() -> None:
    """Held when cancelled: its consumer's answer counts as usual, but a NACK, an expired
    lease or a release finishes it as cancelled instead of delivering it again."""
    group, state = one_partition(lease_ms=100)
    read(group, state, [("k", None), (None, None), (None, None), ("k", None)])
    sent = take(group)
    assert [offset for offset, _ in sent] == [0, 1, 2]
    group.cancelled = {TopicPartition("jobs", 0): {0: "stop", 1: None, 2: None}}
    for offset, _ in sent:
        assert group.cancel(state, offset, now=1, reason=None) == "in_flight"
    group.nack(sent[0][1], "w", now=2, delay_ms=0, reason="flaky")
    group.release(sent[1][1], "w", now=2)
    group.run_timers(200)  # 2's lease expires
    assert [offset for offset, _ in take(group, 200)] == [3]  # k's next is due
    assert sorted(cancelled(group)) == [(0, "stop"), (1, "cancelled"), (2, "cancelled")]
    assert state.committed() == 3


def test_a_dead_letter_in_another_partition_at_the_same_offset_does_not_count() -> None:
    group = Group("g", GroupSettings(max_deliveries=1))
    zero = group.add_partition("jobs", 0, 0)
    one = group.add_partition("jobs", 1, 0)
    group.add_consumer("w", prefetch=1, topics=["jobs"])
    read(group, zero, [(None, None)])
    ((_, tag),) = take(group)
    group.nack(tag, "w", now=1, delay_ms=0, reason="bad")  # out of attempts: to the DLQ
    assert group.cancel(zero, 0, now=2, reason=None) == "finished"
    read(group, one, [(None, None)])
    assert group.cancel(one, 0, now=2, reason=None) == "cancelled"
