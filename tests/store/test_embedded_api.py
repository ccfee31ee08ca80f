"""The embedded API as the README shows it."""

from __future__ import annotations

import pytest

from spoolmq import Message, Store


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
