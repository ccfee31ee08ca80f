"""The embedded API as the README shows it."""

from __future__ import annotations

from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import example, given, settings

from spoolmq import Message, Store
from spoolmq.errors import SpoolError


def test_round_robin_then_key_then_read(store: Store) -> None:
    store.create_topic("orders", partitions=2)
    partitions = [store.append("orders", {"order_id": i}).partition for i in range(4)]
    assert partitions == [0, 1, 0, 1]
    keyed = {store.append("orders", {"n": i}, key="customer-7").partition for i in range(5)}
    assert len(keyed) == 1
    reader = store.reader("orders", partition=0)
    first = reader.poll()
    assert first is not None
    assert (first.offset, first.value) == (0, {"order_id": 0})


def test_read_entries_stops_below_the_end_it_is_given(store: Store) -> None:
    """The ConsumerBroker reads only what a notice said is durable: records the reader
    has already read past ``end`` wait for a later call, in order."""
    store.append_batch("jobs", [Message(value=n) for n in range(3)])
    store.append_batch("jobs", [Message(value=n) for n in range(3, 5)])
    with store.reader("jobs", 0) as reader:
        first = reader.read_entries(100, end=3)
        assert [fields["value"] for fields, _ in first] == [0, 1, 2]
        assert reader.read_entries(100, end=3) == []
        rest = reader.read_entries(100, end=5)
        assert [fields["value"] for fields, _ in rest] == [3, 4]


def test_unread_entries_come_back_without_a_second_read(
    store: Store, verified_lines: list[bytes]
) -> None:
    """Entries given back with ``unread`` are the next ones read, in order, and the
    reader does not read or verify any line a second time (no seek)."""
    store.append_batch("jobs", [Message(value=n) for n in range(10)])
    store.append_batch("jobs", [Message(value=n) for n in range(10, 15)])
    with store.reader("jobs", 0) as reader:
        first = reader.read_entries(8)
        reader.unread(first[5:])
        assert reader.position == 5
        again = reader.read_entries(100)
        assert [fields["value"] for fields, _ in again] == list(range(5, 15))
        assert reader.position == 15
        reader.unread([])
        assert reader.position == 15
        with pytest.raises(ValueError, match="newest entries"):
            reader.unread(again[:3])  # not the newest: refused, nothing changed
        assert reader.position == 15
    assert len(verified_lines) == 15


@example(values=[0] * 6 + [1] + [0] * 4, calls=[(3, 10)])  # a call ends at a segment's end
@given(
    values=st.lists(st.integers(0, 3), min_size=1, max_size=60),
    calls=st.lists(st.tuples(st.integers(-2, 25), st.integers(0, 70)), min_size=1, max_size=12),
)
@settings(max_examples=40, deadline=None)
def test_read_entries_takes_what_is_below_the_end_up_to_the_count(
    tmp_path_factory: pytest.TempPathFactory,
    values: list[int],
    calls: list[tuple[int, int]],
) -> None:
    """Whatever the counts and ends asked for, each call returns, in order, the first of
    the offsets at or past the position and below ``end``, at most ``max_records`` (none
    for a count below one), and moves the position past the last one it returns.

    In one segment, a call returns all of those up to ``max_records``. On a compacted log
    with gaps over several segments, a call reads one segment at most: it returns a prefix
    of them, at least one when there is one."""
    store = Store(tmp_path_factory.mktemp("data"))
    try:
        store.create_topic("plain")
        store.create_topic("jobs", cleanup_policy="compact", segment_bytes=1024)
        for topic in ("plain", "jobs"):
            for start in range(0, len(values), 7):  # batches of up to 7, keyed by value
                batch = [Message(value=v, key=f"k{v}") for v in values[start : start + 7]]
                store.append_batch(topic, batch)
        store.compact("jobs")
        for topic in ("plain", "jobs"):
            with store.reader(topic, 0) as everything:
                left = [record.offset for record in everything]  # what compaction kept
            assert topic == "jobs" or left == list(range(len(values)))
            with store.reader(topic, 0) as reader:
                position = 0
                for max_records, end in calls:
                    below = [o for o in left if position <= o < end][: max(max_records, 0)]
                    entries = reader.read_entries(max_records, end=end)
                    taken = [fields["offset"] for fields, _ in entries]
                    if topic == "plain":
                        assert taken == below
                    else:
                        assert taken == below[: len(taken)]
                        assert bool(taken) == bool(below)
                    if taken:
                        position = taken[-1] + 1
                    assert reader.position == position
    finally:
        store.close()


def test_a_closed_store_refuses_to_be_used(tmp_path: Path) -> None:
    """After close() an append succeeded and reopened the files one by one (until a second
    close); the clients say "closed", and now the store does too."""
    store = Store(tmp_path / "queue_data")
    store.append("events", 1)
    store.close()
    for use in (
        lambda: store.append("events", 2),
        lambda: store.append_batch("events", [Message(value=3)]),
        lambda: store.reader("events", 0),
        lambda: store.topics(),
        lambda: store.create_topic("other"),
        lambda: store.log_end_offset("events", 0),
        lambda: store.check(),
    ):
        with pytest.raises(SpoolError, match="this Store is closed"):
            use()
    store.close()  # twice is fine
    with Store(tmp_path / "queue_data") as again:  # nothing was added after the close
        assert [record.value for record in again.reader("events", 0)] == [1]
