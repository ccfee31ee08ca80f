"""Message priorities in a group's delivery state: a due message of a higher priority goes
before every due message of a lower one the group has read, in a key's order, on retries
too, across partitions. Pure state, a fake clock, no processes."""

from __future__ import annotations

from typing import Any

import orjson

from spoolmq.broker.delivery import Group, GroupSettings, PartitionState, delivery_tag


def stored(offset: int, key: str | None = None, priority: int | str = 0) -> bytes:
    headers = [["x-spoolmq-priority", str(priority)]] if priority else []
    record = {"offset": offset, "timestamp": 1_000, "key": key, "value": offset}
    return orjson.dumps({**record, "headers": headers}) + b"\n"


def read(group: Group, state: PartitionState, specs: list[tuple[str | None, int | str]]) -> None:
    """Records read from the log at the partition's next offset: (key, priority) each."""
    for key, priority in specs:
        line = stored(state.next_fetch, key, priority)
        group.add_record(state, orjson.loads(line), line, now=0)


def sent(group: Group, now: int = 0) -> dict[str, list[tuple[str, int, int]]]:
    """(topic, partition, offset) and the tag of each message dispatched, per consumer."""
    return {
        consumer: [
            (state.topic, state.partition, offset, delivery_tag(state.slot, offset, attempt))
            for state, first, count, attempt in batch.runs
            for offset in range(first, first + count)
        ]
        for consumer, batch in group.dispatch(now).items()
    }


def offsets(out: dict[str, list[Any]], consumer: str = "w") -> list[int]:
    return [entry[2] for entry in out.get(consumer, [])]


def ack_all(group: Group, out: dict[str, list[Any]], consumer: str = "w") -> None:
    for entry in out.get(consumer, []):
        group.ack(entry[3], consumer, now=0)


def one_partition(prefetch: int = 10, **settings: Any) -> tuple[Group, PartitionState]:
    group = Group("g", GroupSettings(**settings))
    state = group.add_partition("jobs", 0, 0)
    group.add_consumer("w", prefetch=prefetch, topics=["jobs"])
    return group, state


def test_a_priority_message_passes_a_backlog_of_ten_thousand_except_what_is_in_flight() -> None:
    group, state = one_partition(prefetch=10)
    read(group, state, [(None, 0)] * 10_000)
    first = sent(group)
    assert offsets(first) == list(range(10))  # in flight before the urgent one came
    read(group, state, [(None, 9)])  # offset 10,000
    ack_all(group, first)
    second = sent(group)
    assert offsets(second) == [10_000, *range(10, 19)]


def test_higher_priorities_first_then_oldest_first_within_one() -> None:
    group, state = one_partition(prefetch=6)
    read(group, state, [(None, 0), (None, 5), (None, 9), (None, 0), (None, 5), (None, 1)])
    assert offsets(sent(group)) == [2, 1, 4, 5, 0, 3]


def test_a_priority_message_keeps_its_keys_order() -> None:
    group, state = one_partition(prefetch=3)
    read(group, state, [("k", 0), (None, 0), (None, 0), (None, 0), ("k", 9), (None, 0)])
    first = sent(group)
    assert offsets(first) == [0, 1, 2]  # offset 4 waits behind its key's offset 0
    ack_all(group, {"w": first["w"][1:]})  # 1 and 2 done; 0 (key k) still in flight
    assert offsets(sent(group)) == [3, 5]
    group.ack(first["w"][0][3], "w", now=0)  # key k's first done: 4 is due, and first
    read(group, state, [(None, 0)])
    assert offsets(sent(group)) == [4]


def test_a_retried_priority_message_keeps_its_priority() -> None:
    group, state = one_partition(prefetch=2, retry_backoff_ms=100)
    read(group, state, [(None, 9), *[(None, 0)] * 5])
    first = sent(group)
    assert offsets(first) == [0, 1]
    group.nack(first["w"][0][3], "w", now=0, delay_ms=None, reason="flaky")  # backoff 100 ms
    group.ack(first["w"][1][3], "w", now=0)
    assert offsets(sent(group, now=10)) == [2, 3]  # not due yet: the backlog goes on
    group.run_timers(100)
    # Room comes back: the retry, due now, goes before the rest of the backlog.
    for offset in (2, 3):
        group.ack(delivery_tag(state.slot, offset, 1), "w", now=100)
    assert offsets(sent(group, now=100)) == [0, 4]


def test_released_priority_message_is_first_again() -> None:
    group, state = one_partition(prefetch=2)
    read(group, state, [(None, 3), (None, 0), (None, 0)])
    first = sent(group)
    assert offsets(first) == [0, 1]
    group.release(first["w"][0][3], "w", now=0)
    group.ack(first["w"][1][3], "w", now=0)
    assert offsets(sent(group)) == [0, 2]


def test_the_highest_priority_across_partitions_and_only_of_the_topics_read() -> None:
    group = Group("g", GroupSettings())
    low = group.add_partition("jobs", 0, 0)
    high = group.add_partition("jobs", 1, 0)
    other = group.add_partition("other", 0, 0)
    group.add_consumer("w", prefetch=3, topics=["jobs"])
    read(group, low, [(None, 0), (None, 3), (None, 0)])
    read(group, high, [(None, 0), (None, 8)])
    read(group, other, [(None, 9)])
    out = sent(group)
    assert [entry[:3] for entry in out["w"]] == [("jobs", 1, 1), ("jobs", 0, 1), ("jobs", 0, 0)]
    group.add_consumer("o", prefetch=1, topics=["other"])
    assert offsets(sent(group), "o") == [0]


def test_priority_in_a_fresh_notice_which_only_says_there_are_headers() -> None:
    """The PublisherBroker's notice says only that a record has headers: the line is read."""
    group, state = one_partition(prefetch=2)
    lines = [stored(0), stored(1), stored(2, priority=7)]
    group.add_batch(state, lines, None, {2: (None, None, None, True)}, now=0)
    assert offsets(sent(group)) == [2, 0]


def test_a_delayed_priority_message_waits_for_its_time_then_goes_first() -> None:
    group, state = one_partition(prefetch=1)
    line = orjson.dumps(
        {
            "offset": 0,
            "timestamp": 0,
            "key": None,
            "value": 0,
            "headers": [["x-spoolmq-priority", "9"]],
            "deliver_at": 500,
        }
    )
    group.add_record(state, orjson.loads(line), line, now=0)
    read(group, state, [(None, 0), (None, 0)])
    first = sent(group)
    assert offsets(first) == [1]
    ack_all(group, first)
    group.run_timers(500)
    assert offsets(sent(group, now=500)) == [0]


def test_a_priority_value_that_is_not_one_digit_counts_as_zero() -> None:
    """As a Kafka producer may send: the native clients refuse it before it is stored."""
    group, state = one_partition(prefetch=3)
    read(group, state, [(None, 0), (None, "high"), (None, 2)])
    assert offsets(sent(group)) == [2, 0, 1]


def test_deleting_the_topic_forgets_its_priority_messages() -> None:
    group, state = one_partition(prefetch=1)
    read(group, state, [(None, 9), (None, 9)])
    group.drop_topic("jobs")
    assert not group.wants_more()
    assert sent(group) == {}
